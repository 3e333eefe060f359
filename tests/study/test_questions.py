"""smallinit's own questions Q1 and Q2 (not claims of the paper): their error rates by simulation with the
questions' own functions, what their plan says of the shipped recipe, and that they are labelled as smallinit's
wherever they are shown.

Q1 is C4's best-lr sign-flip test on Muon runs, judged as a primary: at Holm's level beside Q2 rather than alone
at α. Q2 is a paired t-test of the change of the loss gap past the step where Σηλ reaches 1; the gap's noise
shrinks along training and a seed's gap carries its own offset, which the change must not turn into a verdict.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from smallinit.config import TrainConfig
from smallinit.study.judging.claims import CLAIMS, QUESTION, judge_table
from smallinit.study.judging.claims.c4 import best_lr_test, calibrated_p, flip_patterns
from smallinit.study.judging.claims.q2 import washout_change
from smallinit.study.judging.power import ALPHA
from smallinit.study.judging.verdicts import holm_reject, paired_t, region_p, verdict_table
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.plan import plan_recipe
from smallinit.study.planning.printing import format_plan
from smallinit.train.optim import equilibrium_step

DRAWS = 4000
CHUNK = 250
PROFILE = np.array([0.1, 0.0, 0.1])  # nats above the optimum at the recipe's 3 rates
RUN_SD = 0.034


def _margin(p: float, n: int = DRAWS) -> float:
    return 3 * math.sqrt(p * (1 - p) / n)


def _q1_null(rng: np.random.Generator, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(mean gap, calibrated p) of Q1's test on studies where γ does nothing under Muon: (draws,) each."""
    offset = rng.normal(0, 0.05, (DRAWS, n, 1, 1))
    losses = 3.0 + offset + PROFILE + rng.normal(0, RUN_SD, (DRAWS, n, 2, len(PROFILE)))
    flips = flip_patterns(n)
    mean, p = np.concatenate(
        [np.stack(best_lr_test(losses[i : i + CHUNK], flips), -1) for i in range(0, DRAWS, CHUNK)]
    ).T
    return mean, calibrated_p(p)


def _q2_studies(rng: np.random.Generator, n: int, washout: float = 0.0) -> np.ndarray:
    """(draws, seeds, evaluations) gaps L(γ.5) − L(γ1) at 12 evaluations, t_eq at the third: a true gap of 0.05
    until t_eq that falls by ``washout`` at the end, a seed offset shared by every evaluation, and evaluation noise
    that shrinks along training and is correlated between neighbouring evaluations."""
    evals = 12
    shrink = np.linspace(0.03, 0.01, evals)
    noise = np.zeros((DRAWS, n, evals))
    e = rng.normal(0, 1, (DRAWS, n, evals))
    for k in range(evals):  # AR(1), ρ = 0.6
        noise[..., k] = e[..., k] if k == 0 else 0.6 * noise[..., k - 1] + 0.8 * e[..., k]
    course = 0.05 - washout * np.clip((np.arange(evals) - 2) / (evals - 3), 0, 1)
    return course + rng.normal(0, 0.04, (DRAWS, n, 1)) + noise * shrink


def _q2_test(gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    change = washout_change(gaps, 2)
    mean, se = paired_t(change)
    p, _ = region_p(mean, se, change.shape[-1] - 1)
    return mean, p


@pytest.mark.parametrize("n", [6, 10])
def test_q2_with_no_washout_agrees_as_often_as_it_disagrees(n):
    """A gap that stays where it was at t_eq, under noise that shrinks along training: the change past t_eq is
    agree and disagree each at most α/2 (3 Monte-Carlo SE)."""
    mean, p = _q2_test(_q2_studies(np.random.default_rng(n), n))
    agree, disagree = np.mean((p <= ALPHA) & (mean > 0)), np.mean((p <= ALPHA) & (mean < 0))
    print(f"\nQ2 null, {n} seeds: agree {agree:.4f}, disagree {disagree:.4f}")
    for rate in (agree, disagree):
        assert rate <= ALPHA / 2 + _margin(ALPHA / 2)


def test_q2_sees_a_washout_of_its_planned_mde_with_80_percent_power():
    """The shipped recipe's plan states Q2's MDE in seed sds of the change; a washout of that many sds of the
    simulated change is detected at the plan's level about 80 % of the time."""
    (q2,) = (c for c in plan_recipe("muon", "cpu", Hardware.make("cpu", 2)).claims if c.claim == "Q2")
    rng = np.random.default_rng(7)
    sd = washout_change(_q2_studies(rng, q2.seeds), 2).std(-1, ddof=1).mean()  # the change's own seed sd
    mean, p = _q2_test(_q2_studies(rng, q2.seeds, washout=q2.mde_sds * sd))
    power = np.mean((p <= q2.alpha) & (mean > 0))
    print(f"\nQ2 at its MDE ({q2.mde_sds:.2f} sds, {q2.seeds} seeds, α {q2.alpha:g}): power {power:.3f}")
    assert abs(power - 0.8) <= 0.05


def test_the_two_questions_as_one_table_rarely_err():
    """Neither question has an effect: Holm over their two primaries (Q1 by its sign-flip test on 8 seeds, Q2 by
    its t-test on 6) gives any false decisive verdict at most α, and each question agrees and disagrees each at
    most α/2."""
    rng = np.random.default_rng(11)
    m1, p1 = _q1_null(rng)
    m2, p2 = _q2_test(_q2_studies(rng, 6))
    rejected = holm_reject(np.stack([p1, p2], -1), ALPHA)
    print(f"\nQ1+Q2 null: any false verdict {rejected.any(-1).mean():.4f}")
    assert rejected.any(-1).mean() <= ALPHA + _margin(ALPHA)
    for mean, rej in ((m1, rejected[:, 0]), (m2, rejected[:, 1])):
        for way in (mean > 0, mean < 0):
            assert np.mean(rej & way) <= ALPHA / 2 + _margin(ALPHA / 2)


def test_a_primary_judged_by_a_resampling_test_takes_its_p_and_holms_level():
    """Q1's primary is decided by its sign-flip p, not by the t-test of the same gaps: a p the t-test would reject
    is inconclusive where the sign-flip test cannot reach the level (6 seeds: p ≥ 2/64 > α/2)."""
    from smallinit.study.judging.claims.comparison import PRIMARY, ClaimResult, Comparison

    def claim(key: str, p: float | None) -> ClaimResult:
        c = Comparison.by_seed("gap", {s: 0.1 + 0.001 * s for s in range(6)}, "> 0", role=PRIMARY)
        c.resampled_p, c.resampled_why = p, "sign-flip test"
        return ClaimResult(key, "", QUESTION, [c])

    q1, other = claim("Q1", 2 / 64), claim("Q2", None)
    judge_table([q1, other])
    assert other.verdict == "agree" and q1.alpha == ALPHA and "sign-flip test" in q1.primary.reason
    q1, other = claim("Q1", 2 / 64), claim("Q2", 0.5)
    judge_table([q1, other])  # Holm's first step is α/2 = 0.025 < 2/64
    assert q1.verdict == "inconclusive" and q1.alpha == ALPHA / 2


def test_sigma_eta_lambda_reaches_1_where_the_schedule_says():
    """At a constant rate Σηλ reaches 1 after ⌈1/(ηλ)⌉ steps; the recipe's cosine schedule (η 1e-2, λ 2, 10
    warmup steps of 200) at step 57; never when training ends first or λ = 0."""
    const = TrainConfig(steps=1000, warmup_steps=0, schedule="constant", lr=0.01, weight_decay=0.5)
    assert equilibrium_step(const) == 200 and equilibrium_step(const, lr_scale=2.0) == 100
    cosine = TrainConfig(steps=200, warmup_steps=10, lr=0.01, weight_decay=2.0)
    assert equilibrium_step(cosine) == 57
    assert equilibrium_step(dataclasses.replace(cosine, weight_decay=0.1)) is None
    assert equilibrium_step(dataclasses.replace(cosine, weight_decay=0.0)) is None


def test_the_recipes_plan_decides_both_and_labels_them_as_smallinits(tmp_path):
    """`smallinit plan muon --scale cpu` decides both questions, names each as smallinit's question, and says where
    Σηλ reaches 1; a design whose λ is too small for its length cannot decide Q2 and says why."""
    plan = plan_recipe("muon", "cpu", Hardware.make("cpu", 2))
    assert [c.claim for c in plan.claims if c.decides] == ["Q1", "Q2"]
    text = format_plan(plan)
    assert text.count(f"({QUESTION})") == 2
    assert all(CLAIMS[k].question and QUESTION in CLAIMS[k].label for k in ("Q1", "Q2"))
    assert not any(CLAIMS[k].question for k in ("C1", "C4", "R"))
    small = plan_recipe("muon", "cpu", Hardware.make("cpu", 2), overrides=["train.weight_decay=0.1"])
    (q2,) = (c for c in small.claims if c.claim == "Q2")
    assert not q2.decides
    assert any("Σηλ stays below 1 over the 200 steps" in why for why in q2.failing.values())


def test_the_verdict_table_labels_a_question_as_smallinits():
    from smallinit.study.judging.claims.comparison import PRIMARY, ClaimResult, Comparison

    c = Comparison.by_seed("gap", {s: 0.01 * s for s in range(4)}, "> 0", role=PRIMARY)
    res = ClaimResult("Q2", "the γ gap washes out", QUESTION, [c], notes=[QUESTION])
    judge_table([res])
    assert f"({QUESTION})" in verdict_table([res.to_dict()])
