"""Q1, smallinit's question (not a claim of the paper): under Muon, with both fixes, γ = 1 still beats γ = 0.5,
each γ at its own best learning rate.

The paper trained with AdamW only. Under Muon (torch.optim.Muon on the hidden matrices, AdamW on the rest,
``train.optimizer = "muon"``) a matrix's update has a fixed RMS whatever its gradient's scale, so what a small
init buys may differ. The rates that suit Muon are not AdamW's, so each γ is compared at its own best rate.

Primary: L(γ.5) − L(γ1) of the Muon runs with both fixes at the smallest size, each γ at the rate the other seeds
chose, judged by C4's sign-flip test with the rates chosen again in every flip (c4.best_lr_comparison), its p
calibrated for one γ's runs noisier than the other's; it needs the best rate inside the grid (an outcome
precondition). It reads the Muon runs at the smallest weight decay of the design, so that Q2's long runs at a large
one, which share the recipe, are not taken for another learning rate.
"""

from __future__ import annotations

from smallinit.study.judging.claims.c4 import best_lr_comparison
from smallinit.study.judging.claims.comparison import PRIMARY, ClaimResult, Comparison, judged
from smallinit.study.judging.claims.registry import QUESTION, Claim, register
from smallinit.study.judging.claims.selection import FIXED, Runs
from smallinit.study.judging.power import MIN_TOKENS_PER_PARAM

MUON = {"train.optimizer": "muon"}


@judged
def question_q1(runs: Runs, *, min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
    res = ClaimResult(
        "Q1",
        "Under Muon, with both fixes, γ = 1 beats γ = 0.5, each γ at its own best learning rate",
        QUESTION,
        notes=[QUESTION],
    )
    muon = runs.where(MUON).where(FIXED)
    decays = muon.values("train.weight_decay")
    if decays:  # Q2's long runs at a large weight decay share the design: Q1 reads the others
        muon = muon.where({"train.weight_decay": decays[0]})
    for size in muon.values("size"):
        best = best_lr_comparison(muon, size, min_tpp, arm="fixed, Muon")
        if best is not None:
            res.comparisons.append(best[0])
            res.notes.append(best[1])
    if res.comparisons:
        res.comparisons[0].role = PRIMARY  # the smallest size
    else:
        res.comparisons.append(
            Comparison.missing(
                "L(γ.5)−L(γ1) fixed, Muon, each γ at its best lr",
                "needs Muon runs with both fixes at γ 0.5 and 1 and ≥ 2 learning rates",
                role=PRIMARY,
            )
        )
    return res


register(
    Claim(
        "Q1",
        lambda runs, measured, options: question_q1(runs),
        decided_by_the_runs="each γ's best learning rate under Muon inside the grid",
        question=True,
    )
)
