"""The report's opening: the paper's claims with their verdicts (from a recipe's findings.json, else judged from
the runs found, by the recipes' own functions), or, for a folder that holds no study, each run's diagnosis."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smallinit.analysis.tokens import TokenGapResult
from smallinit.measures.residual_flow import ResidualFlowSweep
from smallinit.monitor.runs import Run
from smallinit.report import figures
from smallinit.report.diagnosis import Diagnosis
from smallinit.report.markup import details, esc, h2, img, note, prose_table, verdict_badge
from smallinit.study.judging.claims import Runs, gaps_from_compares, judge_all
from smallinit.study.judging.findings_file import Findings, JudgedClaim, JudgedComparison
from smallinit.study.judging.verdicts import AGREE, DISAGREE, INCONCLUSIVE, NOT_TESTABLE

JUDGED_HERE = "the paper's claims, judged from the runs in this folder"


def judge_folder(
    runs: list[Run],
    sweeps: list[tuple[str, ResidualFlowSweep]],
    compares: list[tuple[str, TokenGapResult]],
    folders: Sequence[Path] = (),
) -> Findings:
    """C1–C7 judged from the runs, residual-flow sweep and token comparisons found here, by the same functions as
    the recipes (so a folder of hand-made runs is judged exactly as a recipe's would be): a sweep's cells below
    ``folders`` as the recipe reads them (an interrupted cell counted, :meth:`Runs.found`), other runs finished."""
    flow = sweeps[0][1].to_dict() if sweeps else None
    claims = judge_all(
        Runs.found(runs, *folders), flow, gaps_from_compares(res.to_dict() for _, res in compares)
    )
    return Findings(tuple(JudgedClaim.from_dict(c.to_dict()) for c in claims), title=JUDGED_HERE)


CLAIM_ARMS = ("model.gamma", "model.norm_eps", "model.gate")  # the settings the paper's claims compare


def a_study(runs: list[Run], judged: Findings) -> bool:
    """The runs make arms a claim compares (they differ in γ, ε or the gate), or some claim got a verdict."""
    arms = any(len({json.dumps(r.config.get(k)) for r in runs}) > 1 for k in CLAIM_ARMS)
    return arms or any(c.verdict in (AGREE, DISAGREE, INCONCLUSIVE) for c in judged.claims)


Trajectories = dict[str, dict[str, list]]  # {claim: {comparison: per-seed [(tokens per parameter, gap)]}}


@dataclass(frozen=True)
class ClaimsSection:
    """One table of judged claims: where it came from, a row per claim, and its loss gaps along training."""

    heading: str
    origin: str
    claims: tuple[JudgedClaim, ...]
    gaps: Trajectories


def claims_section(name: str, findings: Findings) -> ClaimsSection:
    origin = (
        f"{name}: recipe {findings.recipe}, scale {findings.scale or '?'}."
        if findings.recipe is not None
        else (
            "Runs are paired by seed and selected by their configs (γ, ε, gate, size); parts a claim needs that "
            "the folder lacks are marked not measured."
        )
    )
    return ClaimsSection(
        f"Claims and verdicts: {findings.title or name}",
        origin,
        findings.claims,
        _gap_panels(findings.claims),
    )


def _gap_panels(claims: tuple[JudgedClaim, ...]) -> Trajectories:
    panels: Trajectories = {}
    for c in claims:
        for comp in c.comparisons:
            t = comp.trajectory
            if t and t.get("gaps"):
                panels.setdefault(c.claim, {})[comp.label] = [  # from the first step on
                    [(x, y) for x, y in zip(t["tokens_per_param"], g) if x > 0] for g in t["gaps"]
                ]
    return panels


RULE = (
    "Each comparison is judged from its per-seed numbers by one rule for every claim "
    "(smallinit.study.judging.verdicts: Student-t over seeds; each claim's verdict is its pre-declared primary "
    "comparison's, Holm over the table's primaries; the others are secondary; not testable here where a "
    "precondition fails; described in docs/experiments.md)."
)


def reason(c: JudgedClaim) -> str:
    """Why a claim got its verdict, in full: its primary's reason (the verdict is the primary's), else the
    precondition of the whole claim that failed."""
    first = c.primary_first()
    return (first[0].reason if first else "") or c.untestable


def one_line(c: JudgedClaim) -> str:
    """The reason in one line: the primary's label and its reason up to the first parenthesis (a failed
    precondition up to its first clause too); the rest is folded beneath it."""
    first = c.primary_first()
    why = reason(c).split(" (", 1)[0]
    if c.verdict == NOT_TESTABLE:
        why = why.split("; ", 1)[0]
    label = first[0].label if first else ""
    return f"{label}: {why}" if label and why else label or why or "no comparison"


def _comparison_item(x: JudgedComparison, told: str) -> str:
    """One comparison; its reason only where it is not the claim's own (``told``), which is already shown."""
    return (
        f"<li>{'primary: ' if x.primary else ''}{esc(x.text)}: {esc(x.verdict)}"
        + (f"; {esc(x.magnitude)}" if x.magnitude else "")
        + (f" ({esc(x.reason)})" if x.reason and x.reason not in x.text and x.reason != told else "")
        + "</li>"
    )


def _claim_row(c: JudgedClaim) -> list[str]:
    told = reason(c)
    items = "".join(_comparison_item(x, told) for x in c.primary_first())
    notes = [n for n in c.notes if n != told]
    detail = (
        (f"<p>{esc(told)}</p>" if told else "")
        + f"<ul>{items}</ul>"
        + (f"<p>{esc('; '.join(notes))}</p>" if notes else "")
    )
    n = len(c.comparisons)
    return [
        esc(c.claim),
        esc(c.statement),
        esc(c.paper),
        verdict_badge(c.verdict),
        f"{esc(one_line(c))}"
        + details(
            f"{n} comparison{'s' if n != 1 else ''}, the full reason{' and notes' if notes else ''}", detail
        ),
    ]


def caveat(text: str, claim: JudgedClaim | None = None) -> str:
    """A figure's caveat, beside it: how the figure stands to the claim that judges what it shows, and that
    claim's verdict and one-line reason when it was judged here."""
    judged = f" {esc(claim.key)}: {verdict_badge(claim.verdict)} {esc(one_line(claim))}." if claim else ""
    return f'<p class="caveat">{esc(text)}{judged}</p>'


def render_claims(s: ClaimsSection) -> list[str]:
    parts = [
        h2(s.heading),
        note(f"{s.origin} {RULE}"),
        prose_table(("claim", "statement", "the paper", "verdict", "why"), [_claim_row(c) for c in s.claims]),
    ]
    if s.gaps:
        parts.append(
            note(
                "Each loss comparison along training. A gap is judged at the budget its runs reached; its trend "
                "(each seed's slope against log tokens over the second half, tested across seeds) is printed "
                "beside the verdict and does not withhold it."
            )
        )
        parts.append(img(figures.gap_figure(s.gaps), "loss gaps along training"))
    return parts


def render_diagnoses(diagnoses: list[Diagnosis]) -> list[str]:
    """Each run's own measurements and what they mean for it, for a folder that holds no study."""
    parts = []
    for dg in diagnoses:
        parts.append(h2(f"Your run: {dg.run}"))
        parts.append(  # prose that wraps, as the claims table's: a reader sees every column at any width
            prose_table(
                ("measured", "value", "against", "what it means for this run"),
                [[esc(f.what), esc(f.value), esc(f.reference), esc(f.meaning)] for f in dg.observations],
            )
        )
    parts.append(
        note(
            "No claim of the paper can be judged from "
            + ("this run" if len(diagnoses) == 1 else "these runs")
            + ": each compares arms paired by seed (γ = 0.5 against γ = 1, ε = 1e-5 against 1e-12, no gate "
            "against a gate), at least 2 seeds an arm, trained alike. smallinit recipes lists studies that do; "
            "smallinit plan prices one before it runs."
        )
    )
    return parts
