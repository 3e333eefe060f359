"""C5: the residual flow ‖h_L−e‖/‖e‖ scales as d^(1−γ); the loss is best at γ = 1 and worse above it.

Primary: the fitted exponent of the residual flow against width minus (1 − γ) at the γ nearest 1 (the
paper's setting, where the flow balances), within ±0.15 of the prediction 0. Secondary: the other γ, and
L(γ) − L(1) for every other γ with both fixes."""

from __future__ import annotations

from typing import Any

from smallinit.study.judging.claims.comparison import PRIMARY, SECONDARY, ClaimResult, Comparison, judged
from smallinit.study.judging.claims.loss import loss_comparison
from smallinit.study.judging.claims.registry import Claim, register
from smallinit.study.judging.claims.selection import FIXED, Runs, reference_lr, size_label
from smallinit.study.judging.power import MIN_TOKENS_PER_PARAM

FLOW_TOLERANCE = 0.15  # |fitted exponent − (1 − γ)| allowed for C5 (as in the analysis acceptance)


@judged
def claim_c5(
    runs: Runs, flow: dict[str, Any] | None, *, min_tpp: float = MIN_TOKENS_PER_PARAM
) -> ClaimResult:
    res = ClaimResult(
        "C5",
        "Residual flow ‖h_L−e‖/‖e‖ ≍ d^(1−γ); loss is best at γ = 1 and worse above it",
        "exponent 1−γ; best loss at γ = 1",
    )
    if flow:
        nearest = min(flow["gammas"], key=lambda g: abs(g - 1.0))
        for gamma, seed_slopes in zip(flow["gammas"], flow["seed_slopes"]):
            c = Comparison(
                f"flow exponent − (1−γ) at γ{gamma:g}",
                [s - (1 - gamma) for s in seed_slopes],
                f"0 ± {FLOW_TOLERANCE}",
                seeds=flow.get("seeds"),
                expected="zero",
                tolerance=FLOW_TOLERANCE,
                paper_value=0.0,
                role=PRIMARY if gamma == nearest else SECONDARY,
            )
            # a measured sweep: a seed without an exponent is counted, not dropped
            if not flow.get("planned"):
                c.count_no_value("flow exponent")
            res.comparisons.append(c)
        res.extra["residual_flow"] = flow
    else:
        res.comparisons.append(
            Comparison.missing("flow exponent", "residual-flow sweep not run", role=PRIMARY)
        )
    fixed = runs.where(FIXED)
    n_loss = len(res.comparisons)
    for n in fixed.values("size"):
        at = fixed.where(size=n)
        gammas = at.values("model.gamma")
        if len(gammas) < 3 or 1.0 not in gammas:
            continue
        ref = at.where({"model.gamma": 1.0})
        for g in gammas:
            if g != 1.0:
                res.comparisons.append(
                    loss_comparison(
                        f"L(γ{g:g})−L(γ1) @{size_label(n)}", at.where({"model.gamma": g}), ref, "> 0", min_tpp
                    )
                )
    if len(res.comparisons) == n_loss:
        res.comparisons.append(Comparison.missing("loss best at γ = 1", "needs ≥ 3 γ values with the fixes"))
    return res


register(
    Claim(
        "C5",
        lambda runs, measured, options: claim_c5(reference_lr(runs), measured.get("flow")),
        unit="flow exponent",
        needs=("flow",),
        seed_sd=(
            0.028,
            "the CPU study's sd over 5 seeds of the flow exponent − (1−γ) at γ1 (docs/findings-cpu.md)",
        ),
    )
)
