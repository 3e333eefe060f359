"""Verdicts: does a measured difference agree with the paper's claim, given the spread over seeds?

One rule for every claim, so recipes and the report judge alike. A comparison is a set of per-seed
differences (paired runs: same seed, one setting changed), signed so that positive is the paper's
direction. With n seeds, mean m and standard error se = sd/√n, the statistic (m − μ0)/se is Student-t
with n − 1 degrees of freedom:

* expected ``"positive"`` (a direction): the two-sided p-value of H0: μ = 0. The 95 % interval is
  m ± t(0.975, n − 1)·se. A rejected H0 gives **agree** when m > 0 and **disagree** when m < 0.
* expected ``"zero"`` with a ``tolerance`` (a measured exponent against a prediction): two tests.
  Equivalence (TOST, H0: |μ| ≥ tol) rejected → **agree**; H0: |μ| ≤ tol rejected (one-sided on the side
  of m, doubled for the two sides) → **disagree**. The comparison carries the smaller of the two p-values
  and the outcome it would give.
* the comparisons of one claim form a family: Holm–Bonferroni at α = 0.05 decides which are rejected
  (sort the k p-values; reject while p_(i) ≤ α/(k − i + 1)). Without it a claim with 6 comparisons and no
  real effect anywhere would "disagree" about a quarter of the time. A comparison judged by an interval
  from elsewhere (a bootstrap) is computed at the Bonferroni level 1 − α/k instead.
* not rejected → **inconclusive**: the seeds do not separate the difference from the null.
* **not testable here**: a precondition of the test failed (fewer than 2 seeds, a run trained too
  briefly, a mechanism that cannot act at this width); it says which, with the number. Such a comparison
  gets no p-value and never counts as agree or disagree.

A claim disagrees when any of its comparisons disagrees, agrees when all agree, is not testable here when
none is testable, and is inconclusive otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

AGREE, DISAGREE, INCONCLUSIVE, NOT_TESTABLE = "agree", "disagree", "inconclusive", "not testable here"
EXPECTED = ("positive", "zero")
ALPHA = 0.05  # family-wise error rate within one claim
LEVEL = 0.95  # of the intervals shown
MIN_SEEDS = 2


@dataclass(frozen=True)
class TTest:
    """One comparison's test before the family correction."""

    mean: float
    se: float
    n: int
    lo: float  # the 95 % t-interval of the mean
    hi: float
    p: float  # p-value of the null that the outcome below rejects
    outcome: str  # AGREE or DISAGREE: what a rejection would mean
    why: str  # the test in words, for the reason line


def t_quantile(n: int, level: float = LEVEL) -> float:
    """t(1 − (1 − level)/2, n − 1): 4.30 for 3 seeds, 12.7 for 2 (a 2-SE band covers 82 % and 70 %)."""
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def t_test(samples: Sequence[float], expected: str = "positive", tolerance: float = 0.0) -> TTest | str:
    """The test of per-seed ``samples``, or the reason there is none (fewer than 2 seeds, no spread)."""
    if expected not in EXPECTED:
        raise ValueError(f"expected must be one of {EXPECTED}, got {expected!r}")
    v = [float(x) for x in samples if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n < MIN_SEEDS:
        return f"{n} seed(s): needs ≥ {MIN_SEEDS} paired seeds for a spread to judge against"
    m = sum(v) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    if sd == 0.0:
        return "no spread over seeds (identical values): nothing to judge the difference against"
    se, df = sd / math.sqrt(n), n - 1
    half = t_quantile(n) * se
    if expected == "positive":
        p = float(2 * stats.t.sf(abs(m) / se, df))
        return TTest(m, se, n, m - half, m + half, p, AGREE if m > 0 else DISAGREE,
                     f"two-sided t-test of 0, {df} df")
    p_eq = float(max(stats.t.sf((m + tolerance) / se, df), stats.t.sf((tolerance - m) / se, df)))
    p_out = float(min(1.0, 2 * stats.t.sf((abs(m) - tolerance) / se, df)))
    if p_eq <= p_out:
        return TTest(m, se, n, m - half, m + half, p_eq, AGREE, f"equivalence within ±{tolerance:g}, {df} df")
    return TTest(m, se, n, m - half, m + half, p_out, DISAGREE, f"beyond ±{tolerance:g}, {df} df")


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Which hypotheses Holm–Bonferroni rejects at family-wise level ``alpha``."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


def combine(labels: Sequence[str]) -> str:
    """A claim's verdict from its comparisons' (rules above)."""
    labels = list(labels)
    if DISAGREE in labels:
        return DISAGREE
    if labels and all(v == AGREE for v in labels):
        return AGREE
    if not labels or all(v == NOT_TESTABLE for v in labels):
        return NOT_TESTABLE
    return INCONCLUSIVE
