"""Verdicts: does a measured difference agree with the paper's claim, given the spread over seeds? And the
verdict table the terminal shows.

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
from typing import Any

from scipy import stats

from .power import ALPHA, MIN_SEEDS

AGREE, DISAGREE, INCONCLUSIVE, NOT_TESTABLE = "agree", "disagree", "inconclusive", "not testable here"
EXPECTED = ("positive", "zero")
LEVEL = 0.95  # of the intervals shown


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


LEGEND = """\
Notation: C1–C7 are the paper's claims; d16×4 is a model of width 16 and 4 layers; γ.5, γ1 are γ = 0.5, 1;
L is the final validation loss (nats); srank the stable rank ‖W‖_F²/‖W‖_2²; Δ_sym = (p_A − p_B)/(p_A + p_B)
per token. Each number is the mean ± sd over seeds of a paired difference, signed so that > 0 is the paper's
direction. agree / disagree: a Student-t test over seeds rejects 0 (Holm over the claim's comparisons,
α = 0.05); inconclusive: it does not; not testable here: a precondition failed (reason below the line)."""


def verdict_table(claims: list[dict[str, Any]]) -> str:
    """One block per claim: its verdict, then each comparison with its own verdict and the paper's number;
    a comparison that is not testable here says why on the line below (once for consecutive comparisons with
    the same reason); the notation last."""
    rows = [("claim", "verdict", "measured (mean ± sd over seeds, n seeds) → verdict", "paper")]
    for c in claims:
        comps = c["comparisons"] or [{"text": "; ".join(c["notes"]) or "not measured at this scale",
                                      "verdict": "", "paper": c["paper"]}]
        previous = ""
        for i, comp in enumerate(comps):
            arrow = f" → {comp['verdict']}" if comp["verdict"] else ""
            rows.append((c["claim"] if i == 0 else "", c["verdict"] if i == 0 else "", comp["text"] + arrow,
                         comp.get("paper") or ""))
            reason = (comp.get("reason") or "") if comp.get("verdict") == NOT_TESTABLE else ""
            if reason and reason != previous:
                rows.append(("", "", f"  ↳ {reason}", ""))
            previous = reason
        for note in c["notes"] if c["comparisons"] else []:
            rows.append(("", "", f"({note})", ""))
    widths = [max(len(r[i]) for r in rows if not r[2].startswith(("  ↳", "("))) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n\n" + LEGEND
