"""γ-initialization: every weight matrix W ~ N(0, σ²) with σ = d_in^(−γ).

γ = 0.5 is the usual LeCun/Xavier-like scale; γ = 1 is the paper's recommendation. Scope (ours: the paper
does not say what d_in is for each kind of parameter): Linear weights use in_features, Embedding weights
use embedding_dim, any other parameter of ≥ 2 dims uses its last dimension (PyTorch's out×in layout;
leading dims such as experts are a batch). A module can name another fan-in for a parameter through a
``gamma_fan_in`` dict attribute. Norm weights are set to 1 and biases to 0. Tied parameters are drawn once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError
from .roles import is_norm


def gamma_std(fan_in: int, gamma: float) -> float:
    """σ = d_in^(−γ)."""
    return float(fan_in) ** (-gamma)


@torch.no_grad()
def gamma_normal_(
    tensor: torch.Tensor, gamma: float, fan_in: int | None = None, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Fill ``tensor`` in place from N(0, fan_in^(−2γ)); fan_in defaults to the last (input) dimension."""
    if gamma <= 0 or not math.isfinite(gamma):
        raise ConfigError(f"gamma must be a positive number, got {gamma}")
    if fan_in is None:
        if tensor.dim() < 2:
            raise ConfigError(f"gamma_normal_ needs fan_in for a {tensor.dim()}-d tensor")
        fan_in = tensor.shape[-1]
    if tensor.is_meta:  # shapes only (parameter counts, the init report): nothing to draw
        return tensor
    # Draw in fp32 on the CPU so the weights do not depend on dtype, device or parallel layout.
    sample = torch.empty(tensor.shape, dtype=torch.float32).normal_(0.0, gamma_std(fan_in, gamma), generator=generator)
    return tensor.copy_(sample)


@dataclass(frozen=True)
class InitRow:
    name: str
    shape: tuple[int, ...]
    rule: str  # "normal", "ones" or "zeros"
    fan_in: int | None
    std: float | None


@dataclass
class InitReport:
    """What gamma_init_ set, one row per parameter; ``str(report)`` is a table."""

    gamma: float
    rows: list[InitRow]

    def __str__(self) -> str:
        header = f"{'parameter':<48} {'shape':<18} {'rule':<6} {'d_in':>6} {'std':>10}"
        lines = [f"γ-init, γ = {self.gamma:g}", header, "-" * len(header)]
        for r in self.rows:
            fan = "" if r.fan_in is None else str(r.fan_in)
            std = "" if r.std is None else f"{r.std:.4g}"
            lines.append(f"{r.name:<48} {str(tuple(r.shape)):<18} {r.rule:<6} {fan:>6} {std:>10}")
        untouched = sum(r.rule == "kept" for r in self.rows)
        if untouched:
            lines.append(f"({untouched} parameters kept as they were)")
        return "\n".join(lines)

    def by_name(self) -> dict[str, InitRow]:
        return {r.name: r for r in self.rows}


def _fan_in(module: nn.Module, pname: str, p: torch.Tensor) -> int:
    override = getattr(module, "gamma_fan_in", None)
    if isinstance(override, dict) and pname in override:
        return int(override[pname])
    if isinstance(module, nn.Linear) and pname == "weight":
        return module.in_features
    if isinstance(module, nn.Embedding) and pname == "weight":
        return module.embedding_dim
    return p.shape[-1]


@torch.no_grad()
def gamma_init_(module: nn.Module, gamma: float = 1.0, *, generator: torch.Generator | None = None) -> InitReport:
    """Apply the γ rule to every parameter of ``module`` (ours or any other nn.Module) and report it.

    Parameters are visited in ``named_modules`` order so a seeded ``generator`` gives the same weights on
    every run. 1-d parameters of norms become 1, other 1-d parameters (biases) 0. Scalars are kept.
    """
    if gamma <= 0 or not math.isfinite(gamma):
        raise ConfigError(f"gamma must be a positive number, got {gamma}")
    seen: set[int] = set()
    rows: list[InitRow] = []
    for mname, mod in module.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mname}.{pname}" if mname else pname
            shape = tuple(p.shape)
            if p.dim() >= 2:
                fan = _fan_in(mod, pname, p)
                gamma_normal_(p, gamma, fan, generator=generator)
                rows.append(InitRow(name, shape, "normal", fan, gamma_std(fan, gamma)))
            elif p.dim() == 1 and is_norm(mod) and pname == "weight":
                p.fill_(1.0)
                rows.append(InitRow(name, shape, "ones", None, None))
            elif p.dim() == 1:
                p.zero_()
                rows.append(InitRow(name, shape, "zeros", None, None))
            else:
                rows.append(InitRow(name, shape, "kept", None, None))
    return InitReport(gamma=gamma, rows=rows)
