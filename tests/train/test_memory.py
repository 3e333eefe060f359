"""The per-GPU memory estimate: its parts against what a real model allocates and autograd really saves."""

import pytest
import torch

from smallinit import Config, ModelConfig, Transformer
from smallinit.config import from_dict
from smallinit.errors import ConfigError
from smallinit.train.memory import activation_bytes_per_token, describe_memory, estimate_memory

SHAPES = [
    dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, d_ff=256, vocab_size=257, max_seq_len=64),
    dict(
        d_model=128,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        d_ff=384,
        vocab_size=1000,
        max_seq_len=64,
        gate="headwise",
    ),
    dict(
        d_model=128,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        d_ff=384,
        vocab_size=512,
        max_seq_len=64,
        gate="none",
    ),
    dict(
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        d_ff=128,
        vocab_size=257,
        max_seq_len=64,
        moe=dict(num_experts=8, top_k=2, d_expert=64),
    ),
]


def saved_bytes(cfg: ModelConfig, batch: int, seq: int, checkpointing: bool) -> int:
    """Bytes of the distinct non-parameter storages autograd keeps for backward (fp32 forward on the CPU)."""
    model = Transformer(cfg, seed=0)
    if checkpointing:
        from torch.distributed._composable import checkpoint

        for block in model.blocks:
            checkpoint(block)
    owned = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    storages = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in owned:
            storages[s.data_ptr()] = s.nbytes()
        return t

    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x)
    return sum(storages.values())


@pytest.mark.parametrize("shape", SHAPES, ids=["elementwise", "headwise-gqa", "no-gate", "moe"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["", "ac"])
def test_activation_estimate_matches_saved_tensors(shape, checkpointing):
    cfg = from_dict(ModelConfig, shape, "model")
    measured = saved_bytes(cfg, 4, 32, checkpointing)
    estimate = 4 * 32 * activation_bytes_per_token(cfg, 4, activation_checkpointing=checkpointing)
    assert estimate == pytest.approx(measured, rel=0.1)


def test_state_terms_follow_the_parameters():
    cfg = from_dict(ModelConfig, SHAPES[0], "model")
    n_params = sum(p.numel() for p in Transformer(cfg, seed=0).parameters())  # a real model, tied head once
    ddp = estimate_memory(cfg, micro_batch=2, seq_len=32, precision="fp32")
    fsdp = estimate_memory(cfg, micro_batch=2, seq_len=32, world_size=4, parallel="fsdp", precision="fp32")
    assert ddp.params == n_params
    assert (ddp.weights, ddp.grads, ddp.optimizer) == (4 * n_params, 4 * n_params, 8 * n_params)
    assert fsdp.weights + fsdp.grads + fsdp.optimizer == pytest.approx(
        (ddp.weights + ddp.grads + ddp.optimizer) / 4
    )
    assert fsdp.activations == ddp.activations


@pytest.mark.parametrize("shape", SHAPES, ids=["elementwise", "headwise-gqa", "no-gate", "moe"])
def test_the_optimizer_state_is_what_each_optimizer_keeps_after_a_step(shape):
    """AdamW keeps two moments per parameter; under train.optimizer=muon, Muon keeps one momentum buffer for the
    hidden matrices it holds (an MoE's fused experts stay with AdamW): the estimate's optimizer bytes are the
    bytes of the real optimizers' state tensors after one step, deep configs counted from one period."""
    from smallinit.config import TrainConfig
    from smallinit.train.optim import build_optimizer, optimizers

    cfg = from_dict(ModelConfig, shape, "model")
    for name in ("adamw", "muon"):
        model = Transformer(cfg, seed=0)
        opt = build_optimizer(model, TrainConfig(optimizer=name))
        x = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
        model(x, x).loss.backward()
        opt.step()
        kept = sum(
            t.nbytes for o in optimizers(opt) for st in o.state.values() for t in st.values() if t.dim() > 0
        )
        est = estimate_memory(cfg, micro_batch=2, seq_len=16, precision="fp32", optimizer=name)
        assert est.optimizer == kept, name


def test_describe_memory_checks_the_split():
    cfg = Config.load(overrides=["train.batch_size=8"])
    assert "fsdp × 2" in describe_memory(cfg, 2)
    with pytest.raises(ConfigError, match="does not divide"):
        describe_memory(cfg, 3)


def saved_bytes_bf16(cfg: ModelConfig, batch: int, seq: int) -> tuple[int, int]:
    """Bytes autograd keeps under bf16 autocast (CPU): (activations, bf16 copies of the weights).

    A saved bf16 tensor shaped like a weight matrix is autocast's copy of it (the estimate's 2P, not an
    activation); the sizes below keep every activation unlike any weight."""
    model = Transformer(cfg, seed=0)
    owned = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    weights = {tuple(p.shape) for p in model.parameters() if p.dim() >= 2}
    acts, casts = {}, {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in owned:
            copy = t.dtype == torch.bfloat16 and (
                tuple(t.shape) in weights or tuple(t.shape[::-1]) in weights
            )
            (casts if copy else acts)[s.data_ptr()] = s.nbytes()
        return t

    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        model(x, x)
    return sum(acts.values()), sum(casts.values())


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[3]], ids=["dense", "moe"])
def test_activation_estimate_matches_saved_tensors_under_bf16_autocast(shape):
    cfg = from_dict(ModelConfig, shape, "model")
    measured, casts = saved_bytes_bf16(cfg, 4, 32)
    assert activation_bytes_per_token(cfg, 2) * 4 * 32 == pytest.approx(measured, rel=0.05)
    params = sum(p.numel() for p in Transformer(cfg, seed=0).parameters())
    assert 0 < casts <= 2 * params  # autocast's weight copies: within the estimate's 2P


def test_the_memory_table_of_distributed_md_is_what_the_command_it_names_prints():
    """docs/distributed.md quotes `memory_table()`'s output: it must change when the estimate does."""
    import re
    from pathlib import Path

    from smallinit.train.memory import memory_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "distributed.md").read_text(encoding="utf-8")
    assert "from smallinit.train.memory import memory_table; print(memory_table())" in doc
    shown = re.search(r"^```\n(per GPU, GiB.*?)^```$", doc, re.S | re.M)
    assert shown is not None and shown.group(1) == memory_table() + "\n"
