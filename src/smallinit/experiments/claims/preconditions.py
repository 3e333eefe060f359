"""The preconditions a comparison must meet to be judged, computed from the runs themselves: the
training regime of a loss comparison, ε's saturation (C2), a formed sink (C3); C6's and C7's, which must not
select on the outcome they gate, sit with their claims (see c6.py, c7.py). A failed one gives "not testable
here" with the number. Their thresholds are in :mod:`smallinit.experiments.power`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..power import (
    MIN_EVALS,
    SATURATED,
    SINK_RATIO,
    SINK_SEQS,
    SINK_TOKENS,
    uniform_sink,
)
from ..runs import Run
from .selection import Runs, sink_layers


def regime_problem(runs: Iterable[Run], traj: dict[str, Any] | None, min_tpp: float) -> str:
    """Why a loss comparison of these runs is not a verdict yet ("" when it is): too few tokens per parameter, or
    too few evaluations to see the gap's trend. How the gap moves is reported beside the verdict (its trend), not
    used to withhold it: the verdict is the gap at the stated budget."""
    runs = list(runs)
    if not runs or traj is None:
        return "no paired evaluations"
    least = min(runs, key=lambda r: r.tokens_per_param())
    if least.tokens_per_param() < min_tpp:
        return (f"trained to {least.tokens_per_param():.2g} tokens per non-embedding parameter < {min_tpp:g} "
                f"({least.name})")
    if len(traj["steps"]) < MIN_EVALS:
        return f"evaluated at {len(traj['steps'])} points < {MIN_EVALS}: the gap's course is unknown"
    return ""


def saturation_problem(analytic: float, measured: float, size: str) -> str:
    """Why C2 cannot be tested at this size ("" if it can): ε must saturate RMSNorm at init, by the formula and as
    measured."""
    if not analytic < SATURATED:
        factor, how = analytic, "by the formula"
    elif not math.isfinite(measured):
        return f"the norm factor at init was not measured at {size} (the analysis callback is off: set analysis.every)"
    elif not measured < SATURATED:
        factor, how = measured, "as measured"
    else:
        return ""
    return (f"norm factor at init {factor:.2f} ≥ {SATURATED} ({how}) at {size}: ε cannot saturate (emulate it with "
            "model.norm_eps_width)")


def sink_formed(runs: Runs) -> tuple[str, str]:
    """(problem or "", note) for C3's precondition on the no-gate γ = 1 runs."""
    measured = [m for m in (sink_layers(r) for r in runs) if m is not None]
    if not measured:
        return "no sink scores at the end of training (analysis.every was off)", ""
    seqs, tokens = min(m[1] for m in measured), min(m[2] for m in measured)
    per_layer = np.mean([m[0] for m in measured], axis=0)
    uniform = uniform_sink(tokens)
    note = (f"sink per layer, no gate, γ=1 (mean of {len(measured)} runs, {seqs} × {tokens} tokens): "
            + ", ".join(f"{v:.3f}" for v in per_layer) + f"; uniform attention {uniform:.3f}")
    if seqs < SINK_SEQS or tokens < SINK_TOKENS:
        return f"sink measured on {seqs} sequences of {tokens} tokens, needs ≥ {SINK_SEQS} of ≥ {SINK_TOKENS}", note
    if per_layer.max() <= SINK_RATIO * uniform:
        return (f"no sink has formed: largest layer sink {per_layer.max():.3f} ≤ {SINK_RATIO:g} × {uniform:.3f} "
                "(uniform attention)"), note
    return "", note
