"""Verdicts: does a measured difference agree with the paper's claim, given the spread over seeds?

One rule for every claim, so recipes and the report judge alike:

* expected ``"positive"`` / ``"negative"`` (a direction): with mean difference m and standard error se,
  |m| ≤ z·se → **inconclusive** (the seeds do not separate it from 0); otherwise **agree** when m has the
  expected sign and **disagree** when it has the other.
* expected ``"zero"`` with a ``tolerance`` (e.g. a measured exponent against a prediction): |m| + z·se ≤
  tol → **agree**; |m| − z·se > tol → **disagree**; otherwise **inconclusive**.
* fewer than ``min_n`` measurements (default 2, i.e. one seed) → **inconclusive**: there is no spread
  to judge the difference against. A deterministic measurement with no seed spread can pass ``se=0``
  to :func:`judge` directly.

se is the standard error of the mean difference: sd/√n over paired per-seed differences, or
√(s_a²/n_a + s_b²/n_b) for unpaired groups. z = 2 by default (about a 95 % two-sided band).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

EXPECTED = ("positive", "negative", "zero")


@dataclass(frozen=True)
class Verdict:
    label: str  # "agree" | "disagree" | "inconclusive"
    mean: float  # the measured difference (treated − baseline)
    se: float  # its standard error (nan with fewer than two measurements)
    n: int  # measurements (seeds) behind it
    expected: str  # "positive" | "negative" | "zero"
    reason: str  # one line: why this label

    def to_dict(self) -> dict:
        return asdict(self)


def judge(
    mean: float, se: float, n: int, expected: str, *, z: float = 2.0, tolerance: float = 0.0, min_n: int = 2
) -> Verdict:
    """The verdict for a mean difference ``mean`` ± ``se`` from ``n`` measurements (rules above)."""
    if expected not in EXPECTED:
        raise ValueError(f"expected must be one of {EXPECTED}, got {expected!r}")
    if n == 0 or not math.isfinite(mean):
        return Verdict("inconclusive", mean, se, n, expected, "no measurement")
    if n < min_n or not math.isfinite(se):
        return Verdict("inconclusive", mean, se, n, expected,
                       f"{n} measurement(s): no seed spread to judge the difference against")
    band = z * se
    if expected == "zero":
        if abs(mean) + band <= tolerance:
            return Verdict("agree", mean, se, n, expected, f"|{mean:.3g}| + {z:g}·SE ≤ tolerance {tolerance:g}")
        if abs(mean) - band > tolerance:
            return Verdict("disagree", mean, se, n, expected, f"|{mean:.3g}| − {z:g}·SE > tolerance {tolerance:g}")
        return Verdict("inconclusive", mean, se, n, expected,
                       f"|{mean:.3g}| ± {z:g}·SE straddles the tolerance {tolerance:g}")
    if abs(mean) <= band:
        return Verdict("inconclusive", mean, se, n, expected, f"|{mean:.3g}| ≤ {z:g}·SE = {band:.3g}")
    sign_ok = (mean > 0) == (expected == "positive")
    word = "expected" if sign_ok else "opposite"
    return Verdict("agree" if sign_ok else "disagree", mean, se, n, expected,
                   f"{mean:.3g} has the {word} sign and exceeds {z:g}·SE = {band:.3g}")


def _mean_se(values: Sequence[float]) -> tuple[float, float, int]:
    v = [float(x) for x in values if math.isfinite(float(x))]
    n = len(v)
    if n == 0:
        return float("nan"), float("nan"), 0
    m = sum(v) / n
    if n < 2:
        return m, float("nan"), n
    var = sum((x - m) ** 2 for x in v) / (n - 1)
    return m, math.sqrt(var / n), n


def verdict_paired(diffs: Sequence[float], expected: str, *, z: float = 2.0, tolerance: float = 0.0) -> Verdict:
    """Verdict from per-seed differences (treated − baseline with the same seed)."""
    m, se, n = _mean_se(diffs)
    return judge(m, se, n, expected, z=z, tolerance=tolerance)


def verdict_unpaired(
    baseline: Sequence[float], treated: Sequence[float], expected: str, *, z: float = 2.0, tolerance: float = 0.0
) -> Verdict:
    """Verdict from two independent groups of measurements (mean(treated) − mean(baseline))."""
    mb, seb, nb = _mean_se(baseline)
    mt, set_, nt = _mean_se(treated)
    return judge(mt - mb, math.sqrt(seb**2 + set_**2), min(nb, nt), expected, z=z, tolerance=tolerance)
