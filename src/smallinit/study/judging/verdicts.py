"""Verdicts: does a measured difference agree with the paper's claim, given the spread over seeds? And the
verdict table the terminal shows.

One rule for every claim, so recipes and the report judge alike. A comparison is a set of per-seed
differences (paired runs: same seed, one setting changed), signed so that positive is the paper's
direction. With n seeds, mean m and standard error se = sd/√n, the statistic (m − μ0)/se is Student-t
with n − 1 degrees of freedom. The paper's claim is a region for the true mean: μ > 0 (a direction) or
|μ| ≤ tol (a measured exponent against a prediction). At level α:

* **agree** when the (1 − α) t-interval lies inside the region, **disagree** when it lies outside it,
  **inconclusive** otherwise. For a direction this is the two-sided t-test of 0; for a tolerance, the
  interval inside ±tol (both one-sided tests at α/2) or beyond it. The rule is symmetric: where the true
  mean sits on the region's edge (no effect), agree and disagree each happen with probability α/2.
* each claim has one pre-declared **primary** comparison, which alone decides the claim's verdict. The
  primaries of a table form one family: Holm–Bonferroni at α = 0.05 over those that are testable (sort the
  k p-values; reject while p_(i) ≤ α/(k − i + 1)), so that over the whole table a false agree or disagree
  happens at most 5 % of the time, and for each claim at most 2.5 % each way.
* the other comparisons are **secondary**: none vetoes or decides the claim, and each claim's secondaries are
  judged together as one family at α = 0.05, so that with no effect some secondary line of a claim reads agree
  or disagree at most 5 % of the time: one judged by an interval from elsewhere (a bootstrap, always secondary)
  is computed at level 1 − α/m for m secondaries and spends α/m, and Holm over the others' p-values spends what
  is left. Over the table, with K claims holding secondaries, that chance is at most K·α (printed by
  :func:`secondary_family`). A secondary that is another claim's primary (the same gap) shows that verdict and is
  not a member of its own claim's family.
* **not testable here**: a precondition of the test failed (fewer than 2 seeds, a run trained too
  briefly, a mechanism that cannot act at this width); it says which, with the number. A claim whose
  primary is not testable is not testable here, whatever its secondaries say.

The functions on arrays (``paired_t``, ``region_p``, ``holm_reject``) take any leading axes, so the
simulation tests of the error rates run the very rule the claims use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from smallinit.study.judging.power import ALPHA, MIN_SEEDS

AGREE, DISAGREE, INCONCLUSIVE, NOT_TESTABLE = "agree", "disagree", "inconclusive", "not testable here"
EXPECTED = ("positive", "zero")
LEVEL = 0.95  # of the intervals shown for secondary comparisons


@dataclass(frozen=True)
class TTest:
    """One comparison's test before the table's correction."""

    mean: float
    se: float
    n: int
    lo: float  # the 95 % t-interval of the mean
    hi: float
    p: float  # p-value of the null that the outcome below rejects
    outcome: str  # AGREE or DISAGREE: what a rejection would mean
    why: str  # the test in words, for the reason line
    expected: str = "positive"
    tolerance: float = 0.0

    @property
    def sd(self) -> float:
        return self.se * math.sqrt(self.n)

    def interval(self, alpha: float) -> tuple[float, float]:
        """The (1 − alpha) t-interval of the mean."""
        half = t_quantile(self.n, 1 - alpha) * self.se
        return self.mean - half, self.mean + half

    def outcome_at(self, alpha: float) -> str:
        """AGREE / DISAGREE if rejected at ``alpha``, else INCONCLUSIVE."""
        return self.outcome if self.p <= alpha else INCONCLUSIVE


def t_quantile(n: int, level: float = LEVEL) -> float:
    """t(1 − (1 − level)/2, n − 1): 4.30 for 3 seeds, 12.7 for 2 (a 2-SE band covers 82 % and 70 %)."""
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def paired_t(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error over the last axis (the seeds)."""
    x = np.asarray(samples, dtype=float)
    return x.mean(-1), x.std(-1, ddof=1) / np.sqrt(x.shape[-1])


def region_p(
    mean: np.ndarray, se: np.ndarray, df: int, expected: str = "positive", tolerance: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(p, agrees): the smallest α at which the (1 − α) interval lies wholly inside (agrees) or wholly outside
    (not agrees) the claim's region. A direction: the two-sided p of 0. A tolerance: twice the larger one-sided
    p of the equivalence tests, or twice the one-sided p of lying beyond ±tol on the side of the mean."""
    mean, se = np.asarray(mean, dtype=float), np.asarray(se, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):  # no spread: p is NaN, never a rejection
        return _region_p(mean, se, df, expected, tolerance)


def _region_p(
    mean: np.ndarray, se: np.ndarray, df: int, expected: str, tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    if expected == "positive":
        return np.minimum(1.0, 2 * stats.t.sf(np.abs(mean) / se, df)), mean > 0
    p_in = np.minimum(
        1.0, 2 * np.maximum(stats.t.sf((mean + tolerance) / se, df), stats.t.sf((tolerance - mean) / se, df))
    )
    p_out = np.minimum(1.0, 2 * stats.t.sf((np.abs(mean) - tolerance) / se, df))
    return np.minimum(p_in, p_out), p_in <= p_out


def seeds_problem(n: int) -> str:
    """Why ``n`` paired seeds cannot be tested ("" when they can)."""
    return (
        f"{n} seed(s): needs ≥ {MIN_SEEDS} paired seeds for a spread to judge against"
        if n < MIN_SEEDS
        else ""
    )


def t_test(samples: Sequence[float], expected: str = "positive", tolerance: float = 0.0) -> TTest | str:
    """The test of per-seed ``samples``, or the reason there is none (fewer than 2 seeds, no spread)."""
    if expected not in EXPECTED:
        raise ValueError(f"expected must be one of {EXPECTED}, got {expected!r}")
    v = [float(x) for x in samples if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n < MIN_SEEDS:
        return seeds_problem(n)
    m, se = (float(a) for a in paired_t(np.asarray(v)))
    if se == 0.0:
        return "no spread over seeds (identical values): nothing to judge the difference against"
    df, half = n - 1, t_quantile(n) * se
    p, agrees = region_p(m, se, df, expected, tolerance)
    why = (
        f"two-sided t-test of 0, {df} df"
        if expected == "positive"
        else f"interval inside or beyond ±{tolerance:g}, {df} df"
    )
    return TTest(
        m, se, n, m - half, m + half, float(p), AGREE if agrees else DISAGREE, why, expected, tolerance
    )


def holm_reject(p: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Which hypotheses Holm–Bonferroni rejects at family-wise level ``alpha``, over the last axis; NaN marks a
    member that is not in the family (not testable)."""
    p = np.asarray(p, dtype=float)
    k = np.sum(np.isfinite(p), axis=-1, keepdims=True)
    order = np.argsort(np.where(np.isfinite(p), p, np.inf), axis=-1)
    sorted_p = np.take_along_axis(p, order, axis=-1)
    rank = np.arange(p.shape[-1])
    passes = np.cumprod(
        np.where(rank < k, sorted_p <= alpha / np.maximum(k - rank, 1), False), axis=-1
    ).astype(bool)
    rejected = np.zeros_like(passes)
    np.put_along_axis(rejected, order, passes, axis=-1)
    return rejected


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Which hypotheses Holm–Bonferroni rejects at family-wise level ``alpha``."""
    return [bool(r) for r in holm_reject(np.asarray(p_values, dtype=float), alpha)] if len(p_values) else []


def holm_levels(p_values: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The level α/(k − i) each of the k hypotheses is compared with at its rank i in Holm's order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    levels = [alpha] * len(p_values)
    for rank, i in enumerate(order):
        levels[i] = alpha / (len(p_values) - rank)
    return levels


LEGEND = """\
Notation: C1–C7 are the paper's claims, Q1 and Q2 smallinit's own questions (not claims of the paper: their
"paper" column says what > 0 means); d16×4 is a model of width 16 and 4 layers; γ.5, γ1 are γ = 0.5, 1;
L is the final validation loss (nats); srank the stable rank ‖W‖_F²/‖W‖_2²; Δ_sym = (p_A − p_B)/(p_A + p_B)
per token. Each number is the mean ± sd over seeds of a paired difference, signed so that > 0 is the paper's
direction, at the budget stated (tokens per non-embedding parameter). The paper column gives its number in
the same units and sign, at the model size in brackets (0.1B … 1.5B parameters: the paper's range).
▶ marks each claim's pre-declared primary estimate, which alone decides its verdict: agree / disagree when
its t-interval at the level shown lies inside / outside the paper's region (> 0, or within ±tol), or, on a
line that names a test of its own (a sign-flip or intersection-union test), when that test's p is at most the
level, Holm over the table's primaries at α = 0.05; inconclusive otherwise, with the smallest effect its seeds
could see at 80 % power. · marks secondary comparisons: shown, never deciding, each claim's judged together at α = 0.05
(Holm); one that is another claim's primary shows that verdict.
not testable here: a precondition failed (reason below the line). A loss gap's trend: its per-seed slope
against log tokens over the second half of training, tested across seeds (settled / moving / undetermined);
a moving gap crossed 0 there, is closing (a crossing extrapolated only while it is still moving at the end),
closing with its crossing not extrapolated (not shown to be still moving at the end) or widening."""


def secondary_family(claims: list[dict[str, Any]]) -> str:
    """The table's secondaries as families: how many were judged in how many claims, and the chance that at least
    one of them reads agree or disagree when nothing has an effect ("" when none was judged)."""
    per_claim = [
        sum(
            comp.get("role") != "primary"
            and comp["verdict"] in (AGREE, DISAGREE, INCONCLUSIVE)
            and not comp.get("same_as")
            for comp in c["comparisons"]
        )
        for c in claims
    ]
    m, k = sum(per_claim), sum(n > 0 for n in per_claim)
    if not m:
        return ""
    return (
        f"Secondary lines (·): {m} judged in {k} claim{'s' if k > 1 else ''}, each claim's together at α = "
        f"{ALPHA:g} (Holm). With no effect anywhere, the chance that some line of a claim reads agree or disagree "
        f"is at most {ALPHA:.0%}; that some line of the table does, at most {1 - (1 - ALPHA) ** k:.0%} if the claims "
        f"are independent, {min(1.0, k * ALPHA):.0%} however they depend: a secondary line points, it does not find."
    )


def verdict_table(claims: list[dict[str, Any]]) -> str:
    """One block per claim: its verdict, then each comparison with its own verdict and the paper's number; under
    the primary its interval and level, its magnitude against the paper's number (or its minimum detectable
    effect) and a loss gap's trend; under a comparison that is not testable here why (once for consecutive
    comparisons with the same reason); the notation last."""
    rows = [("claim", "verdict", "measured (mean ± sd over seeds, n seeds) → verdict", "paper")]
    for c in claims:
        comps = c["comparisons"] or [
            {
                "text": "; ".join(c["notes"]) or "not measured at this scale",
                "verdict": "",
                "paper": c["paper"],
            }
        ]
        comps = sorted(comps, key=lambda comp: comp.get("role") != "primary")  # the primary first
        previous = ""
        for i, comp in enumerate(comps):
            primary = comp.get("role") == "primary"
            arrow = f" → {comp['verdict']}" if comp["verdict"] else ""
            if comp.get("same_as"):  # one gap, one verdict, said once: where it was judged
                arrow += f" (as {comp['same_as']} ▶)"
            mark = "▶ " if primary else "· "
            rows.append(
                (
                    c["claim"] if i == 0 else "",
                    c["verdict"] if i == 0 else "",
                    mark + comp["text"] + arrow,
                    comp.get("paper") or "",
                )
            )
            reason = (comp.get("reason") or "") if comp.get("verdict") == NOT_TESTABLE or primary else ""
            if reason and reason != previous:
                rows.append(("", "", f"    ↳ {reason}", ""))
            previous = reason
            if comp.get("magnitude") and (primary or comp.get("mde") is not None):  # a secondary: its power
                rows.append(("", "", f"    ↳ {comp['magnitude']}", ""))
            trend = comp.get("trend") or {}
            if trend and (primary or trend.get("state") == "moving"):
                rows.append(("", "", f"    ↳ gap {trend['summary']}", ""))
        for note in c["notes"] if c["comparisons"] else []:
            rows.append(("", "", f"({note})", ""))
    widths = [max(len(r[i]) for r in rows if not r[2].startswith(("    ↳", "("))) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    family = secondary_family(claims)
    return "\n".join(line.rstrip() for line in lines) + "\n\n" + (family + "\n\n" if family else "") + LEGEND
