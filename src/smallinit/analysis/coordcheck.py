"""Coordinate check over γ (beyond the paper): the scale of every layer's activations and of the parameter
updates during the first optimizer steps, one fresh model per γ: smallinit's own from a ModelConfig, or
any model an adapter reads (smallinit.adapters) from a function of γ that builds it.

Like mup's coordinate check, but with γ on the x-axis instead of width: it shows at a glance which layers
start small, which grow, and how large the first updates are relative to the γ-scaled weights.
Training follows the trainer (its optimizer, AdamW or ``train.optimizer = "muon"``, with the parameter groups
of ``smallinit.train.optim``, gradient clipping), at the TrainConfig's peak LR held constant: no warmup, so the
first steps already move.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from smallinit.adapters import ModelAdapter, as_adapter
from smallinit.config import ModelConfig, TrainConfig
from smallinit.data import get_batch
from smallinit.io import write_result
from smallinit.model import Transformer
from smallinit.train.optim import build_optimizer


@dataclass
class CoordCheck:
    """Rows of (γ, step, kind, name, rms); kind ∈ activation | update | relative_update."""

    FILE = "coordcheck.json"

    gammas: list[float]
    steps: int
    rows: list[dict]
    config: dict

    def series(self, kind: str, name: str, step: int) -> list[float]:
        """RMS of ``name`` at ``step`` for each γ (in ``gammas`` order)."""
        by_gamma = {
            r["gamma"]: r["rms"] for r in self.rows if (r["kind"], r["name"], r["step"]) == (kind, name, step)
        }
        return [by_gamma.get(g, float("nan")) for g in self.gammas]

    @property
    def optimizer(self) -> str:
        """The optimizer that made the updates, in words."""
        return {"muon": "Muon + AdamW"}.get(self.config.get("train", {}).get("optimizer", "adamw"), "AdamW")

    def names(self, kind: str) -> list[str]:
        return list(dict.fromkeys(r["name"] for r in self.rows if r["kind"] == kind))

    def to_dict(self) -> dict:
        return {"gammas": self.gammas, "steps": self.steps, "rows": self.rows, "config": self.config}

    def save(self, folder: str | os.PathLike) -> Path:
        """FOLDER/coordcheck.json, which the HTML report reads back."""
        return write_result(Path(folder) / self.FILE, self.to_dict())

    @staticmethod
    def from_dict(raw: dict) -> CoordCheck:
        return CoordCheck(
            gammas=list(raw["gammas"]),
            steps=int(raw["steps"]),
            rows=list(raw["rows"]),
            config=dict(raw["config"]),
        )


def _rms(t: torch.Tensor) -> float:
    return t.detach().double().pow(2).mean().sqrt().item()


def _activation_rows(
    adapter: ModelAdapter, x: torch.Tensor, y: torch.Tensor
) -> tuple[list[tuple[str, float]], torch.Tensor]:
    """RMS of e ("embed"), of each block's output ("blocks.i"), of the logits; and the training loss."""
    out = adapter.observe(x, y, kinds=("residual",))
    out.require("residual")  # a model whose layers cannot be read is refused in one line
    names = ["embed"] + [f"blocks.{i}" for i in range(len(out.residual) - 1)]
    rows = [(n, _rms(h)) for n, h in zip(names, out.residual)]
    rows.append(("logits", _rms(out.logits)))
    loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
    return rows, loss


def coord_check(
    config: ModelConfig | Callable[[float], nn.Module],
    gammas: Sequence[float],
    steps: int = 5,
    *,
    train: TrainConfig | None = None,
    batch_size: int = 8,
    seq_len: int = 64,
    tokens: np.ndarray | None = None,
    seed: int = 0,
) -> CoordCheck:
    """Activation RMS per layer (steps 0..``steps``) and update RMS per parameter (steps 1..``steps``).

    ``config``: a ModelConfig (a smallinit Transformer per γ, from ``seed``), or ``build(γ)`` returning a
    fresh model initialised at that γ (say ``gamma_init_`` on a Hugging Face model built from its config).
    ``tokens``: a flat token array to draw batches from (as in training); default: seeded uniform random
    tokens. Every γ sees the same batches.
    """
    tc = dataclasses.replace(train or TrainConfig(), warmup_steps=0, schedule="constant", steps=max(steps, 1))
    if isinstance(config, ModelConfig):
        seq_len = min(seq_len, config.max_seq_len)
    rows: list[dict] = []
    described = dataclasses.asdict(config) if isinstance(config, ModelConfig) else {}
    for gamma in gammas:
        if isinstance(config, ModelConfig):
            model = Transformer(dataclasses.replace(config, gamma=float(gamma)), seed=seed)
        else:
            model = config(float(gamma))
            described = {
                "built by": getattr(config, "__qualname__", type(config).__name__),
                "class": type(model).__name__,
            }
        adapter = as_adapter(model)
        opt = build_optimizer(adapter.module, tc)
        for step in range(steps + 1):
            x, y = _batch(tokens, adapter.vocab_size, batch_size, seq_len, seed, step)
            acts, loss = _activation_rows(adapter, x, y)
            rows += [dict(gamma=float(gamma), step=step, kind="activation", name=n, rms=v) for n, v in acts]
            if step == steps:
                break
            before = {n: p.detach().clone() for n, p in adapter.module.named_parameters()}
            loss.backward()
            torch.nn.utils.clip_grad_norm_(adapter.module.parameters(), tc.grad_clip or math.inf)
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for n, p in adapter.module.named_parameters():
                    du = _rms(p - before[n])
                    rows.append(dict(gamma=float(gamma), step=step + 1, kind="update", name=n, rms=du))
                    w = _rms(before[n])
                    rows.append(
                        dict(
                            gamma=float(gamma),
                            step=step + 1,
                            kind="relative_update",
                            name=n,
                            rms=du / w if w > 0 else float("nan"),
                        )
                    )
    return CoordCheck(
        gammas=[float(g) for g in gammas],
        steps=steps,
        rows=rows,
        config={
            "model": described,
            "train": dataclasses.asdict(tc),
            "batch_size": batch_size,
            "seq_len": seq_len,
            "seed": seed,
        },
    )


def _batch(tokens, vocab: int, batch_size: int, seq_len: int, seed: int, step: int):
    if tokens is not None:
        return get_batch(tokens, batch_size, seq_len, seed, step)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    w = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
    return w[:, :-1], w[:, 1:]
