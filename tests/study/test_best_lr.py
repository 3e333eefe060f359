"""C4's "each γ at its best lr": its printed level is its real level, by simulation with the claim's own functions.

The rates are chosen per seed on the other seeds' mean loss (no seed picks its own rate), and the verdict is a
sign-flip test over the seeds with the rates chosen again inside every flip, its p calibrated (p^β) for runs of one
γ noisier than the other's. The simulated studies (tests/support/best_lr.py) draw per seed and γ a loss at every
rate: a profile over the rates (a sharp, flat or plateau optimum), the seed's own offset and run-to-run noise that
may grow with the rate or differ between the γ. The old rule (a t-test of the same per-seed gaps) is run beside it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from smallinit.study.judging.claims.c4 import (
    BEST_LR_BETA,
    BEST_LR_SD,
    FEWEST_SEEDS,
    best_lr_power,
    flip_patterns,
    loo_gaps,
    raw_level,
    smallest_p,
)
from smallinit.study.judging.power import ALPHA, power_of_test, seeds_for_power
from smallinit.study.judging.verdicts import paired_t, region_p
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.plan import plan_recipe
from support.best_lr import FLAT, GRID, NOISE, RISING_SD, RUN_SD, SHAPES, SHARP, mean_and_p, sizes, studies

DRAWS = 4000


def _margin(rate: float, draws: int) -> float:
    """Three Monte Carlo standard errors of a rate estimated from ``draws`` studies."""
    return 3 * math.sqrt(rate * (1 - rate) / draws)


def _studies(rng, n, profile, run_sd, effect=0.0, profile_1=None, draws=DRAWS):
    return studies(rng, draws, n, profile, run_sd, effect=effect, profile_1=profile_1)


def _rates(losses: np.ndarray, max_flips: int) -> dict[str, float]:
    """Each way, how often the best-lr test (calibrated), its raw sign-flip p and the t-test of the same gaps (old)
    decide at α = 0.05."""
    n = losses.shape[1]
    mean, p = mean_and_p(losses, max_flips)
    m, se = paired_t(loo_gaps(losses))
    p_old, _ = region_p(m, se, n - 1)
    agree, disagree = sizes(mean, p, ALPHA, BEST_LR_BETA)
    raw_agree, raw_disagree = sizes(mean, p, ALPHA)
    return {
        "agree": agree,
        "disagree": disagree,
        "raw agree": raw_agree,
        "raw disagree": raw_disagree,
        "old agree": float(np.mean((p_old <= ALPHA) & (m > 0))),
        "old disagree": float(np.mean((p_old <= ALPHA) & (m < 0))),
    }


@pytest.mark.parametrize(
    "n,profile,run_sd",
    [(8, SHARP, RUN_SD), (8, FLAT, RUN_SD), (8, FLAT, RISING_SD), (16, FLAT, RUN_SD), (16, SHARP, RISING_SD)],
    ids=["8-sharp", "8-flat", "8-flat-rising-noise", "16-flat", "16-sharp-rising-noise"],
)
def test_the_best_lr_comparison_errs_at_its_nominal_rate_each_way(n, profile, run_sd):
    """No effect of γ (the same profile and noise for both): the raw sign-flip test agrees and disagrees each within
    ±1 point of α/2, exact as an exchangeable design makes it; the calibrated test, more rarely."""
    rates = _rates(_studies(np.random.default_rng(n), n, profile, run_sd), max_flips=256)
    print(f"\nbest lr, n={n}: {rates}")
    for way in ("agree", "disagree"):
        assert abs(rates[f"raw {way}"] - ALPHA / 2) <= 0.01, rates
        assert rates[way] <= rates[f"raw {way}"]


def test_the_old_t_test_of_the_same_gaps_errs_beyond_its_level():
    """The dependence the rates create: a t-test of the leave-one-out gaps errs more than α/2 each way with a
    flat optimum (the rule this replaced)."""
    rates = _rates(_studies(np.random.default_rng(3), 16, FLAT, RUN_SD), max_flips=64)
    print(f"\nold rule, 16 seeds, flat optimum: {rates}")
    assert rates["old agree"] > ALPHA / 2 + 0.01 and rates["old disagree"] > ALPHA / 2 + 0.01


HOLM_LEVELS = (ALPHA / 4, ALPHA / 2, ALPHA)  # Holm's levels for one of up to four secondaries, or a primary


def _unequal_noise(shape, ratio, noisier, n, draws, seed, max_flips=1024):
    """(mean gap, raw p) of ``draws`` null studies: both γ share the profile, γ index ``noisier`` has ``ratio`` × the
    other's run noise (1,024 sign patterns: every one at 10 seeds, drawn at 16, as valid a test as the claim's)."""
    rng = np.random.default_rng(seed)
    return mean_and_p(studies(rng, draws, n, SHAPES[shape], ratio=ratio, noisier=noisier), max_flips)


@pytest.mark.parametrize(
    "noisier,way", [(0, 0), (1, 1)], ids=["γ.5-noisier-errs-agree", "γ1-noisier-errs-disagree"]
)
def test_the_calibrated_test_holds_its_level_where_the_old_one_erred_most(noisier, way):
    """The grid's worst points for the raw sign-flip p (plateau optimum, σ ratio 3, 16 seeds): against the noisier
    γ it erred 6.6 % at α = 0.05 (nominal 2.5 %). With p^β it errs at most α'/2 each way at α and at Holm's
    smaller levels (3 Monte Carlo se); the raw p exceeds that at α."""
    draws = 3000
    mean, p = _unequal_noise("plateau", 3.0, noisier, 16, draws, seed=20 + noisier)
    raw = sizes(mean, p, ALPHA)
    print(f"\nplateau, σ ratio 3, γ index {noisier} noisier, 16 seeds: raw p {raw}")
    assert raw[way] > ALPHA / 2 + _margin(ALPHA / 2, draws)
    for level in HOLM_LEVELS:
        calibrated = sizes(mean, p, level, BEST_LR_BETA)
        print(f"  α' = {level:g}: calibrated {calibrated}")
        assert max(calibrated) <= level / 2 + _margin(level / 2, draws), (level, calibrated)


@pytest.mark.slow
@pytest.mark.parametrize("shape,ratio,noisier", [(s, r, g) for s in SHAPES for r, g in NOISE])
def test_the_calibrated_test_holds_its_level_over_the_whole_grid(shape, ratio, noisier):
    """Every point of the grid β was measured on (other draws than the measurement's): at 8, 10 and 16 seeds the
    calibrated test errs at most α'/2 each way (3 Monte Carlo se) at α and at Holm's smaller levels."""
    draws = 2000
    for n in sorted({point[3] for point in GRID}):
        mean, p = _unequal_noise(shape, ratio, noisier, n, draws, seed=100 + n)
        for level in HOLM_LEVELS:
            calibrated = sizes(mean, p, level, BEST_LR_BETA)
            print(
                f"\n{shape}, σ ratio {ratio:g}, γ[{noisier}] noisier, {n} seeds, α' {level:g}: {calibrated}"
            )
            assert max(calibrated) <= level / 2 + _margin(level / 2, draws), (n, level, calibrated)


@pytest.mark.parametrize("n", [10, 16])
def test_the_calibrated_tests_power_is_what_the_plan_prices(n):
    """γ = 1 better by 0.05 at every rate (equal noise, sharp optimum, the pilot's noise), the design effect of the
    demo: the calibrated test detects it as often as best_lr_power (the plan's) says, within 3 Monte Carlo se and
    0.03 for the t-test it stands on; the raw p's power, the price of the calibration, is printed beside it."""
    draws = 2000
    losses = studies(np.random.default_rng(n), draws, n, SHARP, RUN_SD, effect=0.05)
    mean, p = mean_and_p(losses, 1024)
    calibrated, raw = sizes(mean, p, ALPHA, BEST_LR_BETA)[0], sizes(mean, p, ALPHA)[0]
    planned = best_lr_power(0.05 / (RUN_SD * math.sqrt(2)), ALPHA, seeds=n)
    print(f"\npower at +0.05, {n} seeds: calibrated {calibrated:.3f} (plan {planned:.3f}), raw p {raw:.3f}")
    assert abs(calibrated - planned) <= _margin(planned, draws) + 0.03
    assert calibrated < raw


def test_a_sharp_optimum_against_a_flat_one_is_judged_at_the_rates_chosen():
    """Equal best losses, but γ = 1's flat optimum is mis-chosen often at a small cost and γ = 0.5's sharp one
    rarely: γ = 1 is then behind at the rates its seeds choose, and the test says so (disagree), never the
    reverse. What it tests is the gap at the rates chosen on the other seeds, which equals the gap at the best
    rates only where the choice is as good for both γ."""
    losses = _studies(np.random.default_rng(6), 16, SHARP, RUN_SD, profile_1=FLAT)
    rates = _rates(losses, max_flips=256)
    print(f"\nsharp γ.5 vs flat γ1, equal best losses, 16 seeds: {rates}")
    assert rates["agree"] <= ALPHA / 2 + 0.01 and rates["disagree"] > ALPHA / 2 + 0.01
    assert np.mean(loo_gaps(losses)) < 0


def test_too_few_seeds_cannot_decide():
    """3 seeds give 8 sign patterns: the raw p is never below 0.25, so the claim says so instead of printing a
    verdict; the fewest seeds that can decide are those whose smallest calibrated p reaches α."""
    assert smallest_p(3) == pytest.approx(0.25**BEST_LR_BETA)
    assert smallest_p(FEWEST_SEEDS) <= ALPHA < smallest_p(FEWEST_SEEDS - 1)
    assert flip_patterns(3).shape == (8, 3) and not flip_patterns(3)[0].any()
    assert flip_patterns(20, max_flips=100).shape == (100, 20)


def test_the_full_demos_best_lr_design_has_the_power_its_plan_states():
    """The full demo runs each γ at every rate on 10 seeds, and its plan prices that comparison at the sd of the gap
    it tests (at the rates chosen, 0.132 in the 2026-12-03 demo), not the one-rate pilot's 0.048 that sized it, and
    at the level its raw p is judged at (α^(1/β)): its MDE is then above 0.12 nats, and at the design's +0.05 it has
    under a fifth of the power and would need more seeds than it has, which the plan says. Simulated with the
    claim's own test where the gap at the rates chosen has that sd (an optimum sharp enough to be found at that
    noise), a gap of the stated MDE is detected 80 % of the time."""
    (c4,) = (c for c in plan_recipe("demo", "full", Hardware.make("cpu", 2)).claims if c.claim == "C4")
    ((label, best),) = c4.secondaries.items()
    assert "each γ at its best lr" in label and c4.seed_sd == pytest.approx(RUN_SD * math.sqrt(2), abs=1e-3)
    assert best["seeds"] == seeds_for_power(0.05, 0.048, ALPHA) == 10 and best["alpha"] == ALPHA
    assert best["seed_sd"] == BEST_LR_SD[0] and best["mde"] == pytest.approx(best["mde_sds"] * BEST_LR_SD[0])
    assert best["mde"] > 0.12 and best["design"]["power"] < 0.2
    need = seeds_for_power(0.05, BEST_LR_SD[0], raw_level(ALPHA))
    assert best["design"]["seeds_for_80"] == need > seeds_for_power(0.05, BEST_LR_SD[0], ALPHA) > 10
    found = 5 * SHARP  # steps of 0.5 nats: every seed's rate is the best one, at any of these noises
    sd = best["seed_sd"] / math.sqrt(2)
    losses = _studies(np.random.default_rng(7), best["seeds"], found, sd, best["mde"], draws=2000)
    rates = _rates(losses, max_flips=1024)  # every sign pattern of 10 seeds: p resolves α^(1/β)
    print(f"\nbest lr, {best['seeds']} seeds, the planned MDE {best['mde']:.4f}: power {rates['agree']:.3f}")
    assert abs(rates["agree"] - 0.8) <= 0.05


def test_a_best_lr_primary_is_priced_at_the_level_its_raw_p_is_judged_at():
    """Q1's primary is the best-lr test, judged at Holm's first step α/2 beside Q2: over 8 seeds its smallest
    calibrated p (0.047) cannot reach that (no power), so the recipe runs 10 (0.0195); its power and the seeds 80 %
    would need are the t-test's at the raw p's level, not at α/2."""
    (q1,) = (c for c in plan_recipe("muon", "cpu", Hardware.make("cpu", 2)).claims if c.claim == "Q1")
    assert q1.alpha == ALPHA / 2 and smallest_p(8) > q1.alpha >= smallest_p(q1.seeds) and q1.seeds == 10
    assert best_lr_power(0.05 / q1.seed_sd, q1.alpha, seeds=8) == 0.0
    had = power_of_test(0.05, q1.seed_sd, 10, raw_level(q1.alpha))
    assert q1.design["power"] == pytest.approx(had) and 0 < had
    assert had < power_of_test(0.05, q1.seed_sd, 10, q1.alpha)
    assert q1.design["seeds_for_80"] == seeds_for_power(0.05, q1.seed_sd, raw_level(q1.alpha), 0.8, 10_000)
    assert q1.design["seeds_for_80"] > seeds_for_power(0.05, q1.seed_sd, q1.alpha, 0.8, 10_000)
