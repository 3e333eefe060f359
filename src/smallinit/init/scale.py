"""The γ a model's weights were drawn with, read back from the weights: σ = d_in^(−γ), so γ = −ln σ / ln d_in
for each matrix, with d_in from the same roles γ-init draws by. A model γ-initialised gives one γ in every
matrix; a fixed std (0.02, most libraries' default) gives a γ that falls as d_in grows."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from smallinit.init.partitioned import gathered
from smallinit.init.roles import ParamRole, named_parameters_once, param_roles

ONE_GAMMA = (
    0.05  # matrices whose γ spread less than this were drawn by one γ rule (sampling noise is far below)
)


@dataclass(frozen=True)
class GammaEstimate:
    """Each drawn matrix's γ = −ln std / ln d_in, and the matrices that give none, with why."""

    per_matrix: dict[str, float]
    not_read: dict[str, str] = field(default_factory=dict)

    @property
    def median(self) -> float | None:
        return statistics.median(self.per_matrix.values()) if self.per_matrix else None

    @property
    def low(self) -> float | None:
        return min(self.per_matrix.values(), default=None)

    @property
    def high(self) -> float | None:
        return max(self.per_matrix.values(), default=None)

    @property
    def one_rule(self) -> bool:
        """The matrices agree on one γ (a γ-rule init); else their stds do not follow d_in^(−γ)."""
        return bool(self.per_matrix) and self.high - self.low < ONE_GAMMA

    def to_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "low": self.low,
            "high": self.high,
            "matrices": len(self.per_matrix),
            "not_read": self.not_read,
        }


@torch.no_grad()
def measure_gamma(module: nn.Module, roles: dict[str, ParamRole] | None = None) -> GammaEstimate:
    """The γ of each weight matrix and embedding of ``module`` as its weights stand (a sharded tensor is
    gathered: under torch.distributed every rank must call it)."""
    roles = param_roles(module) if roles is None else roles
    gammas: dict[str, float] = {}
    not_read: dict[str, str] = {}
    for name, _, _, p in named_parameters_once(module):
        role = roles.get(name)
        if role is None or not role.drawn:
            continue
        with gathered([p]):  # a ZeRO-3 partitioned matrix is whole inside, one at a time
            w = p.full_tensor() if hasattr(p, "full_tensor") else p
            std = float(w.float().std()) if w.numel() >= 2 and not w.is_meta else None
        if std is None:
            not_read[name] = "not materialised here (meta)"
        elif role.fan_in is None or role.fan_in < 2:
            not_read[name] = f"d_in {role.fan_in}: γ is not defined"
        elif std <= 0 or not math.isfinite(std):
            not_read[name] = f"std {std:g}: no γ"
        else:
            gammas[name] = -math.log(std) / math.log(role.fan_in)
    return GammaEstimate(gammas, not_read)
