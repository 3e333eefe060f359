"""What a claim is made of: comparisons (per-seed values signed so that positive is the paper's direction)
and the claim's result, judged by the project's one rule (:mod:`smallinit.study.judging.verdicts`): its one
pre-declared primary comparison decides, with its magnitude against the paper's number and, when it cannot
decide, the smallest effect its seeds could have seen; the others are secondary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smallinit.study.judging.power import ALPHA, mde_line, power_of_test
from smallinit.study.judging.verdicts import (
    AGREE,
    DISAGREE,
    INCONCLUSIVE,
    NOT_TESTABLE,
    TTest,
    holm,
    holm_levels,
    t_test,
)

PRIMARY, SECONDARY = "primary", "secondary"


@dataclass
class Comparison:
    """One tested comparison: per-seed values (positive = the paper's direction) and the paper's number.

    ``seeds`` names the seed of each sample where samples are paired by seed (a difference of two comparisons pairs
    the seeds both have). ``untestable`` names a failed precondition; ``estimate``/``lo``/``hi`` hold a comparison
    judged by an interval from elsewhere (a bootstrap); ``trajectory`` the gap along training for a loss
    comparison and ``trend`` how it moves. ``paper`` is the paper's statement as printed, ``paper_value`` its
    number in the comparison's units (None where the paper gives none).
    The verdict is set by the claim that holds the comparison (a primary's by the table's correction).
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
    interval_level: float = 1 - ALPHA  # that interval's: it spends 1 − level of its claim's secondaries' α
    trajectory: dict[str, Any] | None = None
    trend: dict[str, Any] | None = None
    paper_value: float | None = None
    role: str = SECONDARY
    verdict: str = INCONCLUSIVE
    reason: str = ""
    magnitude: str = ""  # the primary's interval against the paper's number
    mde: float | None = None  # the primary's minimum detectable effect when it is inconclusive
    lost: str = ""  # per arm, the seeds that diverged or failed (selection.lost_seeds)
    no_value: str = ""  # per arm, the finished seeds that gave no value (:func:`count_no_value`)
    # a comparison judged by a test of its own instead of the t-test of its samples (C4's and Q1's sign-flip test,
    # Q2's intersection-union test): its p, a rejection meaning the direction of the samples' mean …
    resampled_p: float | None = None
    resampled_why: str = ""  # … and that test in words
    # where the rule is more than the paired t-test over the seeds it pairs: (true effect in seed sds, level) → the
    # probability that the rule decides in the paper's direction (a plan's MDE solves it, and an inconclusive
    # verdict's where the runs' own comparison carries it) …
    power: Callable[[float, float], float] | None = None
    power_why: str = ""  # … and that rule in words
    # seeds (else positions) whose value is not a number: on a plan's runs every value is unknown, so these are
    # the seeds the design pairs; nothing judges them
    unknown: list[int] = field(default_factory=list)
    # on a plan's runs, the seed sd of this comparison's own quantity where it is not its claim's (C4's best-lr gap
    # varies with the rates chosen as well as with the seed), and where it was measured
    planned_sd: tuple[float, str] | None = None
    same_as: str = ""  # the claim whose primary is this very gap (a secondary shown again, judged there)
    unit: str = ""  # "nats" for a loss gap: the unit a recipe's design effect is stated in

    def __post_init__(self) -> None:
        kept = [i for i, x in enumerate(self.samples) if x is not None and math.isfinite(x)]
        names = self.seeds if self.seeds is not None else list(range(len(self.samples)))
        self.unknown = self.unknown or [names[i] for i in range(len(self.samples)) if i not in set(kept)]
        self.samples = [float(self.samples[i]) for i in kept]
        if self.seeds is not None:
            self.seeds = [self.seeds[i] for i in kept]

    @staticmethod
    def by_seed(label: str, values: dict[int, float], paper: str = "", **kw: Any) -> Comparison:
        """A comparison of per-seed values, which remembers their seeds."""
        return Comparison(label, list(values.values()), paper, seeds=list(values), **kw)

    @staticmethod
    def difference(label: str, x: Comparison, y: Comparison, paper: str = "", **kw: Any) -> Comparison:
        """x's per-seed values minus y's, for the seeds both have; not testable where either is not."""
        xs, ys = dict(zip(x.seeds or [], x.samples)), dict(zip(y.seeds or [], y.samples))
        unknown = sorted(({*xs, *x.unknown} & {*ys, *y.unknown}) - (xs.keys() & ys.keys()))
        return Comparison.by_seed(
            label,
            {s: xs[s] - ys[s] for s in sorted(xs.keys() & ys.keys())},
            paper,
            untestable=x.untestable or y.untestable,
            unknown=unknown,
            **kw,
        )

    @staticmethod
    def interval(
        label: str,
        estimate: float,
        lo: float,
        hi: float,
        level: float,
        paper: str = "",
        paper_value: float | None = None,
    ) -> Comparison:
        """A (secondary) comparison judged by its own interval at ``level``: agree if lo > 0, disagree if hi < 0."""
        v = AGREE if lo > 0 else DISAGREE if hi < 0 else INCONCLUSIVE
        why = f"{level:.1%} interval [{lo:.3g}, {hi:.3g}]" + (
            " excludes 0" if v != INCONCLUSIVE else " contains 0"
        )
        c = Comparison(
            label,
            [],
            paper,
            estimate=estimate,
            lo=lo,
            hi=hi,
            interval_verdict=v,
            interval_level=level,
            reason=why,
            paper_value=paper_value,
        )
        c.magnitude = magnitude(lo, hi, paper_value)
        return c

    @staticmethod
    def missing(label: str, why: str, paper: str = "", **kw: Any) -> Comparison:
        """A part of a claim these runs cannot test, and why."""
        return Comparison(label, [], paper, untestable=why, **kw)

    def count_no_value(self, what: str, arm: str = "") -> None:
        """Count the seeds whose value is not a number (``unknown``) as a result: "γ=1: 1 of 5 seeds gave no flow
        exponent". Only for finished runs: on a plan's runs every value is unknown by design."""
        if self.unknown:
            n = len(self.unknown) + len(self.samples)
            self.no_value = (
                f"{arm + ': ' if arm else ''}{len(self.unknown)} of {n} seeds gave no {what} "
                f"(seed{'s' if len(self.unknown) > 1 else ''} {', '.join(map(str, self.unknown))})"
            )

    def test(self) -> TTest | str:
        """The t-test of the samples, or why there is none."""
        if self.no_value:
            return no_value_problem(self.no_value)
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
            return f"{self.label}: not measured" + "".join(f"; {x}" for x in (self.lost, self.no_value) if x)
        sd = f" ± {self.sd:.3f}" if len(self.samples) > 1 else ""
        text = f"{self.label}: {self.mean:+.3f}{sd} (n={len(self.samples)})"
        if self.trend:  # a loss gap: the verdict is at this budget (how it moves is its trend)
            text += f" at {self.trend['tokens_per_param']:.3g} tokens/param"
        return text + "".join(f"; {x}" for x in (self.lost, self.no_value) if x)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "role": self.role,
            "samples": self.samples,
            "seeds": self.seeds,
            "mean": self.mean,
            "sd": self.sd,
            "n": len(self.samples),
            "expected": self.expected,
            "tolerance": self.tolerance,
            "estimate": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            "verdict": self.verdict,
            "reason": self.reason,
            "paper": self.paper,
            "paper_value": self.paper_value,
            "magnitude": self.magnitude,
            "mde": self.mde,
            "trajectory": self.trajectory,
            "trend": self.trend,
            "lost": self.lost,
            "no_value": self.no_value,
            "unknown": self.unknown,
            "resampled_p": self.resampled_p,
            "same_as": self.same_as,
            "text": self.text(),
        }


def no_value_problem(no_value: str) -> str:
    """The rule for a comparison some of whose finished seeds gave no value (``no_value`` from
    :meth:`Comparison.count_no_value`): judged on the others, n would shrink on whatever made a value fail."""
    return (
        f"{no_value}: a seed without a value is a result, not missing data, so the other seeds are not judged "
        "alone (find why it gave none)"
    )


def magnitude(lo: float, hi: float, paper_value: float | None) -> str:
    """Where an interval lies against the paper's number, in the same units."""
    if paper_value is None:
        return "the paper gives no number to compare with"
    if lo <= paper_value <= hi:
        return f"contains the paper's {paper_value:+.3g}"
    return f"{'below' if hi < paper_value else 'above'} the paper's {paper_value:+.3g}"


@dataclass
class ClaimResult:
    """A claim: its comparisons, exactly one of them primary (role ``PRIMARY``), which decides the verdict.

    ``alpha`` is the level the primary is judged at: ``ALPHA`` for a claim judged alone, its Holm level when
    :func:`judge_table` judges it among the table's claims; ``family`` the number of primaries in that family.
    """

    claim: str
    statement: str
    paper: str
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    untestable: str = ""  # a precondition of the whole claim that failed
    alpha: float = ALPHA
    family: int = 1
    held: bool = False  # below its level, but Holm stopped before it
    design: float | None = None  # the loss gap (nats) the recipe sized its seeds for: the power a verdict had

    @property
    def primary(self) -> Comparison:
        """The pre-declared primary comparison (a claim without one has a "missing" primary)."""
        marked = [c for c in self.comparisons if c.role == PRIMARY]
        if len(marked) != 1:
            raise ValueError(f"{self.claim}: {len(marked)} primary comparisons, needs exactly one")
        return marked[0]

    def primary_test(self) -> TTest | str:
        c = self.primary
        if self.untestable:
            return self.untestable
        if c.interval_verdict:
            return "a primary must be a paired test over seeds"
        t = c.test()
        if isinstance(t, TTest) and c.resampled_p is not None:  # its resampling test decides (a best-lr gap)
            outcome = AGREE if t.mean > 0 else DISAGREE
            return dataclasses.replace(t, p=c.resampled_p, outcome=outcome, why=c.resampled_why)
        return t

    def judge(self) -> None:
        """Every comparison's verdict and reason: the secondaries as one family (:meth:`_judge_secondaries`), the
        primary at ``alpha`` with its magnitude and, when inconclusive, its minimum detectable effect."""
        for c in self.comparisons:
            if self.untestable:
                c.verdict, c.reason = NOT_TESTABLE, self.untestable
            elif c.no_value:
                c.verdict, c.reason = NOT_TESTABLE, no_value_problem(c.no_value)
            elif c.untestable:
                c.verdict, c.reason = NOT_TESTABLE, c.untestable
            elif c.interval_verdict:
                c.verdict = c.interval_verdict
        if not self.untestable:
            self._judge_secondaries()
        self._judge_primary()

    def _judge_secondaries(self) -> None:
        """The claim's secondaries together, so that with no effect some line of this claim reads agree or disagree
        at most α of the time: one judged by an interval of its own spends 1 − its level of α (Bonferroni), and
        Holm over the p-values of the others spends what is left. A secondary that is another claim's primary
        (``same_as``) is judged there, outside this family."""
        tested: list[tuple[Comparison, float, str, str]] = []  # each with p, what a rejection means, the test
        for c in self.comparisons:
            if c.role != SECONDARY or c.same_as or c.verdict == NOT_TESTABLE or c.interval_verdict:
                continue
            if c.resampled_p is not None:
                tested.append((c, c.resampled_p, AGREE if c.mean > 0 else DISAGREE, c.resampled_why))
                continue
            t = c.test()
            if isinstance(t, str):
                c.verdict, c.reason = NOT_TESTABLE, t
            else:
                tested.append((c, t.p, t.outcome, f"95% t-interval [{t.lo:+.3g}, {t.hi:+.3g}]"))
        spent = sum(1 - c.interval_level for c in self.comparisons if c.interval_verdict and not c.same_as)
        alpha = max(0.0, ALPHA - spent)
        p = [x[1] for x in tested]
        some = f"{len(tested)} tested secondar{'y' if len(tested) == 1 else 'ies'}"
        family = f"Holm over the claim's {some} at α = {alpha:.3g}" + (
            f" (α = {ALPHA:g} less {spent:.3g} spent on interval lines)" if spent else ""
        )
        for (c, pc, outcome, why), level, rejected in zip(tested, holm_levels(p, alpha), holm(p, alpha)):
            c.verdict = outcome if rejected else INCONCLUSIVE
            held = not rejected and pc <= level
            c.reason = f"{why}; p = {pc:.2g} against {level:.3g}, its level under {family}" + (
                "; not rejected: Holm stopped at a smaller p" if held else ""
            )
            if c.resampled_p is not None and c.verdict == INCONCLUSIVE and len(c.samples) >= 2:
                c.mde, _, c.magnitude = mde_line(  # its power, at its own spread
                    c.sd, len(c.samples), level, power=c.power, rule=c.power_why
                )

    def _judge_primary(self) -> None:
        c, t = self.primary, self.primary_test()
        c.magnitude, c.mde = "", None
        if isinstance(t, str):
            c.verdict, c.reason = NOT_TESTABLE, t
            return
        c.verdict = INCONCLUSIVE if self.held else t.outcome_at(self.alpha)
        lo, hi = t.interval(self.alpha)
        c.lo, c.hi = lo, hi
        family = f"its level under Holm over {self.family} primaries" if self.family > 1 else "judged alone"
        interval = f"{100 * (1 - self.alpha):.4g}% t-interval [{lo:+.3g}, {hi:+.3g}]"
        test = f"p = {t.p:.2g} ({t.why}) against α = {self.alpha:.3g} ({family})"
        if c.resampled_p is None:  # the interval decides
            c.reason = f"{interval}; {test}"
        else:  # a test of its own decides (its seeds share the rates chosen, or its verdict needs two tests): the
            # t-interval only describes the seeds, and may exclude 0 where the test does not reject
            c.reason = f"{test}; {interval}, a description of the seeds"
        c.reason += "; not rejected: Holm stopped at a smaller p" if self.held else ""
        c.magnitude = magnitude(lo, hi, c.paper_value)
        if c.verdict == INCONCLUSIVE:
            what = "an effect of" if c.expected == "positive" else f"a deviation beyond ±{c.tolerance:g} of"
            c.mde, _, words = mde_line(  # the sd is a guess too: both MDEs shown
                t.sd, t.n, self.alpha, what, power=c.power, rule=c.power_why
            )
            c.magnitude += f"; {words}"
        if self.design and c.unit == "nats" and c.expected == "positive":
            had = (
                c.power(self.design / t.sd, self.alpha)
                if c.power
                else power_of_test(self.design, t.sd, t.n, self.alpha)
            )
            c.magnitude += (
                f"; power at the design's {self.design:+g} nats {had:.2f} at the measured sd {t.sd:.3g} "
                f"(n = {t.n}, α = {self.alpha:.3g}{f', by the {c.power_why}' if c.power else ''})"
            )

    @property
    def verdict(self) -> str:
        return self.primary.verdict

    @property
    def measured(self) -> str:
        parts = [c.text() for c in self.comparisons] or ["not measured at this scale"]
        return "; ".join(parts + self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "statement": self.statement,
            "paper": self.paper,
            "verdict": self.verdict,
            "untestable": self.untestable,
            "measured": self.measured,
            "alpha": self.alpha,
            "family": self.family,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "notes": self.notes,
            "extra": self.extra,
        }


def declare_primary(
    res: ClaimResult, candidates: list[tuple[str, Comparison]], missing: str, needs: str
) -> None:
    """Make the first candidate whose size meets its precondition the claim's primary (else the first, so its
    reason shows); with no candidate, a missing primary that says what the runs need. ``candidates`` holds
    (precondition problem or "", comparison) per size, smallest first."""
    if not candidates:
        res.comparisons.append(Comparison.missing(missing, needs, role=PRIMARY))
        return
    holding = [c for problem, c in candidates if not problem]
    (holding or [candidates[0][1]])[0].role = PRIMARY


def judge_table(claims: Sequence[ClaimResult], alpha: float = ALPHA, design: float | None = None) -> None:
    """The table-level correction: Holm over the primaries that are testable, each claim judged at the level
    of its rank (a claim whose primary is not testable is outside the family). ``design``: the loss gap (nats) the
    recipe sized its seeds for, so a loss primary says the power it had at it."""
    owners = _same_gaps(claims)
    for c in claims:
        c.design = design
    testable = [c for c in claims if isinstance(c.primary_test(), TTest)]
    levels = holm_levels([c.primary_test().p for c in testable], alpha)
    rejected = holm([c.primary_test().p for c in testable], alpha)
    for c, level, rej in zip(testable, levels, rejected):
        c.family, c.alpha = len(testable), level
        c.held = not rej and c.primary_test().p <= level  # Holm stopped at a smaller p before reaching it
        c.judge()
    for c in claims:
        if all(c is not x for x in testable):
            c.family = len(testable)
            c.judge()
    for c, owner in owners:
        if c.verdict != NOT_TESTABLE:
            c.verdict = owner.primary.verdict
            c.reason = f"the same gap as {c.same_as}'s primary, judged there: {owner.primary.reason}"


def _same_gaps(claims: Sequence[ClaimResult]) -> list[tuple[Comparison, ClaimResult]]:
    """Each secondary that is another claim's primary (the same seeds and values: C5's L(γ0.5)−L(γ1) is C4's
    primary), marked ``same_as`` before judging: it takes that primary's verdict, so one gap is never agree in one
    row and inconclusive in another, and it is not a member of its own claim's family of secondaries."""

    def gap(c: Comparison) -> tuple:
        return tuple(c.seeds or ()), tuple(c.samples)

    primaries = {gap(c.primary): c for c in claims if c.primary.samples and not c.primary.no_value}
    out = []
    for res in claims:
        for c in res.comparisons:
            owner = primaries.get(gap(c)) if c.role == SECONDARY and c.samples else None
            if owner is not None and owner is not res:
                c.same_as = owner.claim.split()[0]
                out.append((c, owner))
    return out


NOT_RUN = "not run by design"


def not_run(claims: Sequence[ClaimResult], dropped: dict[str, str]) -> list[ClaimResult]:
    """The claims with each one a design does not run (``dropped``: claim → why) replaced by a single row that says
    so: its primary is untestable, so it is outside Holm's family, and no leftover comparison of other runs shows."""
    out = []
    for res in claims:
        why = dropped.get(res.claim.split()[0])
        if why is None:
            out.append(res)
            continue
        reason = f"{NOT_RUN}: {why}"
        out.append(
            ClaimResult(
                res.claim,
                res.statement,
                res.paper,
                untestable=reason,
                comparisons=[Comparison.missing(res.primary.label, reason, res.primary.paper, role=PRIMARY)],
            )
        )
    return out


def judged(claim: Callable[..., ClaimResult]) -> Callable[..., ClaimResult]:
    """A claim function whose result comes back judged (verdicts and reasons set), as if alone in its table."""

    @functools.wraps(claim)
    def wrapper(*args: Any, **kwargs: Any) -> ClaimResult:
        res = claim(*args, **kwargs)
        res.judge()
        return res

    return wrapper
