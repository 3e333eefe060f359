"""The power API: the minimum detectable effect of the paired t-test and the seeds a study needs, checked
against simulation and against the normal approximation for many seeds."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from smallinit.study.judging.claims import CLAIMS
from smallinit.study.judging.power import ALPHA, minimum_detectable_effect, power_of_test, seeds_for_power

TABLE_ALPHA = ALPHA / len(CLAIMS)  # Holm's first step over every registered claim


def _simulated_power(effect: float, sd: float, n: int, alpha: float, draws: int = 20000) -> float:
    x = np.random.default_rng(0).normal(effect, sd, size=(draws, n))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
    return float(np.mean(np.abs(t) > stats.t.ppf(1 - alpha / 2, n - 1)))


def test_mde_has_the_stated_power_by_simulation():
    for n, alpha in ((3, 0.05), (6, TABLE_ALPHA), (12, TABLE_ALPHA)):
        mde = minimum_detectable_effect(0.04, n, alpha)
        assert abs(_simulated_power(mde, 0.04, n, alpha) - 0.8) < 0.015, (n, alpha, mde)


def test_mde_approaches_the_normal_formula_with_many_seeds():
    z = stats.norm.ppf(1 - 0.05 / 2) + stats.norm.ppf(0.8)
    assert math.isclose(minimum_detectable_effect(1.0, 400, 0.05), z / math.sqrt(400), rel_tol=0.01)
    assert minimum_detectable_effect(1.0, 3, 0.05) > 1.5 * z / math.sqrt(3)  # few seeds: t, not z


def test_seeds_for_power_is_the_fewest_that_reach_it():
    n = seeds_for_power(0.05, 0.07, TABLE_ALPHA)
    assert power_of_test(0.05, 0.07, n, TABLE_ALPHA) >= 0.8 > power_of_test(0.05, 0.07, n - 1, TABLE_ALPHA)
    assert (
        minimum_detectable_effect(0.07, n, TABLE_ALPHA)
        <= 0.05
        < minimum_detectable_effect(0.07, n - 1, TABLE_ALPHA)
    )
    assert seeds_for_power(1e-6, 1.0, TABLE_ALPHA, max_seeds=50) == 51
    assert minimum_detectable_effect(1.0, 1, TABLE_ALPHA) == math.inf
