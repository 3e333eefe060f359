"""The matrices that write into the residual stream, found from the forward (smallinit.init.branches), on
Hugging Face architectures from tiny configs (dense, Conv1D, fused MoE experts, sandwich norms), a
nanochat-style model and smallinit's own (gated attention, RoPE, MoE)."""

from __future__ import annotations

import pytest
import torch

from smallinit.config import ModelConfig
from smallinit.init.branches import residual_writers
from smallinit.model import Transformer
from support.hf_tiny import build
from support.nanochat_style import GPT, Config


@pytest.mark.parametrize(
    "arch, attn, mlp",
    [
        ("llama", "model.layers.{}.self_attn.o_proj.weight", "model.layers.{}.mlp.down_proj.weight"),
        ("gpt2", "transformer.h.{}.attn.c_proj.weight", "transformer.h.{}.mlp.c_proj.weight"),
        ("qwen3_moe", "model.layers.{}.self_attn.o_proj.weight", "model.layers.{}.mlp.experts.down_proj"),
        ("gemma2", "model.layers.{}.self_attn.o_proj.weight", "model.layers.{}.mlp.down_proj.weight"),
    ],
)
def test_output_projections_of_hugging_face_architectures(arch, attn, mlp):
    model = build(arch)
    layers = model.config.num_hidden_layers
    names = {n for n, _ in model.named_parameters()}
    expected = [name.format(i) for i in range(layers) for name in (attn, mlp)]
    assert set(expected) <= names  # the names this test expects exist: it checks the forward, not a typo
    assert residual_writers(model) == (expected, None)


def test_output_projections_of_a_nanochat_style_model_and_smallinit_s_own():
    ids = torch.zeros(1, 8, dtype=torch.long)
    got, _ = residual_writers(GPT(Config(layers=3)), ids)
    assert got == [f"h.{i}.{p}.c_proj.weight" for i in range(3) for p in ("attn", "mlp")]
    for preset, down in (("cpu-1m", "mlp.down_proj.weight"), ("cpu-moe-1m", "mlp.down_proj")):
        cfg = ModelConfig.preset(preset)
        got, _ = residual_writers(Transformer(cfg), ids)
        assert got == [f"blocks.{i}.{p}" for i in range(cfg.n_layers) for p in ("attn.o_proj.weight", down)]


def test_a_forward_that_cannot_run_is_said():
    got, why = residual_writers(torch.nn.Linear(4, 4))
    assert got == [] and "pass example_inputs" in why
