"""findings.json as types: what a recipe's analysis (:mod:`.findings`) writes, read back once, so a reader of it
(the report) reads attributes rather than keys. A claim here is a judged claim as :class:`.claims.ClaimResult`
writes it (``to_dict``); the numbers behind a recipe's figures stay as written (``numbers``).

Reading is tolerant of what another version left out (a missing field takes its default, an unknown one is
ignored) and strict about shape: a file whose claims are not a list of objects is not findings.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from smallinit.study.judging.claims.comparison import PRIMARY
from smallinit.study.judging.verdicts import INCONCLUSIVE


def _known(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` that ``raw`` holds."""
    if not isinstance(raw, dict):
        raise TypeError(f"{cls.__name__} is written as an object, not {type(raw).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in raw.items() if k in names}


@dataclass(frozen=True)
class JudgedComparison:
    """One comparison of a claim: its per-seed numbers, interval and verdict, and the reason for it."""

    label: str = ""
    text: str = ""  # the label with the paper's direction, as the terminal's table prints it
    role: str = ""  # "primary" decides the claim; "secondary" is shown and never decides
    verdict: str = ""
    reason: str = ""
    magnitude: str = ""  # where the interval lies against the paper's number, in words
    samples: list[float] = field(default_factory=list)
    seeds: list[int] | None = None
    mean: float | None = None
    lo: float | None = None
    hi: float | None = None
    trajectory: dict[str, Any] | None = None  # the gap along training: tokens_per_param and per-seed gaps
    trend: dict[str, Any] | None = None

    @property
    def primary(self) -> bool:
        return self.role == PRIMARY

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> JudgedComparison:
        return JudgedComparison(**_known(JudgedComparison, raw))


@dataclass(frozen=True)
class JudgedClaim:
    """One claim of the paper with its verdict, its comparisons (the primary decides) and notes."""

    claim: str = ""
    statement: str = ""
    paper: str = ""
    verdict: str = INCONCLUSIVE
    untestable: str = ""
    comparisons: tuple[JudgedComparison, ...] = ()
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """ "C5" of "C5" or of "C1 (contrast: …)"."""
        return self.claim.split()[0] if self.claim else ""

    def primary_first(self) -> list[JudgedComparison]:
        """The comparisons with the primary first, as the terminal's table lists them (the verdict is the
        primary's; a secondary read first would look like the reason for it)."""
        return sorted(self.comparisons, key=lambda c: not c.primary)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> JudgedClaim:
        known = _known(JudgedClaim, raw)
        comparisons = known.get("comparisons", [])
        if not isinstance(comparisons, list):
            raise TypeError("a claim's comparisons are a list")
        known["comparisons"] = tuple(JudgedComparison.from_dict(c) for c in comparisons)
        known["notes"] = tuple(str(n) for n in known.get("notes", []))
        known["verdict"] = str(known.get("verdict", INCONCLUSIVE))
        return JudgedClaim(**known)


@dataclass(frozen=True)
class Findings:
    """A findings.json: the recipe, scale and title it came from (none when the claims were judged from a folder of
    runs directly), its judged claims, and the numbers behind its figures."""

    claims: tuple[JudgedClaim, ...]
    title: str = ""
    recipe: str | None = None
    scale: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Findings:
        claims = raw.get("claims")
        if not isinstance(claims, list):
            raise KeyError("claims")
        known = {"title", "recipe", "scale", "claims"}
        return Findings(
            claims=tuple(JudgedClaim.from_dict(c) for c in claims),
            title=str(raw.get("title", raw.get("recipe", ""))),
            recipe=raw.get("recipe"),
            scale=raw.get("scale"),
            numbers={k: v for k, v in raw.items() if k not in known},
        )
