"""How long a run's RMSNorms stay saturated: measured along training, and predicted for any schedule.

A norm is **saturated** while its measured factor relative to the ideal 1/σ(h) (``norm_factor``) is below
``SATURATED`` = 0.5, i.e. while σ²(h) < ε/3: ε then decides more of the scale than the input does.

Measured (``saturated_share``): from the factor at the measured steps s_0 < s_1 < … of a run of T steps,
each interval [s_i, s_i+1) (the last one up to T) is saturated for certain when the factor is below 0.5 at
both ends and possibly when at either end; the share of the T steps is reported as that bracket
[lo, hi], whose width is the price of the measurement spacing (``analysis.norm_every``).

Predicted (``steps_to_unsaturate``): the norm that reads the token embedding e sees σ²(h) = σ²(e). Adam
moves every entry by at most about the learning rate per step (its update m/√v is ≈ ±1 while the gradient
keeps its sign), and the embedding is not weight-decayed, so with entries that start at N(0, d^(−2γ)) and
move by ``rate``·lr_s at step s, uncorrelated with their start,

    σ²(e)(t) = d^(−2γ) + (rate · Σ_{s<t} lr_s)²,

and the factor reaches f once σ² ≥ ε·f²/(1 − f²). With ``rate`` = 1 (every step fully coherent) this is the
fewest steps the norm can stay saturated; a measured run gives its own rate (``growth_rate``), which says how
far below that bound real training is. Adam's absolute steps are why an emulated ε' = ε·(W/d)^(2γ) does not
emulate the *duration*: the narrow model must grow its embedding by the same factor as the wide one, but
from d^(−γ) instead of W^(−γ), so by (W/d)^γ times more in absolute terms at the same learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from smallinit.config import Config
from smallinit.monitor.records import AnalysisRecord, NormFactorRecord
from smallinit.train.optim import lr_at

SATURATED = 0.5  # a norm factor below this (σ² < ε/3) counts as saturated
MEAN = "mean"  # the series of the mean factor over all of a model's norms


@dataclass(frozen=True)
class SaturatedShare:
    """The share of a run's ``total_steps`` spent with the factor below ``SATURATED``: within [lo, hi]."""

    lo: float
    hi: float
    total_steps: int
    spacing: int  # the widest gap between two measurements

    @property
    def mid(self) -> float:
        return 0.5 * (self.lo + self.hi)

    def to_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "mid": self.mid}

    def describe(self) -> str:
        if self.hi - self.lo < 0.0005:
            return f"{100 * self.mid:.1f} %"
        return f"{100 * self.lo:.1f}–{100 * self.hi:.1f} %"


def saturated_share(
    steps: Iterable[int], factors: Iterable[float], total_steps: int, threshold: float = SATURATED
) -> SaturatedShare:
    """The share of ``total_steps`` with the factor below ``threshold``, bracketed by the measurement spacing.

    ``steps`` must start at 0; the last interval runs to ``total_steps`` (a run measured up to its end has its
    last measurement there and adds nothing).
    """
    s = np.asarray(list(steps), dtype=np.int64)
    f = np.asarray(list(factors), dtype=np.float64)
    order = np.argsort(s, kind="stable")
    s, f = s[order], f[order]
    if len(s) == 0 or s[0] != 0 or total_steps < 1 or s[-1] > total_steps:
        raise ValueError(
            f"saturated_share needs measurements from step 0 to at most {total_steps}, got {s.tolist()}"
        )
    ends = np.append(s[1:], total_steps)
    width = ends - s
    below = f < threshold
    nxt = np.append(below[1:], below[-1])  # the last interval holds its value up to the end
    lo = float(np.sum(width[below & nxt])) / total_steps
    hi = float(np.sum(width[below | nxt])) / total_steps
    return SaturatedShare(lo, hi, int(total_steps), int(width.max()) if len(width) else 0)


def norm_series(records: Iterable[AnalysisRecord | NormFactorRecord]) -> dict[str, list[tuple[int, float]]]:
    """(step, factor) per norm and for their mean (key ``MEAN``), from the records that measured the norms,
    one per step (the last one wins), in step order."""
    by_step: dict[int, dict[str, float]] = {}
    for r in records:
        if r.norm_factor:
            by_step[r.step] = r.norm_factor
    series: dict[str, list[tuple[int, float]]] = {MEAN: []}
    for step in sorted(by_step):
        factors = by_step[step]
        series[MEAN].append((step, float(np.mean(list(factors.values())))))
        for name, v in factors.items():
            series.setdefault(name, []).append((step, float(v)))
    return series if series[MEAN] else {}


def run_saturation(
    records: Iterable[AnalysisRecord | NormFactorRecord], total_steps: int
) -> dict[str, SaturatedShare]:
    """The saturated share of every norm and of their mean, from a run's norm-factor records (empty when none
    was measured at step 0)."""
    out = {}
    for name, pts in norm_series(records).items():
        if pts[0][0] == 0:
            out[name] = saturated_share([p[0] for p in pts], [p[1] for p in pts], total_steps)
    return out


def _target_variance(eps: float, factor: float) -> float:
    """σ² at which σ/√(σ² + ε) = factor."""
    return eps * factor**2 / (1.0 - factor**2)


def steps_to_unsaturate(cfg: Config, *, rate: float = 1.0, threshold: float = SATURATED) -> float:
    """Steps until the embedding's norm reaches ``threshold`` (module docstring), under ``cfg``'s width, γ,
    effective ε and learning-rate schedule; 0 if it starts there, ``inf`` if it never gets there in
    ``train.steps``. Fractional: the step at which the summed learning rate crosses the target, interpolated."""
    m, tc = cfg.model, cfg.train
    var0 = float(m.d_model) ** (-2.0 * m.gamma)
    need = _target_variance(m.effective_norm_eps, threshold) - var0
    if need <= 0:
        return 0.0
    travel = math.sqrt(need) / rate  # Σ lr_s needed
    total = 0.0
    for step in range(tc.steps):
        lr = lr_at(step, tc)
        if total + lr >= travel:
            return step + (travel - total) / lr
        total += lr
    return math.inf


def growth_rate(cfg: Config, steps_measured: float, threshold: float = SATURATED) -> float | None:
    """The ``rate`` at which ``steps_to_unsaturate`` gives ``steps_measured`` (how coherent the embedding's
    growth was in a measured run), or None where the norm never started saturated."""
    m, tc = cfg.model, cfg.train
    need = _target_variance(m.effective_norm_eps, threshold) - float(m.d_model) ** (-2.0 * m.gamma)
    if need <= 0 or steps_measured <= 0:
        return None
    whole = min(int(steps_measured), tc.steps)
    travelled = sum(lr_at(s, tc) for s in range(whole)) + (steps_measured - whole) * lr_at(
        min(whole, tc.steps - 1), tc
    )
    return math.sqrt(need) / travelled
