"""What a claim is made of: comparisons (per-seed values signed so that positive is the paper's direction)
and the claim's result, judged by the project's one rule (:mod:`smallinit.experiments.verdicts`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..verdicts import AGREE, ALPHA, DISAGREE, INCONCLUSIVE, NOT_TESTABLE, TTest, combine, holm, t_test


@dataclass
class Comparison:
    """One tested comparison: per-seed values (positive = the paper's direction) and the paper's number.

    ``seeds`` names the seed of each sample where samples are paired by seed (a difference of two comparisons pairs
    the seeds both have). ``untestable`` names a failed precondition; ``estimate``/``lo``/``hi`` hold a comparison
    judged by an interval from elsewhere (a bootstrap); ``trajectory`` the gap along training for a loss
    comparison.
    The verdict is set by the claim that holds the comparison (the family correction needs them all).
    """

    label: str
    samples: list[float]
    paper: str = ""
    seeds: list[int] | None = None
    expected: str = "positive"  # or "zero": within ±tolerance
    tolerance: float = 0.0
    untestable: str = ""
    estimate: float | None = None
    lo: float = math.nan
    hi: float = math.nan
    interval_verdict: str = ""
    trajectory: dict[str, Any] | None = None
    verdict: str = INCONCLUSIVE
    reason: str = ""

    def __post_init__(self) -> None:
        kept = [i for i, x in enumerate(self.samples) if x is not None and math.isfinite(x)]
        self.samples = [float(self.samples[i]) for i in kept]
        if self.seeds is not None:
            self.seeds = [self.seeds[i] for i in kept]

    @staticmethod
    def by_seed(label: str, values: dict[int, float], paper: str = "", **kw: Any) -> Comparison:
        """A comparison of per-seed values, which remembers their seeds."""
        return Comparison(label, list(values.values()), paper, seeds=list(values), **kw)

    @staticmethod
    def difference(label: str, x: Comparison, y: Comparison, paper: str = "") -> Comparison:
        """x's per-seed values minus y's, for the seeds both have; not testable where either is not."""
        xs, ys = dict(zip(x.seeds or [], x.samples)), dict(zip(y.seeds or [], y.samples))
        return Comparison.by_seed(label, {s: xs[s] - ys[s] for s in sorted(xs.keys() & ys.keys())}, paper,
                                  untestable=x.untestable or y.untestable)

    @staticmethod
    def interval(label: str, estimate: float, lo: float, hi: float, level: float, paper: str = "") -> Comparison:
        """A comparison judged by its own interval at ``level``: agree if lo > 0, disagree if hi < 0."""
        v = AGREE if lo > 0 else DISAGREE if hi < 0 else INCONCLUSIVE
        why = f"{level:.1%} interval [{lo:.3g}, {hi:.3g}]" + (" excludes 0" if v != INCONCLUSIVE else " contains 0")
        return Comparison(label, [], paper, estimate=estimate, lo=lo, hi=hi, interval_verdict=v, reason=why)

    @staticmethod
    def missing(label: str, why: str, paper: str = "") -> Comparison:
        """A part of a claim these runs cannot test, and why."""
        return Comparison(label, [], paper, untestable=why)

    def test(self) -> TTest | str:
        """The t-test of the samples, or why there is none."""
        if self.untestable:
            return self.untestable
        return t_test(self.samples, self.expected, self.tolerance)

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples)) if self.samples else math.nan

    @property
    def sd(self) -> float:
        return float(np.std(self.samples, ddof=1)) if len(self.samples) > 1 else math.nan

    def text(self) -> str:
        if self.estimate is not None:
            return f"{self.label}: {self.estimate:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"
        if not self.samples:
            return f"{self.label}: not measured"
        sd = f" ± {self.sd:.3f}" if len(self.samples) > 1 else ""
        return f"{self.label}: {self.mean:+.3f}{sd} (n={len(self.samples)})"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "samples": self.samples, "seeds": self.seeds, "mean": self.mean, "sd": self.sd,
                "n": len(self.samples), "expected": self.expected, "tolerance": self.tolerance,
                "estimate": self.estimate, "lo": self.lo, "hi": self.hi, "verdict": self.verdict, "reason": self.reason,
                "paper": self.paper, "trajectory": self.trajectory, "text": self.text()}


@dataclass
class ClaimResult:
    claim: str
    statement: str
    paper: str
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    untestable: str = ""  # a precondition of the whole claim that failed

    def judge(self) -> None:
        """Every comparison's verdict and reason: the t-tests, then Holm over the claim's family."""
        tests = []
        for c in self.comparisons:
            if self.untestable:
                c.verdict, c.reason = NOT_TESTABLE, self.untestable
            elif c.untestable:
                c.verdict, c.reason = NOT_TESTABLE, c.untestable
            elif c.interval_verdict:
                c.verdict = c.interval_verdict
            else:
                t = c.test()
                if isinstance(t, str):
                    c.verdict, c.reason = NOT_TESTABLE, t
                else:
                    tests.append((c, t))
        rejected = holm([t.p for _, t in tests])
        for (c, t), rej in zip(tests, rejected):
            c.verdict = t.outcome if rej else INCONCLUSIVE
            c.reason = (f"95% t-interval [{t.lo:+.3g}, {t.hi:+.3g}]; p = {t.p:.2g} ({t.why}), "
                        f"{'rejected' if rej else 'not rejected'} by Holm at α = {ALPHA:g} over {len(tests)}")

    @property
    def n_testable(self) -> int:
        """Comparisons that will be judged by a test (the size of the family)."""
        return sum(1 for c in self.comparisons if not isinstance(c.test(), str))

    @property
    def verdict(self) -> str:
        self.judge()
        return combine(c.verdict for c in self.comparisons)

    @property
    def measured(self) -> str:
        parts = [c.text() for c in self.comparisons] or ["not measured at this scale"]
        return "; ".join(parts + self.notes)

    def to_dict(self) -> dict[str, Any]:
        verdict = self.verdict
        return {"claim": self.claim, "statement": self.statement, "paper": self.paper, "verdict": verdict,
                "untestable": self.untestable, "measured": self.measured,
                "comparisons": [c.to_dict() for c in self.comparisons], "notes": self.notes, "extra": self.extra}


def judged(claim: Callable[..., ClaimResult]) -> Callable[..., ClaimResult]:
    """A claim function whose result comes back judged (verdicts and reasons set)."""

    @functools.wraps(claim)
    def wrapper(*args: Any, **kwargs: Any) -> ClaimResult:
        res = claim(*args, **kwargs)
        res.judge()
        return res

    return wrapper
