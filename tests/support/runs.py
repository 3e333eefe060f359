"""Small helpers several test files share: a checkpoint's tensors, a folder's bytes, the tiny test model."""

from __future__ import annotations

from pathlib import Path

import torch

from smallinit.train import checkpoint as ckpt


def tensors_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of a checkpoint folder (one process's files, or a distributed run's shards)."""
    model, optim = ckpt.read_tensors(ckpt.read_checkpoint(checkpoint))
    return {**model, **optim}


def final_tensors(run: Path) -> dict[str, torch.Tensor]:
    """The tensors of a run folder's newest complete checkpoint."""
    return tensors_of(ckpt.latest_checkpoint(run).path)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` with its bytes, by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# A 2-layer d = 32 model on bytes that trains in a fraction of a second; each test file adds its train keys.
TINY_MODEL = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.n_kv_heads=2",
    "model.d_ff=64",
    "data.tokenizer=bytes",
    "data.seq_len=32",
]
# The same with grouped-query attention (4 query heads share 2 key/value heads), for export and generation.
TINY_GQA = [
    "data.tokenizer=bytes",
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.d_ff=64",
    "model.max_seq_len=64",
    "data.seq_len=32",
]
