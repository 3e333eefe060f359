"""Q2, smallinit's question (not a claim of the paper): does the γ gap wash out once weight decay has driven the
weight norms to their steady state?

Decoupled weight decay multiplies each matrix by (1 − η_t·λ) every step, so once Σ η_t·λ reaches 1 (1/(ηλ) steps
at a constant rate η; ``train.optim.equilibrium_step`` follows the run's own schedule) the init's share of the
weights has shrunk by e, and every matrix's RMS heads to a steady state set by η and λ (∝ √(η/λ)) whatever γ drew
it. The line of work after the paper predicts from this that the γ effect fades over long training.

Primary: does the gap at the first evaluation at or after that step (t_eq) shrink toward 0 by the end? Which γ
leads at t_eq is itself measured, so the change past it cannot be oriented by the sign the same seeds show there:
g(t_eq)'s noise is inside the change g(t_eq) − g(T), and a change signed by it reads "shrank" where nothing moved
(regression to the mean). The rule is an intersection-union test of two two-sided t-tests over seeds (pairing γ 0.5
and 1 by seed): the gap at t_eq differs from 0, on side s, and the change differs from 0 on the same side (the gap
moved toward 0 from s): a washout, "agree"; the change on the other side (the gap grew away from 0): "disagree".
Its p is the larger of the two (so Holm over the table reads one p), and either way a false verdict happens at most
α of the time whatever the two tests' correlation (tests/study/test_questions.py simulates it). With no gap shown at
t_eq there is nothing to wash out, and the larger p, the gap's, says so. The comparison's per-seed values are the
change signed by s (the leading γ's lead at t_eq minus at the end), so its interval reads in the washout's
direction. The primary is the AdamW runs' (the paper's optimizer, for which the steady-state argument was made)
with both fixes at the smallest size; the Muon runs' is a secondary judged by the same test. Each reads the runs of
its optimizer at the largest weight decay (a design also holding runs at the default λ, as Q1's, keeps those out)
and their most common learning rate; beside it, the gap at t_eq and at the end.

Design preconditions: Σηλ reaches 1, at least half of training lies past t_eq, and at least 2 evaluations follow
it. Beside the gaps, each arm's median matrix RMS over √(η/λ) at t_eq and at the end (the Monitor's records) shows
whether the norms did reach a common steady state.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

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
from smallinit.study.judging.power import MIN_SEEDS, MIN_TOKENS_PER_PARAM
from smallinit.study.judging.verdicts import paired_t, region_p
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


def washout_test(gaps: np.ndarray, at: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The intersection-union test of a washout, over any leading axes of ``gaps`` (…, seeds, evaluations), t_eq at
    evaluation ``at``: (p, side, p_gap, p_change). ``side`` is the sign of the mean gap at t_eq; p_gap and
    p_change the two-sided t-tests over seeds of the gap at t_eq and of its change past t_eq; p = the larger.
    Rejected at α, the gap moved toward 0 (washed out) where the change's mean has the sign ``side``, else away
    from 0; each is false at most α of the time, since each needs both tests to reject (NaN: no spread)."""
    gaps = np.asarray(gaps, dtype=float)
    df = gaps.shape[-2] - 1
    at_eq, change = gaps[..., at], washout_change(gaps, at)
    p_gap, _ = region_p(*paired_t(at_eq), df)
    p_change, _ = region_p(*paired_t(change), df)
    return np.maximum(p_gap, p_change), np.sign(at_eq.mean(-1)), p_gap, p_change


def washout_power(effect_sds: float, alpha: float, *, seeds: int) -> float:
    """The probability that the washout test over ``seeds`` reads a washout of ``effect_sds`` seed sds, a gap at
    t_eq gone by the end (the gap and its change each that many sds): each t-test rejects on the true side with
    probability q, and both do with probability ≥ q² where the two are positively correlated, as the change carries
    the gap at t_eq's noise wherever the end's noise is no larger than t_eq's (tests/study/test_questions.py)."""
    if seeds < MIN_SEEDS:
        return 0.0
    df = seeds - 1
    return float(stats.nct.sf(stats.t.ppf(1 - alpha / 2, df), df, effect_sds * math.sqrt(seeds))) ** 2


TOWARD_0 = "> 0: the gap at t_eq shrinks toward 0"
WASHOUT_RULE = (
    "intersection-union test of the gap at t_eq and its change (each ≠ 0, on one side; "
    "power at a gap at t_eq gone by the end)"
)


def _lead(side: float) -> str:
    """The change signed by the side the gap was on at t_eq, in words: whose lead, as which difference."""
    if side < 0:
        return "γ.5's lead (L(γ1)−L(γ.5)) at t_eq minus at the end"
    if side > 0:
        return "γ1's lead (L(γ.5)−L(γ1)) at t_eq minus at the end"
    return "the lead at t_eq (L(γ.5)−L(γ1) signed by its side there) minus at the end"


def _washout_why(gaps: np.ndarray, at: int) -> tuple[float, str]:
    """The washout test's p on one study's (seeds, evaluations) gaps, and the test in words."""
    p, side, p_gap, p_change = (float(x) for x in washout_test(gaps, at))
    leader = "γ0.5" if side < 0 else "γ1"
    lead = abs(float(np.mean(gaps[:, at])))
    moved = "toward 0" if side * float(np.mean(washout_change(gaps, at))) > 0 else "away from 0"
    why = (
        f"intersection-union test, {gaps.shape[0] - 1} df: the gap at t_eq ≠ 0, p = {p_gap:.2g} ({leader} ahead by "
        f"{lead:.3g}), and its change past t_eq ≠ 0, p = {p_change:.2g} ({moved}); p = the larger"
    )
    if p_gap >= p_change:
        why += ", the gap's: where it is above the level no gap at t_eq was established, so none to wash out"
    return p, why


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
    """The change of the gap past t_eq signed by its side at t_eq (the primary's quantity, judged by
    :func:`washout_test`), the gap at t_eq and at the end, for one optimizer's runs with both fixes at their smallest
    size, largest weight decay and most common rate; and the notes."""
    sel = runs.where({"train.optimizer": optimizer}).where(FIXED)
    sizes = sel.values("size")
    if not sizes:
        return [], []
    sel = sel.where(size=sizes[0])
    sel = reference_lr(sel.where({"train.weight_decay": sel.values("train.weight_decay")[-1]}))
    tag = f"{OPTIMIZERS[optimizer]} @{size_label(sizes[0])}"
    g05, g1 = sel.where({"model.gamma": 0.5}), sel.where({"model.gamma": 1.0})
    label = f"{_lead(0.0)}, {tag}"
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
            label, lost_problem(lost) or problem or "no paired evaluations", TOWARD_0, lost=lost
        )
        return [c], notes
    gaps = np.asarray(traj["gaps"], dtype=float)
    side = float(np.sign(np.mean(gaps[:, at])))
    change = Comparison.by_seed(
        f"{_lead(side)}, {tag}",
        dict(zip(traj["seeds"], (np.nan_to_num(side, nan=1.0) * washout_change(gaps, at)).tolist())),
        TOWARD_0,
        lost=lost,
    )
    change.untestable = lost_problem(lost) or regime_problem([*g05, *g1], traj, min_tpp)
    change.power = functools.partial(washout_power, seeds=len(traj["seeds"]))
    change.power_why = WASHOUT_RULE
    if np.isfinite(gaps).all() and not change.untestable:
        change.resampled_p, change.resampled_why = _washout_why(gaps, at)
        if math.isnan(change.resampled_p):
            change.untestable = (
                "no spread over seeds of the gap at t_eq or of its change: nothing to judge them by"
            )
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
                _lead(0.0),
                "no runs at γ 0.5 and 1 with both fixes",
                TOWARD_0,
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
