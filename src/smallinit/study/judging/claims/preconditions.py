"""The preconditions a comparison must meet to be judged, computed from the runs themselves: the
training regime of a loss comparison, ε's saturation (C2), an emulated ε saturated about as long as at the
paper's scale (C1, C2), a best learning rate inside its grid (C4), a formed sink (C3); C6's and C7's, which must
not select on the outcome they gate, sit with their claims (see c6.py, c7.py). A failed one gives "not
testable here" with the number. Their thresholds are in :mod:`smallinit.study.judging.power`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from smallinit.measures.norm_factor import SATURATED
from smallinit.measures.sink import SINK_RATIO, sink_threshold, uniform_sink
from smallinit.monitor.runs import Run
from smallinit.study.judging.claims.selection import Runs, sink_layers, sink_share
from smallinit.study.judging.emulation import pooled, run_emulation
from smallinit.study.judging.power import MIN_EVALS, SINK_SEQS, SINK_TOKENS


def regime_problem(runs: Iterable[Run], traj: dict[str, Any] | None, min_tpp: float) -> str:
    """Why a loss comparison of these runs is not a verdict yet ("" when it is): too few tokens per parameter, or
    too few evaluations to see the gap's trend. How the gap moves is reported beside the verdict (its trend), not
    used to withhold it: the verdict is the gap at the stated budget."""
    runs = list(runs)
    if not runs or traj is None:
        return "no paired evaluations"
    least = min(runs, key=lambda r: r.tokens_per_param())
    if least.tokens_per_param() < min_tpp:
        return (
            f"trained to {least.tokens_per_param():.2g} tokens per non-embedding parameter < {min_tpp:g} "
            f"({least.name})"
        )
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
    return (
        f"norm factor at init {factor:.2f} ≥ {SATURATED} ({how}) at {size}: ε cannot saturate (emulate it with "
        "model.norm_eps_width)"
    )


def emulation_problem(runs: Runs, size: str) -> tuple[str, str]:
    """(problem or "", note) for comparisons on the emulated-ε arm at one size: how long its runs' embedding norm
    stayed saturated (measured) beside a d = 2048 model's (formula); far apart, the arm does not stand for the
    paper's scale and is not judged."""
    found = [
        e for e in (run_emulation(r) for r in runs if r.config.get("model.norm_eps_width")) if e is not None
    ]
    if not found:
        return "", ""
    e = pooled(found)
    problem = f"{e.describe()}: the emulated ε does not stand for the paper's scale" if e.far else ""
    return problem, f"emulated ε, γ=1 @{size}: {e.describe()}"


def lr_bracket_problem(chosen: dict[float, dict[int, float]], grid: Iterable[float]) -> str:
    """Why a best-learning-rate comparison is not judged ("" when it can be): a rate chosen as best (per γ and seed)
    is the grid's smallest or largest, so the optimum may lie beyond it."""
    lrs = sorted(set(grid))
    for gamma, by_seed in sorted(chosen.items()):
        for seed, lr in sorted(by_seed.items()):
            if lr in (lrs[0], lrs[-1]):
                edge = "largest" if lr == lrs[-1] else "smallest"
                return (
                    f"the best lr for γ {gamma:g} (seed {seed}) is {lr:g}, the {edge} of the grid "
                    f"{', '.join(f'{x:g}' for x in lrs)}: the optimum is not bracketed (extend the lr grid)"
                )
    return ""


def sink_formed(runs: Runs) -> tuple[str, str]:
    """(problem or "", note) for C3's precondition on the no-gate γ = 1 runs."""
    measured = [m for m in (sink_layers(r) for r in runs) if m is not None]
    if not measured:
        return "no sink scores at the end of training (analysis.every was off)", ""
    seqs, tokens = min(m[1] for m in measured), min(m[2] for m in measured)
    per_layer = np.mean([m[0] for m in measured], axis=0)
    uniform = uniform_sink(tokens)
    shares = [s for s in map(sink_share, runs) if s]
    share = "".join(
        f", Sink_{eps} {np.mean([s[eps] for s in shares]):.2f}" for eps in (shares[0] if shares else {})
    )
    note = (
        f"sink per layer, no gate, γ=1 (mean of {len(measured)} runs, {seqs} × {tokens} tokens): "
        + ", ".join(f"{v:.3f}" for v in per_layer)
        + f"; uniform attention {uniform:.3f}{share}"
    )
    if seqs < SINK_SEQS or tokens < SINK_TOKENS:
        return (
            f"sink measured on {seqs} sequences of {tokens} tokens, needs ≥ {SINK_SEQS} of ≥ {SINK_TOKENS}",
            note,
        )
    # a plan's sink is unknown
    if not any(r.planned for r in runs) and per_layer.max() <= sink_threshold(tokens):
        return (
            f"no sink has formed: largest layer sink {per_layer.max():.3f} ≤ {SINK_RATIO:g} × {uniform:.3f} "
            "(uniform attention)"
        ), note
    return "", note
