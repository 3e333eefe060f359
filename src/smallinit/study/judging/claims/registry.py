"""The one registry of claims. Each claim's module declares itself here (``register``): how it is judged from
runs and what was measured beside them, what it needs measured, the unit of its primary, and the
preconditions that depend on what the runs show (which no plan can know). The verdict table, the findings,
the report and the planner all iterate over this registry, so a new claim is one module plus a recipe that
names it.

A claim's judge reads runs by their configs and records. The planner hands it planned runs (``Run.planned``):
their configs, sizes and schedules are the design's, and every outcome is unknown (NaN). Design
preconditions (seeds, sizes, tokens per parameter, evaluations, which arms) are then checked as on real runs;
each outcome precondition is skipped on planned runs and stated in ``decided_by_the_runs`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from smallinit.errors import ExperimentError
from smallinit.study.judging.claims.comparison import ClaimResult, not_run
from smallinit.study.judging.claims.selection import Run, Runs

QUESTION = (
    "smallinit's question, not a claim of the paper"  # how a question (Q1, …) is labelled wherever shown
)

# beside the runs: "flow" (the residual-flow sweep), "gaps" (token comparisons), "anchor"
Measured = dict[str, Any]
Judge = Callable[[Runs, Measured, dict[str, Any]], ClaimResult]


@dataclass(frozen=True)
class Claim:
    key: str  # "C4": the name a recipe's claims list and --seed-sd use
    judge: (
        Judge  # the claim on finished (or planned) runs, with what was measured beside them, and the options
    )
    unit: str = "nats"  # of its primary, for the minimum detectable effect
    needs: tuple[str, ...] = ()  # measurements beside the runs it reads (keys of Measured)
    decided_by_the_runs: str = ""  # its outcome preconditions, in words
    seed_sd: tuple[float, str] | None = (
        None  # its primary's seed sd in ``unit`` where one was measured, and where
    )
    question: bool = False  # smallinit's own question (QUESTION), not a claim of the paper

    @property
    def label(self) -> str:
        """The key, and for a question that it is smallinit's (the plan and the tables print this)."""
        return f"{self.key} ({QUESTION})" if self.question else self.key


CLAIMS: dict[str, Claim] = {}


def planned(runs: Iterable[Run]) -> bool:
    """These are a plan's runs: their outcomes are unknown, so a claim skips the preconditions that read them."""
    return any(r.planned for r in runs)


def register(claim: Claim) -> Claim:
    """Declare a claim (once, from its own module)."""
    if CLAIMS.get(claim.key, claim) is not claim:
        raise ValueError(f"claim {claim.key} is registered twice")
    CLAIMS[claim.key] = claim
    return claim


def registered(key: str) -> Claim:
    if key not in CLAIMS:
        raise ExperimentError(f"unknown claim {key!r}; the registered claims are {', '.join(CLAIMS)}")
    return CLAIMS[key]


def judge(keys: Iterable[str], runs: Runs, measured: Measured, options: dict[str, Any]) -> list[ClaimResult]:
    """The claims ``keys`` on ``runs``, in that order; those the design does not run (``options["dropped"]``:
    claim → why) as one row each saying so. Holm over the table is the caller's (``judge_table``)."""
    return not_run([registered(k).judge(runs, measured, options) for k in keys], options.get("dropped", {}))
