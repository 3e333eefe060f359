"""What a study needs before it runs: the power of the paired test, and the thresholds the claims'
preconditions apply (one source of truth: the claims import them from here).

The verdict of a claim is a two-sided paired t-test over seeds (:mod:`smallinit.study.judging.verdicts`). With
n seeds, seed spread sd and a true mean δ, the statistic is noncentral t with n − 1 degrees of freedom and
noncentrality δ√n/sd; the minimum detectable effect is the δ at which the test rejects with probability
``power``. Nothing here reads a run: a planner can size a study from a pilot's sd alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy import optimize, stats

ALPHA = 0.05  # the table-level error rate: Holm over the claims' primary estimates
POWER = 0.8
SD_BOUND = 0.8  # one-sided confidence of the seed sd's upper bound, for the MDE a study could be sure of

MIN_TOKENS_PER_PARAM = 20.0  # every loss comparison: tokens seen per non-embedding parameter
MIN_EVALS = 4  # evaluations along training, for the gap's trend
MIN_SEEDS = 2  # paired seeds, for a spread to judge against
SINK_SEQS, SINK_TOKENS = 16, 256  # C3: the sink is measured on at least this many sequences of this length
MAX_SIZE_RATIO = 10.0  # C4: an N_eff/N outside [1/10, 10] is an artefact of the fit, not an estimate
MIN_SIZES = 3  # C4: sizes for the effective-size fit
LATE_MINIMUM = 2 / 3  # C6: a stable-rank minimum after this fraction of training has nothing to rebound from


def power_of_test(effect: float, sd: float, n: int, alpha: float) -> float:
    """P(the two-sided paired t-test at level ``alpha`` rejects) with n seeds, true mean ``effect``."""
    if n < MIN_SEEDS:
        return 0.0
    df, nc = n - 1, abs(effect) * math.sqrt(n) / sd
    crit = stats.t.ppf(1 - alpha / 2, df)
    upper, lower = stats.nct.sf(crit, df, nc), stats.nct.cdf(-crit, df, nc)
    return float(upper + (lower if math.isfinite(lower) else 0.0))  # scipy gives NaN for a vanishing far tail


def minimum_detectable_effect(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """The smallest true mean the two-sided paired t-test over n seeds detects with probability ``power``
    (exact, with the noncentral t), in the units of ``sd``; infinite below 2 seeds."""
    if n < MIN_SEEDS or not math.isfinite(sd):
        return math.inf
    if sd == 0:
        return 0.0
    hi = sd
    while power_of_test(hi, sd, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda d: power_of_test(d, sd, n, alpha) - power, 0.0, hi, xtol=sd * 1e-6))


def minimum_detectable_by(power_of: Callable[[float], float], power: float = POWER) -> float:
    """The smallest effect, in seed sds, that a rule more than the paired t-test (a split of the seeds, a
    resampling test) detects with probability ``power``: ``power_of`` gives that probability at a true effect in
    seed sds. Infinite where no effect does (the rule cannot decide)."""
    hi = 1.0
    while power_of(hi) < power:
        if hi > 1e3:
            return math.inf
        hi *= 2
    return float(optimize.brentq(lambda d: power_of(d) - power, 0.0, hi, xtol=1e-6))


def seeds_for_power(
    effect: float, sd: float, alpha: float, power: float = POWER, max_seeds: int = 1000
) -> int:
    """The fewest seeds (≥ 2) whose paired t-test detects ``effect`` with probability ``power``; ``max_seeds``
    + 1 when even that many do not."""
    for n in range(MIN_SEEDS, max_seeds + 1):
        if power_of_test(effect, sd, n, alpha) >= power:
            return n
    return max_seeds + 1


def sd_upper_bound(sd: float, n: int, level: float = SD_BOUND) -> float:
    """The one-sided ``level`` upper confidence bound of a normal population's sd from the sample sd of n seeds:
    sd·√((n − 1)/χ²_{1−level}(n − 1)); the true sd is above it with probability 1 − level."""
    if n < MIN_SEEDS or not math.isfinite(sd):
        return math.inf
    return float(sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - level, n - 1)))


def mde_line(
    sd: float,
    n: int,
    alpha: float,
    what: str = "an effect of",
    power: Callable[..., float] | None = None,
    rule: str = "",
) -> tuple[float, float, str]:
    """(the MDE at the sample sd, the MDE at its upper bound, the words beside an inconclusive verdict). The sample
    sd of a few seeds is itself a guess (at 3 seeds the MDE at it is below the true MDE ~63 % of the time), so the
    line gives both: the bound's is below the true MDE only with probability 1 − SD_BOUND. ``power`` (true effect
    in seed sds, alpha=) → probability is the rule's where it is more than the paired t-test, ``rule`` its name."""
    if power is None:
        point = minimum_detectable_effect(sd, n, alpha, POWER)
        upper = minimum_detectable_effect(sd_upper_bound(sd, n), n, alpha, POWER)
    else:
        sds = minimum_detectable_by(lambda d: power(d, alpha=alpha))
        point, upper = sds * sd, sds * sd_upper_bound(sd, n)
    return (
        point,
        upper,
        (
            f"{what} {point:.3g} would be seen at {POWER:.0%} power{f' by the {rule}' if rule else ''} if the seed "
            f"sd is the measured {sd:.3g} (n = {n}), {upper:.3g} if it is as large as its {SD_BOUND:.0%} upper "
            f"bound {sd_upper_bound(sd, n):.3g}; smaller effects may have been missed"
        ),
    )
