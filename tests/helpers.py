"""Small helpers several test files share: a checkpoint's tensors and a folder's bytes."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from smallinit.train import checkpoint as ckpt


def tensors_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of a checkpoint folder."""
    return {**load_file(checkpoint / "model.safetensors"), **load_file(checkpoint / "optim.safetensors")}


def final_tensors(run: Path) -> dict[str, torch.Tensor]:
    """The tensors of a run folder's newest complete checkpoint."""
    return tensors_of(ckpt.latest_checkpoint(run).path)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` with its bytes, by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
