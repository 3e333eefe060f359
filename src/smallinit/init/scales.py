"""Per-role init scales: the γ rule kept, and overridden for one role of matrix at a time, as the recipes people
pretrain with now do (nanochat, modded-nanogpt: embedding σ = 1, zero-initialised output projections; GPT-2:
output projections ÷ √(2L)).

Each drawn parameter has one role, from what γ-init establishes (``roles``) and one forward (``branches``):

    embedding   the input token table (also the head, when the two are tied)
    head        the output head, when it is a matrix of its own
    output      a matrix whose output a branch adds to the residual stream (attention and MLP output projections)
    hidden      every other matrix

and a scale is ``ROLE=RULE`` with RULE one of

    std:X       σ = X
    gamma:X     σ = d_in^(−X), a γ of its own
    zero        all zeros
    depth       σ = d_in^(−γ) / √N, N the residual additions the forward makes (2 per block): GPT-2's 1/√(2L)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from smallinit.errors import ConfigError

SCALE_ROLES = ("embedding", "head", "output", "hidden")
RULES = ("std:X", "gamma:X", "zero", "depth")


class InitScaleError(ConfigError):
    """A per-role init scale that cannot be read or matches no parameter."""


@dataclass(frozen=True)
class RoleScale:
    role: str
    rule: str  # "std", "gamma", "zero" or "depth"
    value: float | None = None

    @staticmethod
    def parse(spec: str) -> RoleScale:
        """``ROLE=RULE``: ``embedding=std:1``, ``output=zero``, ``output=depth``, ``head=gamma:0.5``."""
        role, sep, rule = str(spec).partition("=")
        role, rule = role.strip(), rule.strip()
        if not sep or role not in SCALE_ROLES:
            raise InitScaleError(
                f"init scale {spec!r}: write ROLE=RULE with ROLE one of {', '.join(SCALE_ROLES)} "
                f"and RULE one of {', '.join(RULES)} (e.g. output=zero)"
            )
        name, colon, number = rule.partition(":")
        if name in ("zero", "depth") and not colon:
            return RoleScale(role, name)
        if name in ("std", "gamma") and colon:
            try:
                value = float(number)
            except ValueError:
                value = math.nan
            if value > 0 and math.isfinite(value):
                return RoleScale(role, name, value)
            raise InitScaleError(f"init scale {spec!r}: {name} must be a positive number, got {number!r}")
        raise InitScaleError(f"init scale {spec!r}: RULE must be one of {', '.join(RULES)}, got {rule!r}")

    def __str__(self) -> str:
        return f"{self.role}={self.rule}" + ("" if self.value is None else f":{self.value:g}")

    def std(self, fan_in: int, gamma: float, additions: int) -> float:
        """σ of a matrix of this role with input width ``fan_in``, under the model's ``gamma``; ``additions``:
        the residual additions the forward makes (only ``depth`` reads it). 0 means zeros."""
        if self.rule == "std":
            return float(self.value)
        if self.rule == "gamma":
            return float(fan_in) ** -float(self.value)
        if self.rule == "zero":
            return 0.0
        return float(fan_in) ** -gamma / math.sqrt(additions)


def parse_scales(scales: Iterable[str] | Mapping[str, str] | None) -> dict[str, RoleScale]:
    """Scales by role, from ``["output=zero", ...]`` or ``{"output": "zero", ...}``; a role given twice is refused."""
    if not scales:
        return {}
    if isinstance(scales, str):
        specs = [scales]
    else:
        specs = [f"{k}={v}" for k, v in scales.items()] if isinstance(scales, Mapping) else list(scales)
    out: dict[str, RoleScale] = {}
    for spec in specs:
        s = RoleScale.parse(spec)
        if s.role in out:
            raise InitScaleError(f"init scale for role {s.role} given twice ({out[s.role]}, {s}); keep one")
        out[s.role] = s
    return out
