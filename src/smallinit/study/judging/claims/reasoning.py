"""R: small init favours the reasoning (compositional) solution of the anchor task over memorising the mirror pair
(Zhang et al. 2024), from the anchor probe's scores per run folder (smallinit.study.judging.anchor)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from smallinit.study.judging.claims.comparison import PRIMARY, SECONDARY, ClaimResult, Comparison
from smallinit.study.judging.claims.registry import Claim, register
from smallinit.study.judging.claims.selection import Run, Runs, no_value, paired, size_label


def reasoning_claim(runs: Runs, scores: dict[Path, dict[str, Any]]) -> ClaimResult:
    """R from the anchor probe's scores per run folder: held-out reasoning and memorising, the largest γ against
    the smallest, seeds paired within one size (the smallest size is the primary)."""
    claim = ClaimResult(
        "R",
        "Small init favours the reasoning (compositional) solution over memorising the mirror pair",
        "Zhang et al. 2024: small γ → inferential, large init → symmetric",
    )

    def metric(key: str) -> Callable[[Run], float | None]:
        return lambda run: scores[run.path][key] if run.path in scores else None

    probed = Runs([r for r in runs if r.path in scores])
    sizes = probed.values("size")
    for size in sizes:  # seeds are paired within one size
        at = probed.where(size=size)
        gammas = at.values("model.gamma")
        if len(gammas) < 2:
            continue
        small, large = at.where({"model.gamma": gammas[-1]}), at.where({"model.gamma": gammas[0]})
        tag = f" @{size_label(size)}" if len(sizes) > 1 else ""
        claim.comparisons += [
            Comparison.by_seed(
                f"reasoning γ{gammas[-1]:g}−γ{gammas[0]:g}{tag}",
                paired(small, large, metric("heldout_reasoning")),
                role=SECONDARY if claim.comparisons else PRIMARY,  # primary: the smallest size
                no_value=no_value(small, large, metric("heldout_reasoning"), "held-out reasoning accuracy"),
            ),
            Comparison.by_seed(
                f"memorising γ{gammas[0]:g}−γ{gammas[-1]:g}{tag}",
                paired(large, small, metric("heldout_memorising")),
                no_value=no_value(large, small, metric("heldout_memorising"), "held-out memorising accuracy"),
            ),
        ]
    if not claim.comparisons:
        claim.comparisons.append(Comparison.missing("reasoning", "needs ≥ 2 γ at one size", role=PRIMARY))
    claim.judge()
    return claim


register(
    Claim(
        "R",
        lambda runs, measured, options: reasoning_claim(runs, measured.get("anchor") or {}),
        unit="accuracy",
        needs=("anchor",),
    )
)
