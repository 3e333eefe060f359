"""The matrices that write into the residual stream, found from the forward (smallinit.init.branches), on
Hugging Face architectures from tiny configs (dense, Conv1D, fused MoE experts, sandwich norms), a
nanochat-style model and smallinit's own (gated attention, RoPE, MoE)."""

from __future__ import annotations

import pytest
import torch

from smallinit.config import ModelConfig
from smallinit.init.branches import residual_writers, trace_stream
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
        # its experts' bias down_proj_bias[e] (1 × d) is added after the product: the bias had taken its place
        ("gpt_oss", "model.layers.{}.self_attn.o_proj.weight", "model.layers.{}.mlp.experts.down_proj"),
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


def test_a_projection_of_the_embedding_added_to_the_position_embedding_is_no_branch():
    """OPT-350m's shape (word_embed_proj_dim < hidden_size): project_in maps the token embedding up and the
    position embedding is added to it. That addition starts the stream; it is no branch writing into it, so
    project_in is no output projection (per-role scales drew it at output=zero or depth, and depth divided every
    output projection by √(2L + 1))."""
    import transformers

    torch.manual_seed(0)
    config = transformers.OPTConfig(
        hidden_size=64, word_embed_proj_dim=32, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.OPTForCausalLM(config)
    layer = "model.decoder.layers.{}"
    expected = [f"{layer.format(i)}.{p}.weight" for i in range(2) for p in ("self_attn.out_proj", "fc2")]
    assert "model.decoder.project_in.weight" in dict(model.named_parameters())
    trace = trace_stream(model)
    assert trace.writers == expected and trace.additions == 4


def test_a_position_embedding_held_as_a_parameter_and_added_is_the_stream():
    """A learned position table kept as an nn.Parameter (1, T, d) and added to the token embedding, as minimal
    GPTs write it: the addition of a 3-axis parameter was read as a product with a matrix, so the stream ended
    there and no output projection was found at all."""
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, d: int):
            super().__init__()
            self.ln, self.fc, self.proj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.proj(F.gelu(self.fc(self.ln(x))))

    class Net(nn.Module):
        def __init__(self, d: int = 32, vocab: int = 64, T: int = 16):
            super().__init__()
            self.wte, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(1, T, d))
            self.h, self.head = nn.ModuleList(Block(d) for _ in range(3)), nn.Linear(d, vocab)

        def forward(self, ids):
            x = self.wte(ids) + self.pos[:, : ids.shape[1]]
            for block in self.h:
                x = block(x)
            return self.head(x)

    trace = trace_stream(Net(), torch.zeros(1, 8, dtype=torch.long))
    assert trace.writers == [f"h.{i}.proj.weight" for i in range(3)] and trace.additions == 3


def test_a_forward_that_cannot_run_is_said():
    got, why = residual_writers(torch.nn.Linear(4, 4))
    assert got == [] and "pass example_inputs" in why
