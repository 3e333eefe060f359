"""Residual flow (the paper's C5, Fig. 3a): how far the last hidden state moved from the embedding.

ratio = mean over tokens of ‖h_L − e‖₂ / ‖e‖₂, h_L = the final norm's input. The paper's analysis gives
ratio ≍ d^(1−γ): the residual branches dominate for γ < 1, balance at γ = 1 and vanish for γ > 1.

:func:`residual_flow_sweep` checks the exponent on fresh models: for each γ it builds models over a
range of widths at fixed depth, with the number of heads scaled with the width (head_dim fixed, so the
attention logits do not change scale with d), feeds seeded uniform random tokens, and fits the slope of
log(ratio) against log(d). Nothing is trained or tuned.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from smallinit.adapters import as_adapter
from smallinit.config import ModelConfig
from smallinit.errors import ConfigError
from smallinit.io import write_result
from smallinit.model import Transformer


@torch.no_grad()
def residual_flow_ratio(model, tokens: torch.Tensor) -> float:
    """Mean over tokens of ‖h_L − e‖ / ‖e‖, for any model an adapter reads (e: the first block's input,
    h_L: the final norm's input, or the last block's output where the model has no final norm)."""
    observed = as_adapter(model).observe(tokens, kinds=("residual",))
    observed.require("residual")
    return flow_from_hidden(observed.residual)


def flow_from_hidden(residual: list[torch.Tensor]) -> float:
    """The ratio from the observed residual stream (``Observed.residual``: e first, h_L last)."""
    e, h = residual[0].double(), residual[-1].double()
    return ((h - e).norm(dim=-1) / e.norm(dim=-1)).mean().item()


@dataclass
class ResidualFlowSweep:
    FILE = "residual_flow_sweep.json"

    gammas: list[float]
    widths: list[int]
    seeds: list[int]
    ratios: np.ndarray  # (γ, width, seed)
    slopes: list[float]  # fitted d-exponent per γ (log of the ratio averaged over seeds)
    seed_slopes: np.ndarray  # (γ, seed): the exponent fitted per seed, for the spread
    base_config: dict

    @property
    def predicted(self) -> list[float]:
        return [1.0 - g for g in self.gammas]

    def to_dict(self) -> dict:
        return {
            "gammas": self.gammas,
            "widths": self.widths,
            "seeds": self.seeds,
            "ratios": self.ratios.tolist(),
            "slopes": self.slopes,
            "seed_slopes": self.seed_slopes.tolist(),
            "predicted": self.predicted,
            "base_config": self.base_config,
        }

    def save(self, folder: str | os.PathLike) -> Path:
        """FOLDER/residual_flow_sweep.json, which the HTML report reads back."""
        return write_result(Path(folder) / self.FILE, self.to_dict())

    @staticmethod
    def from_dict(raw: dict) -> ResidualFlowSweep:
        return ResidualFlowSweep(
            gammas=list(raw["gammas"]),
            widths=list(raw["widths"]),
            seeds=list(raw["seeds"]),
            ratios=np.asarray(raw["ratios"], dtype=float),
            slopes=list(raw["slopes"]),
            seed_slopes=np.asarray(raw["seed_slopes"], dtype=float),
            base_config=dict(raw["base_config"]),
        )


def residual_flow_sweep(
    gammas: Sequence[float],
    widths: Sequence[int],
    *,
    base_config: ModelConfig | None = None,
    seeds: Sequence[int] = (0, 1),
    head_dim: int = 32,
    ff_mult: int = 4,
    batch_size: int = 4,
    seq_len: int = 32,
) -> ResidualFlowSweep:
    """Residual-flow ratio of fresh γ-initialised models over ``widths``; fitted exponent per γ.

    ``base_config`` fixes depth, vocabulary, gate, ε, ... (default: the cpu-1m preset); width d sets
    d_model = d, heads = d / head_dim (kv heads likewise), d_ff = ff_mult·d. Seed s draws both the weights
    and the tokens.
    """
    widths = [int(w) for w in widths]
    if len(widths) < 2 or max(widths) < 2 * min(widths):
        raise ConfigError(f"residual_flow_sweep needs ≥ 2 widths spanning ≥ 2× (better 4×), got {widths}")
    if any(w % head_dim for w in widths):
        raise ConfigError(f"every width must be a multiple of head_dim={head_dim}, got {widths}")
    base = base_config or ModelConfig.preset("cpu-1m")
    base = dataclasses.replace(base, max_seq_len=max(base.max_seq_len, seq_len))
    ratios = np.zeros((len(gammas), len(widths), len(seeds)))
    for gi, gamma in enumerate(gammas):
        for wi, d in enumerate(widths):
            cfg = dataclasses.replace(
                base,
                gamma=float(gamma),
                d_model=d,
                n_heads=d // head_dim,
                n_kv_heads=d // head_dim,
                d_ff=ff_mult * d,
            )
            for si, seed in enumerate(seeds):
                model = Transformer(cfg, seed=int(seed)).eval()
                g = torch.Generator().manual_seed(10_000 + int(seed))
                tokens = torch.randint(0, cfg.vocab_size, (batch_size, seq_len), generator=g)
                ratios[gi, wi, si] = residual_flow_ratio(model, tokens)
    logd, logr = np.log(widths), np.log(ratios)
    slopes = [float(np.polyfit(logd, logr[gi].mean(axis=1), 1)[0]) for gi in range(len(gammas))]
    seed_slopes = np.array(
        [[np.polyfit(logd, logr[gi, :, si], 1)[0] for si in range(len(seeds))] for gi in range(len(gammas))]
    )
    return ResidualFlowSweep(
        gammas=[float(g) for g in gammas],
        widths=widths,
        seeds=[int(s) for s in seeds],
        ratios=ratios,
        slopes=slopes,
        seed_slopes=seed_slopes,
        base_config=dataclasses.asdict(base),
    )
