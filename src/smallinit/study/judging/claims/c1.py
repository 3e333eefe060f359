"""C1: without the fixes γ = 1 beats γ = 0.5 at every size, but the gain shrinks with size.

Primary: L(γ.5) − L(γ1) on the baseline at the smallest size (the cheapest, so the one with the most seeds),
against the paper's +0.05 at 0.1B, its smallest size. Secondary: the other sizes and the shrink."""

from __future__ import annotations

from typing import Any

from smallinit.study.judging.claims.comparison import PRIMARY, ClaimResult, Comparison, judged
from smallinit.study.judging.claims.judge import with_contrasts
from smallinit.study.judging.claims.loss import loss_comparison
from smallinit.study.judging.claims.preconditions import emulation_problem
from smallinit.study.judging.claims.registry import Claim, planned, register
from smallinit.study.judging.claims.selection import Runs, baselines, reference_lr, size_label
from smallinit.study.judging.power import MIN_TOKENS_PER_PARAM

PAPER_GAIN = 0.05  # nats, at 0.1B: the paper's smallest model (0.003 at 1.5B)


@judged
def claim_c1(
    runs: Runs,
    *,
    baseline: dict[str, Any] | None = None,
    suffix: str = "",
    min_tpp: float = MIN_TOKENS_PER_PARAM,
) -> ClaimResult:
    res = ClaimResult(
        "C1" + suffix,
        "Without the fixes, γ = 1 beats γ = 0.5 at every size, but the gain shrinks with size",
        "gain ≈ 0.05 at 0.1B → ≈ 0.003 at 1.5B",
    )
    base = runs.where(baseline or baselines(runs)[0][1])
    gains: dict[tuple, Comparison] = {}
    for n in base.values("size"):
        c = loss_comparison(
            f"L(γ.5)−L(γ1) @{size_label(n)}",
            base.where({"model.gamma": 0.5, "size": n}),
            base.where({"model.gamma": 1.0, "size": n}),
            "≈ +0.05 (0.1B) … +0.003 (1.5B)",
            min_tpp,
            paper_value=PAPER_GAIN,
        )
        problem, note = emulation_problem(base.where({"model.gamma": 1.0, "size": n}), size_label(n))
        res.notes += [note] if note else []
        c.untestable = problem or c.untestable
        if c.samples or c.unknown or c.lost:  # unknown: a plan's seeds
            gains[n] = c
            res.comparisons.append(c)
    if len(gains) >= 2:
        lo, hi = min(gains), max(gains)
        shrink = Comparison.difference(
            f"gain shrink {size_label(lo)}→{size_label(hi)}", gains[lo], gains[hi], "≈ +0.047"
        )
        if not planned(base) and min(gains[lo].mean, gains[hi].mean) <= 0:  # a plan's gains are unknown
            shrink.untestable = (
                f"γ = 1 is not ahead at both ends ({gains[lo].mean:+.3f} at {size_label(lo)}, "
                f"{gains[hi].mean:+.3f} at {size_label(hi)}): there is no gain to shrink"
            )
        elif gains[lo].untestable or gains[hi].untestable:
            shrink.untestable = "the gain at the smallest or largest size is not testable: " + (
                gains[lo].untestable or gains[hi].untestable
            )
        res.comparisons.append(shrink)
    elif gains:
        res.comparisons.append(
            Comparison.missing("gain shrink with size", "needs ≥ 2 sizes of baseline runs")
        )
    if gains:
        gains[min(gains)].role = PRIMARY
    else:
        res.comparisons.append(
            Comparison.missing("L(γ.5)−L(γ1) without fixes", "no baseline runs at γ 0.5 and 1", role=PRIMARY)
        )
    return res


register(
    Claim(
        "C1",
        lambda runs, measured, options: with_contrasts(claim_c1, reference_lr(runs)),
        decided_by_the_runs="γ = 1 ahead at the smallest and the largest size (for the shrink)",
    )
)
