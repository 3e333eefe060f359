"""Is the emulated ε saturated for as long as the paper's? The measured share beside the paper-scale one.

``model.norm_eps_width`` gives a narrow model the RMSNorm factor at init of a d = 2048 one. How long the
factor stays below 0.5 is another matter (``smallinit.analysis.saturation``): this module puts the share of
training a run's norms spent saturated (measured by ``analysis.norm_every``, or coarsely by
``analysis.every``) beside the share the same formula gives the paper's setting — d = 2048, γ = 1,
ε = 1e-5, the learning-rate schedule of this project's ``paper-fig1`` recipe at its ``gpu`` scale — for
Adam growth rates from the one the run itself showed up to 1 (fully coherent steps, the shortest possible).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smallinit.analysis.saturation import (
    MEAN,
    SATURATED,
    SaturatedShare,
    growth_rate,
    norm_series,
    run_saturation,
    steps_to_unsaturate,
)
from smallinit.config import Config, flatten, read_toml
from smallinit.monitor.records import AnalysisRecord, NormFactorRecord
from smallinit.monitor.runs import Run, config_from_flat
from smallinit.study.running.budget import budget_schedule, budget_steps

PAPER_RECIPE = Path(__file__).resolve().parents[1] / "planning" / "recipes" / "paper-fig1.toml"
PAPER_SCALE = "gpu"
PAPER_SIZE = "1.5b"  # d = 2048
FAR = 3.0  # shares more than this many times apart ...
FAR_ABS = 0.01  # ... and more than this much of training apart are "far"


def paper_scale_config(gamma: float = 1.0, eps: float = 1e-5) -> Config:
    """The paper's d = 2048 setting as the paper-fig1 recipe trains it (its gpu scale), without the fixes."""
    recipe = read_toml(PAPER_RECIPE)
    scale = recipe["scales"][PAPER_SCALE]
    keys = {
        **flatten(recipe.get("base", {})),
        **flatten(scale.get("base", {})),
        **flatten(scale["sweeps"]["grid"]["sizes"][PAPER_SIZE]),
        "model.gamma": gamma,
        "model.norm_eps": eps,
        "model.gate": "none",
        "model.norm_eps_width": 0,
    }
    cfg = config_from_flat(keys)
    if "budget" in scale:  # the length follows from the model's size, as the recipe resolves it
        cfg = config_from_flat(
            {**keys, **budget_schedule(budget_steps(cfg, scale["budget"]), scale["budget"])}
        )
    return cfg


# a pure function of its arguments and the shipped recipe; asked once per run
@functools.lru_cache(maxsize=64)
def paper_scale_share(rate: float = 1.0, gamma: float = 1.0, eps: float = 1e-5) -> float:
    """The share of the paper-scale run its embedding's norm spends saturated, by the formula at ``rate``."""
    cfg = paper_scale_config(gamma, eps)
    return min(1.0, steps_to_unsaturate(cfg, rate=rate) / cfg.train.steps)


@dataclass(frozen=True)
class Emulation:
    """One run's saturated share beside the paper-scale share at growth rates from ``rate`` (the run's) to 1."""

    measured: SaturatedShare  # the mean factor over the run's norms
    first: SaturatedShare  # the norm that reads the embedding
    rate: float | None  # the run's embedding growth rate (None: its first norm never saturated)
    paper: tuple[float, float]  # paper-scale share at rate 1 and at the run's rate, the smaller first
    predicted: bool = False  # by the formula at the fastest growth Adam allows (a plan), not measured

    @property
    def far(self) -> bool:
        """The embedding's norm's measured bracket lies more than FAR× and FAR_ABS away from the paper-scale
        range (like with like: the formula is about that norm)."""
        lo, hi = self.paper
        m = self.first
        above = m.lo > FAR * hi and m.lo - hi > FAR_ABS
        below = not self.predicted and m.hi * FAR < lo and lo - m.hi > FAR_ABS  # a real run may grow slower
        return above or below

    def describe(self) -> str:
        lo, hi = self.paper
        paper = (
            f"{100 * lo:.2f} %" if math.isclose(lo, hi, rel_tol=0.05) else f"{100 * lo:.2f}–{100 * hi:.2f} %"
        )
        if self.predicted:
            return (
                f"the embedding's norm would stay saturated for ≥ {self.first.describe()} of training (the formula, "
                f"at the fastest growth Adam allows), at d = 2048 for {paper} (formula)"
            )
        return (
            f"the embedding's norm was saturated for {self.first.describe()} of training (mean over all norms: "
            f"{self.measured.describe()}), at d = 2048 for {paper} (formula)"
        )


def pooled(found: list[Emulation]) -> Emulation:
    """Several runs' (seeds') emulations as one: the union of their brackets and paper-scale ranges."""

    def union(shares: list[SaturatedShare]) -> SaturatedShare:
        return SaturatedShare(
            min(x.lo for x in shares),
            max(x.hi for x in shares),
            shares[0].total_steps,
            max(x.spacing for x in shares),
        )

    rates = [e.rate for e in found if e.rate is not None]
    return Emulation(
        union([e.measured for e in found]),
        union([e.first for e in found]),
        min(rates) if rates else None,
        (min(e.paper[0] for e in found), max(e.paper[1] for e in found)),
        predicted=all(e.predicted for e in found),
    )


def run_emulation(run: Run) -> Emulation | None:
    """``emulation`` of a run, from its norm-factor records (else its coarser analysis records). The config is the
    run's own (flat) one, so a planned run that has no folder yet is read the same way."""
    if run.planned:
        return predicted_emulation(run.cfg)
    records = run.norm_records or run.analysis
    return emulation(run.cfg, records) if records and run.cfg else None


def predicted_emulation(config: Config) -> Emulation:
    """What the formula says a run of ``config`` will show, before it runs: its embedding's norm recovers as fast as
    Adam allows (rate 1), the shortest saturation the emulation can have."""
    steps = config.train.steps
    share = min(1.0, steps_to_unsaturate(config, rate=1.0) / steps) if steps else 0.0
    least = SaturatedShare(share, share, steps, 0)
    g, eps = config.model.gamma, config.model.norm_eps
    paper = paper_scale_share(1.0, g, eps)
    return Emulation(least, least, 1.0, (paper, paper), predicted=True)


def emulation(config: Config, records: Sequence[AnalysisRecord | NormFactorRecord]) -> Emulation | None:
    """The run's saturation beside the paper scale's, or None where its norm factors were not measured at step 0."""
    shares = run_saturation(records, config.train.steps)
    if MEAN not in shares:
        return None
    # module order: the first block's input norm reads the embedding
    name = next(k for k in shares if k != MEAN)
    first = shares[name]
    left = norm_series(records)[name][-1][1] >= SATURATED  # it left saturation within the measured steps
    rate = growth_rate(config, first.mid * config.train.steps) if left and first.mid > 0 else None
    g, eps = config.model.gamma, config.model.norm_eps  # the ε a d = 2048 model of this arm would have
    at = sorted({paper_scale_share(1.0, g, eps), paper_scale_share(rate or 1.0, g, eps)})
    return Emulation(shares[MEAN], first, rate, (at[0], at[-1]))
