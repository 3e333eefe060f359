"""smallinit's own questions Q1 and Q2 (not claims of the paper): their error rates by simulation with the
questions' own functions, what their plan says of the shipped recipe, and that they are labelled as smallinit's
wherever they are shown.

Q1 is C4's best-lr sign-flip test on Muon runs, judged as a primary: at Holm's level beside Q2 rather than alone
at α. Q2 is an intersection-union test: the gap at t_eq (the step where Σηλ reaches 1) differs from 0 and its change
past t_eq differs from 0 on the same side. Which γ leads at t_eq is measured by the same seeds whose change is
judged, and g(t_eq)'s noise is inside the change, so a change signed by the seeds' own side there would read a
washout where nothing moved; the simulations below show the rule's false washouts stay at most α whatever the gap
and the correlation, and that the naive orientation's do not.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from smallinit.config import TrainConfig
from smallinit.study.judging.claims import CLAIMS, FIXED, QUESTION, Runs, judge_table
from smallinit.study.judging.claims.c4 import best_lr_test, calibrated_p, flip_patterns
from smallinit.study.judging.claims.q2 import question_q2, washout_change, washout_power, washout_test
from smallinit.study.judging.power import ALPHA, minimum_detectable_by
from smallinit.study.judging.verdicts import (
    AGREE,
    DISAGREE,
    INCONCLUSIVE,
    holm_reject,
    paired_t,
    region_p,
    verdict_table,
)
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.plan import plan_recipe
from smallinit.study.planning.printing import format_plan
from smallinit.train.optim import equilibrium_step
from support.verdicts import make_run

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


def _q2_test(gaps: np.ndarray, at: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(the washout test's p, +1 where the gap moved toward 0 and −1 away from it) per draw."""
    p, side, _, _ = washout_test(gaps, at)
    return np.where(side * washout_change(gaps, at).mean(-1) > 0, 1, -1), p


@pytest.mark.parametrize("n", [6, 10])
def test_q2_with_no_washout_agrees_as_often_as_it_disagrees(n):
    """A gap that stays where it was at t_eq, under noise that shrinks along training: a washout and a gap growing
    away from 0 are each read at most α/2 of the time (3 Monte-Carlo SE)."""
    toward, p = _q2_test(_q2_studies(np.random.default_rng(n), n))
    agree, disagree = np.mean((p <= ALPHA) & (toward > 0)), np.mean((p <= ALPHA) & (toward < 0))
    print(f"\nQ2 null, {n} seeds: agree {agree:.4f}, disagree {disagree:.4f}")
    for rate in (agree, disagree):
        assert rate <= ALPHA / 2 + _margin(ALPHA / 2)


SIMULATED = 20_000
SEEDS = 6  # the CPU design's AdamW seeds


def _two_points(
    rng: np.random.Generator, gap: float, change: float, rho: float, end_sd: float, n: int = SEEDS
) -> np.ndarray:
    """(studies, seeds, 2) gaps at t_eq and at the end, in seed sds of the gap at t_eq: a true gap ``gap`` at t_eq
    that moves by ``change`` toward the end, the end's noise ``end_sd`` times t_eq's and correlated ``rho`` with it
    within a seed."""
    e = rng.normal(0, 1, (SIMULATED, n, 2))
    at_eq = gap + e[..., 0]
    end = gap - change + end_sd * (rho * e[..., 0] + math.sqrt(1 - rho**2) * e[..., 1])
    return np.stack([at_eq, end], -1)


# (a) no gap and no change; (b) a constant gap of either sign, far beyond the test's reach; (c) gaps of either sign
# near its detection limit (6 seeds: the gap's t-test sees 1.4 sds at 80 %); each under (d) the end's noise as
# large as t_eq's or a third of it, correlated 0 to 0.9 with t_eq's within a seed
NULLS = [
    (g, rho, end)
    for g in (0.0, 3.0, -3.0, 0.5, -0.5, 1.0, -1.0, 1.5)
    for rho in (0.0, 0.5, 0.9)
    for end in (1.0, 0.3)
]


def _false_rates(rule, rng: np.random.Generator) -> list[tuple[float, float, float, float, float]]:
    """(gap, ρ, end sd, false washouts, false growths away from 0) of ``rule`` over the null scenarios: no change."""
    out = []
    for gap, rho, end in NULLS:
        toward, p = rule(_two_points(rng, gap, 0.0, rho, end))
        out.append(
            (gap, rho, end, np.mean((p <= ALPHA) & (toward > 0)), np.mean((p <= ALPHA) & (toward < 0)))
        )
    return out


def test_q2_reads_a_false_washout_at_most_alpha_whatever_the_gap_and_the_correlation():
    """The gap does not move past t_eq: the washout test reads a washout, and a gap growing away from 0, each at most
    α of the time (3 Monte-Carlo SE over 20,000 studies per scenario), with no gap, a constant gap of either sign, a
    gap near its detection limit, and t_eq's noise correlated 0–0.9 with the end's."""
    rates = _false_rates(lambda gaps: _q2_test(gaps, at=0), np.random.default_rng(47))
    for way, name in ((3, "washout"), (4, "growth away from 0")):
        gap, rho, end = max(rates, key=lambda r: r[way])[:3]
        print(
            f"\nworst false {name}: {max(r[way] for r in rates):.4f} at gap {gap:+.1f} sds, ρ {rho}, end sd {end}"
        )
    for gap, rho, end, washout, away in rates:
        assert washout <= ALPHA + _margin(ALPHA, SIMULATED), (gap, rho, end, washout)
        assert away <= ALPHA + _margin(ALPHA, SIMULATED), (gap, rho, end, away)


def _by_own_sign(gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The naive rule: the change signed by the side the same seeds' mean gap was on at t_eq, its one-sided t-test
    that it shrank toward 0 at α."""
    mean, se = paired_t(np.sign(gaps[..., 0].mean(-1, keepdims=True)) * washout_change(gaps, 0))
    p, _ = region_p(mean, se, gaps.shape[-2] - 1)
    return np.where(mean > 0, 1, -1), np.where(mean > 0, p / 2, 1.0)


def _by_each_seeds_sign(gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Naive per seed: each seed's change signed by its own gap at t_eq (a shrink of |gap|), two-sided t-test."""
    mean, se = paired_t(np.sign(gaps[..., 0]) * washout_change(gaps, 0))
    p, _ = region_p(mean, se, gaps.shape[-2] - 1)
    return np.where(mean > 0, 1, -1), p


@pytest.mark.parametrize("naive", [_by_own_sign, _by_each_seeds_sign])
def test_q2_orienting_the_change_by_the_same_seeds_reads_washouts_that_are_not_there(naive):
    """The rule the washout test replaces: signed by the side the judged seeds themselves were on at t_eq, a change
    that is not there reads as a washout more than α of the time in some null scenario (the test above would fail on
    it)."""
    rates = _false_rates(naive, np.random.default_rng(47))
    worst = max(rates, key=lambda r: r[3])
    print(
        f"\n{naive.__name__}: worst false washout {worst[3]:.4f} at gap {worst[0]:+.1f}, ρ {worst[1]}, end sd {worst[2]}"
    )
    assert worst[3] > ALPHA + _margin(ALPHA, SIMULATED)


@pytest.mark.parametrize("r", [0.0, 0.5, 0.9])
def test_q2_sees_a_washout_of_its_planned_mde_with_80_percent_power(r):
    """The shipped recipe's plan prices Q2's primary by :func:`washout_power` (a gap at t_eq gone by the end, the gap
    and its change each of the MDE in seed sds): simulated on the CPU design's seeds, at the plan's level, with the
    gap and its change correlated r ≥ 0 within a seed, the washout is read at least 80 % of the time (3 MC SE)."""
    (q2,) = (c for c in plan_recipe("muon", "cpu", Hardware.make("cpu", 2)).claims if c.claim == "Q2")
    assert q2.seeds == SEEDS
    rng = np.random.default_rng(int(10 * r))
    e = rng.normal(0, 1, (SIMULATED, q2.seeds, 2))
    at_eq = q2.mde_sds + e[..., 0]
    change = q2.mde_sds + r * e[..., 0] + math.sqrt(1 - r**2) * e[..., 1]
    toward, p = _q2_test(np.stack([at_eq, at_eq - change], -1), at=0)
    power = np.mean((p <= q2.alpha) & (toward > 0))
    print(
        f"\nQ2 at its MDE ({q2.mde_sds:.2f} sds, {q2.seeds} seeds, α {q2.alpha:g}, r {r}): power {power:.3f}"
    )
    assert power >= 0.8 - _margin(0.8, SIMULATED)


def test_the_two_questions_as_one_table_rarely_err():
    """Neither question has an effect: Holm over their two primaries (Q1 by its sign-flip test on 8 seeds, Q2 by
    its t-test on 6) gives any false decisive verdict at most α, and each question agrees and disagrees each at
    most α/2."""
    rng = np.random.default_rng(11)
    m1, p1 = _q1_null(rng)
    m2, p2 = _q2_test(_q2_studies(rng, 6))  # the direction of the move toward or away from 0, and p
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
    # Q1's calibrated sign-flip p can reach Holm's first step over the two (8 seeds could not: MDE infinite)
    assert all(math.isfinite(c.mde) for c in plan.claims if c.decides)
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


# The run folders' schedule: make_run's 4000 steps (40 tokens per parameter) evaluated every 500, at a constant
# η = 1e-2 and λ = 0.1, so Σηλ reaches 1 at step 1000 (t_eq, the third evaluation) with 75 % of training past it.
WASHOUT_TRAIN = {"optimizer": "adamw", "weight_decay": 0.1, "schedule": "constant", "warmup_steps": 0}


def _q2_runs(root, at_eq: list[float], at_end: list[float]):
    """AdamW runs with both fixes, γ {0.5, 1} × one seed per pair of gaps: γ = 1's loss falls along one curve; γ
    = 0.5's lies ``at_eq`` from it at t_eq (and before) and moves linearly to ``at_end`` by the end."""

    def base(f: float) -> float:
        return 3.0 + 2 * math.exp(-5 * f)

    runs = []
    for seed, (g0, g1) in enumerate(zip(at_eq, at_end)):

        def curve(f, g0=g0, g1=g1):
            return base(f) + g0 + (g1 - g0) * max(0.0, f - 0.25) / 0.75

        runs.append(
            make_run(root, gamma=1.0, seed=seed, arm=FIXED, final=0, curve=base, lr=1e-2, train=WASHOUT_TRAIN)
        )
        runs.append(
            make_run(
                root, gamma=0.5, seed=seed, arm=FIXED, final=0, curve=curve, lr=1e-2, train=WASHOUT_TRAIN
            )
        )
    return Runs(runs)


def test_q2_reads_a_washout_from_gamma_half_s_side_in_run_folders(tmp_path):
    """γ = 0.5 leads at t_eq (L(γ.5) − L(γ1) ≈ −0.1) and the gap closes to ≈ 0 by the end, as on the CPU runs: the
    primary reads a washout from γ = 0.5's side (signed by the side the gap was on, the change > 0), where a change
    signed for γ = 1's lead read it the wrong way round; the same gap moving away from 0 reads disagree."""
    closing = _q2_runs(
        tmp_path / "closing",
        [-0.10, -0.12, -0.09, -0.11, -0.13, -0.10],
        [0.004, -0.003, 0.002, -0.001, 0.003, -0.004],
    )
    res = question_q2(closing)
    c = res.primary
    assert c.label == "γ.5's lead (L(γ1)−L(γ.5)) at t_eq minus at the end, AdamW @d16×4"
    assert c.paper == "> 0: the gap at t_eq shrinks toward 0"
    assert res.verdict == AGREE, c.reason
    assert c.mean == pytest.approx(0.108, abs=0.002)
    assert "γ0.5 ahead by 0.108" in c.reason and "(toward 0)" in c.reason
    growing = _q2_runs(
        tmp_path / "growing",
        [-0.10, -0.12, -0.09, -0.11, -0.13, -0.10],
        [-0.30, -0.33, -0.31, -0.29, -0.35, -0.30],
    )
    res = question_q2(growing)
    assert res.verdict == DISAGREE and "(away from 0)" in res.primary.reason, res.primary.reason


def test_q2_with_no_gap_at_t_eq_says_there_was_none_to_wash_out(tmp_path):
    """A gap at t_eq that no test shows differs from 0 cannot wash out, however much the change moved: the test's p
    is the gap's, and the reason says so."""
    at_eq, at_end = [0.02, -0.03, 0.01, -0.02, 0.03, 0.01], [-0.20, -0.23, -0.21, -0.19, -0.22, -0.20]
    res = question_q2(_q2_runs(tmp_path, at_eq, at_end))
    assert res.verdict == INCONCLUSIVE
    p, _, p_gap, p_change = washout_test(np.array([at_eq, at_end]).T, 0)  # the gaps at t_eq and at the end
    assert (
        p_change < 1e-4 and p == p_gap
    )  # the change moved, the gap was not shown: the larger p is the gap's …
    assert res.primary_test().p == pytest.approx(
        p
    )  # … and it is the p Holm reads among the table's primaries
    assert "no gap at t_eq was established, so none to wash out" in res.primary.reason, res.primary.reason
    needs = minimum_detectable_by(
        lambda d: washout_power(d, ALPHA, seeds=6)
    )  # the test's own MDE, not a t-test's
    assert (
        res.primary.mde == pytest.approx(needs * res.primary.sd)
        and "intersection-union" in res.primary.magnitude
    )
