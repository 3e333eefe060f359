"""Q2, smallinit's question (not a claim of the paper): does the γ gap wash out once weight decay has driven the
weight norms to their steady state?

Decoupled weight decay multiplies each matrix by (1 − η_t·λ) every step, so once Σ η_t·λ reaches 1 (1/(ηλ) steps
at a constant rate η; ``train.optim.equilibrium_step`` follows the run's own schedule) the init's share of the
weights has shrunk by e, and every matrix's RMS heads to a steady state set by η and λ (∝ √(η/λ)) whatever γ drew
it. The line of work after the paper predicts from this that the γ effect fades over long training.

Primary: per seed, how much the gap g = L(γ.5) − L(γ1) fell from the first evaluation at or after that step
(t_eq) to the end, g(t_eq) − g(T): > 0 when γ = 1's lead shrank. Judged by the rule every loss gap is (Student-t
over seeds, two-sided, Holm over the table). Read it with the gap at t_eq (a secondary): a gap washing out moves
toward 0, so a positive change of a positive gap; a change larger than the gap is a crossing. The primary is the
AdamW runs' (the paper's optimizer, for which the steady-state argument was made) with both fixes at the smallest
size; the Muon runs' is a secondary. Each reads the runs of its optimizer at the largest weight decay (a design
also holding runs at the default λ, as Q1's, keeps those out) and their most common learning rate.

Design preconditions: Σηλ reaches 1, at least half of training lies past t_eq, and at least 2 evaluations follow
it. Beside the gaps, each arm's median matrix RMS over √(η/λ) at t_eq and at the end (the Monitor's records) shows
whether the norms did reach a common steady state.
"""

from __future__ import annotations

import numpy as np

from smallinit.study.judging.claims.comparison import PRIMARY, ClaimResult, Comparison, judged
from smallinit.study.judging.claims.loss import gap_trajectory, loss_comparison
from smallinit.study.judging.claims.preconditions import regime_problem
from smallinit.study.judging.claims.registry import QUESTION, Claim, register
from smallinit.study.judging.claims.selection import (
    FIXED,
    Run,
    Runs,
    lost_problem,
    lost_seeds,
    reference_lr,
    size_label,
)
from smallinit.study.judging.power import MIN_TOKENS_PER_PARAM
from smallinit.train.optim import equilibrium_step

MIN_PAST = 0.5  # the share of training past t_eq a design needs: the gap's course there is what is judged
OPTIMIZERS = {"adamw": "AdamW", "muon": "Muon"}


def steady_step(run: Run) -> int | None:
    """The step by which Σ η_t·λ of the run's hidden matrices reaches 1 (Muon's rate under Muon), or None."""
    tc = run.cfg.train
    return equilibrium_step(tc, tc.muon_lr / tc.lr if tc.optimizer == "muon" and tc.muon_lr else 1.0)


def washout_change(gaps: np.ndarray, at: int) -> np.ndarray:
    """Per seed, the gap at evaluation ``at`` minus the gap at the last one (evaluations on the last axis)."""
    gaps = np.asarray(gaps, dtype=float)
    return gaps[..., at] - gaps[..., -1]


def _design_problem(run: Run, t_eq: int | None) -> str:
    tc = run.cfg.train
    if tc.weight_decay <= 0:
        return "no weight decay (train.weight_decay = 0): the norms have no steady state to reach"
    if t_eq is None:
        return (
            f"Σηλ stays below 1 over the {tc.steps} steps: the norms are not driven to their steady state "
            "(raise train.weight_decay or train.lr, or train longer)"
        )
    past = 1 - t_eq / tc.steps
    if past < MIN_PAST:
        return f"{past:.0%} of training lies past t_eq = step {t_eq} (Σηλ = 1): needs ≥ {MIN_PAST:.0%}"
    return ""


def _rms_note(arms: dict[float, Runs], t_eq: int, tag: str) -> str:
    """Each γ's median (over seeds and recorded matrices) RMS / √(η/λ) at the analysis nearest t_eq and at the last."""
    parts = []
    for gamma, sel in arms.items():
        at_eq, at_end, steps = [], [], ()
        for r in sel:
            recs = [a for a in r.analysis if a.by_matrix("rms_ratio")]
            if not recs:
                continue
            near = min(recs, key=lambda a: abs(a.step - t_eq))
            at_eq.append(float(np.median(list(near.by_matrix("rms_ratio").values()))))
            at_end.append(float(np.median(list(recs[-1].by_matrix("rms_ratio").values()))))
            steps = (near.step, recs[-1].step)
        if at_eq:
            parts.append(
                f"γ{gamma:g} {np.median(at_eq):.3g} at step {steps[0]} → {np.median(at_end):.3g} at {steps[1]}"
            )
    if not parts:
        return f"{tag}: no matrix RMS recorded (analysis.every = 0): whether the norms reached a steady state is not shown"
    return f"{tag}: median matrix RMS / √(η/λ): " + "; ".join(parts)


def washout(runs: Runs, optimizer: str, min_tpp: float) -> tuple[list[Comparison], list[str]]:
    """The change of the gap past t_eq (the primary's quantity), the gap at t_eq and at the end, for one optimizer's
    runs with both fixes at their smallest size, largest weight decay and most common rate; and the notes."""
    sel = runs.where({"train.optimizer": optimizer}).where(FIXED)
    sizes = sel.values("size")
    if not sizes:
        return [], []
    sel = sel.where(size=sizes[0])
    sel = reference_lr(sel.where({"train.weight_decay": sel.values("train.weight_decay")[-1]}))
    tag = f"{OPTIMIZERS[optimizer]} @{size_label(sizes[0])}"
    g05, g1 = sel.where({"model.gamma": 0.5}), sel.where({"model.gamma": 1.0})
    label = f"L(γ.5)−L(γ1) at t_eq minus at the end, {tag}"
    first = next(iter([*g05, *g1, *g05.lost, *g1.lost]), None)
    if first is None or not len(g05) or not len(g1):
        return [
            Comparison.missing(label, f"no {OPTIMIZERS[optimizer]} runs at γ 0.5 and 1 with both fixes")
        ], []
    t_eq = steady_step(first)
    problem = _design_problem(first, t_eq)
    traj = gap_trajectory(g05, g1)
    lost = lost_seeds(g05, g1)
    steps = traj["steps"] if traj else []
    at = next((i for i, s in enumerate(steps) if t_eq is not None and s >= t_eq), None)
    if not problem and (at is None or at > len(steps) - 3):
        problem = f"fewer than 2 evaluations after t_eq = step {t_eq}: the gap's course past it is not seen"
    tc = first.cfg.train
    notes = [
        f"{tag}: η = {tc.muon_lr or tc.lr if optimizer == 'muon' else tc.lr:g}, λ = {tc.weight_decay:g}: Σηλ "
        + (
            f"reaches 1 at step {t_eq} of {tc.steps} ({1 - t_eq / tc.steps:.0%} of training past it)"
            if t_eq is not None
            else "stays below 1"
        )
    ]
    if problem or traj is None or at is None:
        c = Comparison.missing(
            label, lost_problem(lost) or problem or "no paired evaluations", "> 0", lost=lost
        )
        return [c], notes
    gaps = np.asarray(traj["gaps"], dtype=float)
    change = Comparison.by_seed(
        label,
        dict(zip(traj["seeds"], washout_change(gaps, at).tolist())),
        "> 0: γ = 1's lead shrinks",
        lost=lost,
    )
    change.untestable = lost_problem(lost) or regime_problem([*g05, *g1], traj, min_tpp)
    at_eq = Comparison.by_seed(
        f"L(γ.5)−L(γ1) at t_eq (step {steps[at]}), {tag}",
        dict(zip(traj["seeds"], gaps[:, at].tolist())),
        "",
        lost=lost,
    )
    at_eq.untestable = change.untestable
    final = loss_comparison(f"L(γ.5)−L(γ1) at the end, {tag}", g05, g1, "", min_tpp)
    if not first.planned:
        notes.append(_rms_note({0.5: g05, 1.0: g1}, steps[at], tag))
    return [change, at_eq, final], notes


@judged
def question_q2(runs: Runs, *, min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
    res = ClaimResult(
        "Q2",
        "The γ gap washes out once weight decay has driven the weight norms to their steady state (Σηλ ≥ 1)",
        QUESTION,
        notes=[QUESTION],
    )
    for optimizer in OPTIMIZERS:
        comparisons, notes = washout(runs, optimizer, min_tpp)
        res.comparisons += comparisons
        res.notes += notes
    if res.comparisons:
        res.comparisons[0].role = PRIMARY  # AdamW's where the design has AdamW runs
    else:
        res.comparisons.append(
            Comparison.missing(
                "L(γ.5)−L(γ1) at t_eq minus at the end",
                "no runs at γ 0.5 and 1 with both fixes",
                role=PRIMARY,
            )
        )
    return res


register(
    Claim(
        "Q2",
        lambda runs, measured, options: question_q2(runs),
        question=True,
    )
)
