"""C2: ε = 1e-12 instead of 1e-5 lowers the loss at γ = 1 (RMSNorm saturation), hardly at γ = 0.5.

Primary: the ε-fix gain L(ε 1e-5) − L(ε 1e-12) at γ = 1 at the smallest size where ε saturates as at the paper's
scale (chosen by the norm factor at init and, on the emulated arm, by how long it stayed saturated; never by any
loss), against the paper's +0.038 at 1.5B. Secondary: the other sizes and
the difference from the gain at γ = 0.5."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from smallinit.measures.norm_factor import relative_factor
from smallinit.study.judging.claims.comparison import ClaimResult, Comparison, declare_primary, judged
from smallinit.study.judging.claims.judge import with_contrasts
from smallinit.study.judging.claims.loss import loss_comparison
from smallinit.study.judging.claims.preconditions import emulation_problem, saturation_problem
from smallinit.study.judging.claims.registry import Claim, planned, register
from smallinit.study.judging.claims.selection import (
    EMULATED_WIDTH,
    Runs,
    baselines,
    measured_factor_at_init,
    reference_lr,
    size_label,
)
from smallinit.study.judging.power import MIN_TOKENS_PER_PARAM

PAPER_GAIN = 0.038  # nats: ε 1e-5 → 1e-12 at γ = 1, 1.5B


@judged
def claim_c2(
    runs: Runs,
    *,
    baseline: dict[str, Any] | None = None,
    suffix: str = "",
    min_tpp: float = MIN_TOKENS_PER_PARAM,
) -> ClaimResult:
    res = ClaimResult(
        "C2" + suffix,
        "ε = 1e-12 instead of 1e-5 lowers the loss at γ = 1 (RMSNorm saturation), hardly at γ = 0.5",
        "−0.038 at γ=1, −0.001 at γ=0.5 (1.5B)",
    )
    fixed_eps = {"model.norm_eps": 1e-12, "model.gate": "none"}
    base, fixd = runs.where(baseline or baselines(runs)[0][1]), runs.where(fixed_eps)
    candidates: list[
        tuple[str, Comparison]
    ] = []  # (precondition problem, the γ = 1 gain) per size, smallest first
    for n in sorted(set(base.values("size")) & set(fixd.values("size"))):
        b1, f1 = base.where({"model.gamma": 1.0, "size": n}), fixd.where({"model.gamma": 1.0, "size": n})
        b05, f05 = base.where({"model.gamma": 0.5, "size": n}), fixd.where({"model.gamma": 0.5, "size": n})
        if not (len(b1) and len(f1) and len(b05) and len(f05)):
            continue
        analytic = float(np.mean([relative_factor(1.0, r.norm_eps, n[0]) for r in b1]))
        measured = [m for m in (measured_factor_at_init(r) for r in b1) if m is not None]
        m = float(np.mean(measured)) if measured else math.nan
        # the design measures the factor at init if the analysis runs at step 0; its value is the runs', so a
        # plan checks the formula's factor only (the measured one stands in for nothing here)
        if planned(b1):
            m = (
                analytic
                if all(any(rec.step == 0 for rec in (*r.analysis, *r.norm_records)) for r in b1)
                else math.nan
            )
        else:
            res.notes.append(
                f"γ=1 baseline norm factor at init @{size_label(n)}: analytic {analytic:.3f}, measured "
                f"{m:.3f} (target {relative_factor(1.0, 1e-5, EMULATED_WIDTH):.3f} at d=2048)"
            )
        # ε must saturate at init and, emulated, for about as long as at the paper's scale: a saturation that
        # lasts 20× longer is a stronger treatment than the paper's, so its gain is shown but not judged
        emulated, how_long = emulation_problem(b1, size_label(n))
        problem = saturation_problem(analytic, m, size_label(n)) or emulated
        res.notes += [how_long] if how_long else []
        fix1 = loss_comparison(
            f"ε-fix gain at γ1 @{size_label(n)}", b1, f1, "+0.038", min_tpp, paper_value=PAPER_GAIN
        )
        fix05 = loss_comparison(f"ε-fix gain at γ.5 @{size_label(n)}", b05, f05, "+0.001", min_tpp)
        diff = Comparison.difference(f"γ1 minus γ.5 ε-fix gain @{size_label(n)}", fix1, fix05, "+0.037")
        for c in (fix1, diff):  # this size's precondition: another size may saturate
            c.untestable = problem or c.untestable
        res.comparisons += [fix1, diff]
        candidates.append((problem, fix1))
    declare_primary(res, candidates, "ε-fix gain", "needs γ {0.5, 1} × ε {1e-5, 1e-12} without gate")
    return res


register(
    Claim(
        "C2",
        lambda runs, measured, options: with_contrasts(claim_c2, reference_lr(runs)),
        decided_by_the_runs="the measured RMSNorm factor at init < 0.5",
    )
)
