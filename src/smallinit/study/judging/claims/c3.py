"""C3: small init raises the attention sink; the gate removes it and lowers the loss at γ = 1, hardly at γ = 0.5.

Primary: the gate's gain L(no gate) − L(gate) at γ = 1, ε = 1e-12, at the smallest size where a sink formed
(chosen by the no-gate sink, not by any loss), against the paper's +0.047 at 1.5B. Secondary: the other sizes,
the difference from γ = 0.5's gain, and the sink comparisons."""

from __future__ import annotations

from smallinit.study.judging.claims.comparison import ClaimResult, Comparison, declare_primary, judged
from smallinit.study.judging.claims.loss import loss_comparison
from smallinit.study.judging.claims.preconditions import sink_formed
from smallinit.study.judging.claims.registry import Claim, register
from smallinit.study.judging.claims.selection import (
    Runs,
    lost_problem,
    lost_seeds,
    no_value,
    paired,
    reference_lr,
    sink_mean,
    size_label,
)
from smallinit.study.judging.power import MIN_TOKENS_PER_PARAM

PAPER_GAIN = 0.047  # nats: the gate at γ = 1, ε = 1e-12, 1.5B


@judged
def claim_c3(runs: Runs, *, min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
    res = ClaimResult(
        "C3",
        "Small init raises the attention sink; the gate removes it and lowers the loss at γ = 1, "
        "hardly at γ = 0.5",
        "sink +0.11/layer; gate −0.047 at γ=1, −0.004 at γ=0.5 (1.5B, ε=1e-12)",
    )
    sel = runs.where({"model.norm_eps": 1e-12})
    candidates: list[tuple[str, Comparison]] = []  # (precondition problem, the γ = 1 gate gain) per size
    for n in sel.values("size"):
        at = sel.where(size=n)
        cells = {
            (g, gate): at.where({"model.gamma": g, "model.gate": gate})
            for g in (0.5, 1.0)
            for gate in ("none", "elementwise")
        }
        if not all(len(c) for c in cells.values()):
            continue
        gate1 = loss_comparison(
            f"gate gain at γ1 @{size_label(n)}",
            cells[1.0, "none"],
            cells[1.0, "elementwise"],
            "+0.047",
            min_tpp,
            paper_value=PAPER_GAIN,
        )
        gate05 = loss_comparison(
            f"gate gain at γ.5 @{size_label(n)}",
            cells[0.5, "none"],
            cells[0.5, "elementwise"],
            "+0.004",
            min_tpp,
        )
        at_size = [
            gate1,
            Comparison.difference(f"γ1 minus γ.5 gate gain @{size_label(n)}", gate1, gate05, "+0.043"),
        ]
        problem, note = sink_formed(cells[1.0, "none"])
        if note:
            res.notes.append(f"@{size_label(n)}: {note}")
        for label, a, b, paper in (
            (f"sink γ1−γ.5 (no gate) @{size_label(n)}", cells[1.0, "none"], cells[0.5, "none"], "+0.11"),
            (
                f"sink no gate − gate at γ1 (Fig. 1g) @{size_label(n)}",
                cells[1.0, "none"],
                cells[1.0, "elementwise"],
                "> 0",
            ),
        ):
            lost = lost_seeds(
                a, b
            )  # counted, not dropped (selection.lost_problem), as is a seed without a sink
            at_size.append(
                Comparison.by_seed(
                    label,
                    paired(a, b, sink_mean),
                    paper,
                    lost=lost,
                    untestable=lost_problem(lost),
                    no_value=no_value(a, b, sink_mean, "final sink score"),
                )
            )
        for c in at_size:  # this size's precondition (the gate's gain is the paper's cure for the sink)
            c.untestable = problem or c.untestable
        res.comparisons += at_size
        candidates.append((problem, gate1))
    declare_primary(res, candidates, "gate gain", "needs γ {0.5, 1} × gate {none, elementwise} at ε 1e-12")
    return res


register(
    Claim(
        "C3",
        lambda runs, measured, options: claim_c3(reference_lr(runs)),
        decided_by_the_runs="a sink formed (some layer > 3× uniform attention)",
    )
)
