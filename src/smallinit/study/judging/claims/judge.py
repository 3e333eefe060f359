"""The paper's claims C1–C7 judged on one set of runs, and the contrasts C1 and C2 carry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from smallinit.study.judging.claims.comparison import SECONDARY, ClaimResult, judge_table
from smallinit.study.judging.claims.registry import judge
from smallinit.study.judging.claims.selection import Runs, baselines

PAPER = ("C1", "C2", "C3", "C4", "C5", "C6", "C7")  # the demo's table


def judge_all(
    runs: Runs,
    flow: dict[str, Any] | None = None,
    gaps: dict[int, dict[str, Any]] | None = None,
    *,
    n_boot: int = 1000,
) -> list[ClaimResult]:
    """C1–C7 on ``runs``; C5's exponent needs a residual-flow sweep (``flow``), C7 token comparisons (``gaps``).
    The primaries are judged together (Holm over the table)."""
    out = judge(PAPER, runs, {"flow": flow, "gaps": gaps}, {"n_boot": n_boot})
    judge_table(out)
    return out


def with_contrasts(claim: Callable[..., ClaimResult], runs: Runs) -> ClaimResult:
    """The claim on its first baseline (emulated saturation where present); the comparisons on another baseline
    (plain ε) join it as secondary, so each claim has one row and one primary."""
    (_, arm), *others = baselines(runs)
    res = claim(runs, baseline=arm)
    for suffix, other in others:
        extra = claim(runs, baseline=other, suffix=suffix)
        for c in extra.comparisons:
            c.label, c.role = f"{c.label}{suffix}", SECONDARY
        res.comparisons += extra.comparisons
        res.notes += [f"{note}{suffix}" for note in extra.notes]
    res.judge()
    return res
