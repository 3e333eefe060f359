"""Condensation in the report: stable rank and row alignment over training, and the row-cosine heatmaps of the
settings C6 judges first."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smallinit.monitor import load_snapshots
from smallinit.monitor.runs import Run
from smallinit.report import figures
from smallinit.report.arrange import Groups
from smallinit.report.markup import esc, h2, img, note, table
from smallinit.study.judging.claims import BASELINE, EMULATED, FIXED, Runs, reference_lr

HEATMAPS_SHOWN = 2  # settings whose row-cosine heatmaps are open; the others are folded away


def c6_judged(groups: Sequence[Sequence[Run]]) -> dict[int, int]:
    """{id(group): rank} of the settings C6 judges, smallest size first: γ 0.5 and 1 of the first arm (fixed,
    else the emulated baseline, else the plain one) that has runs, as claims.c6 chooses them; their heatmaps
    are the ones a reader checks its verdict against, so they are shown first. Like the claims, only the runs at
    the reference learning rate count (the others belong to the learning-rate check)."""
    main = {id(r) for r in reference_lr(Runs([r for g in groups for r in g]))}
    for arm in (FIXED, EMULATED, BASELINE):
        found = [
            g
            for g in groups
            if g and id(g[0]) in main and g[0].matches(arm) and g[0].config.get("model.gamma") in (0.5, 1.0)
        ]
        if found:
            ordered = sorted(found, key=lambda g: (g[0].size, -float(g[0].config["model.gamma"])))
            return {id(g): i for i, g in enumerate(ordered)}
    return {}


@dataclass(frozen=True)
class Heatmaps:
    label: str  # the setting
    snapshots: list[Mapping[str, Any]]  # early, one in between, late; of the setting's first seed
    judged: bool  # an arm C6 judges


@dataclass(frozen=True)
class CondensationSection:
    panels: dict[
        str, dict[str, dict[str, list]]
    ]  # panel → curve → measure → per seed (step, mean over matrices)
    legend_title: str
    rows: list[list[Any]]  # per setting, its first and last step: name, step, stable rank, mean |cos|
    heatmaps: list[Heatmaps]  # the settings C6 judges first


def condensation_section(groups: Groups) -> CondensationSection | None:
    panels: dict[str, dict[str, dict[str, list]]] = {}
    rows = []
    for panel, curve, group in groups.items():
        recs = [r.analysis for r in group if r.analysis and r.analysis[0].matrices]
        if not recs:
            continue
        c = {
            "stable_rank": [
                [(a.step, statistics.fmean(s.values())) for a in rr if (s := a.by_matrix("stable_rank"))]
                for rr in recs
            ],
            "mean_abs_cos": [
                [(a.step, statistics.fmean(c.values())) for a in rr if (c := a.by_matrix("mean_abs_cos"))]
                for rr in recs
            ],
        }
        panels.setdefault(panel, {})[curve] = c
        (steps, rank, _, _), (_, cos, _, _) = (
            figures.seed_mean(c[k]) for k in ("stable_rank", "mean_abs_cos")
        )
        if len(steps):
            rows += [[Groups.name(panel, curve), steps[i], rank[i], cos[i]] for i in (0, -1)]  # first, last
    judged = c6_judged([group for _, _, group in groups.items()])
    heatmaps = []
    for panel, curve, group in sorted(groups.items(), key=lambda g: judged.get(id(g[2]), len(judged))):
        sn = load_snapshots(group[0].path)
        if sn:
            chosen = [sn[0], sn[len(sn) // 2], sn[-1]] if len(sn) > 2 else sn
            heatmaps.append(Heatmaps(Groups.name(panel, curve), chosen, id(group) in judged))
    if not panels and not heatmaps:
        return None
    return CondensationSection(panels, groups.legend_title, rows, heatmaps)


def render_condensation(s: CondensationSection) -> list[str]:
    parts = [
        h2("Condensation: stable rank and row alignment over training"),
        note(
            "Stable rank ‖W‖_F²/‖W‖_2² and mean |cos| between rows, averaged over the logged matrices "
            "(analysis.matrices); line: mean over seeds, band: their range. The paper: with γ = 1 matrices first "
            "condense (low stable rank, aligned rows), then expand; with γ = 0.5 they start diffuse and change "
            "slowly."
        ),
    ]
    if s.panels:
        parts.append(
            img(
                figures.courses_figure(s.panels, figures.CONDENSATION, s.legend_title),
                "stable rank and mean cos over training",
            )
        )
        parts.append(table(["setting", "step (first, last)", "stable rank", "mean |cos|"], s.rows))
    shown = [
        f"<h3>Row |cos| heatmaps, {esc(h.label)} (first seed{'; an arm C6 judges' if h.judged else ''})</h3>"
        + img(figures.heatmaps_figure(h.snapshots), f"row cosine heatmaps, {h.label}")
        for h in s.heatmaps
    ]
    parts.append("".join(shown[:HEATMAPS_SHOWN]))
    if len(shown) > HEATMAPS_SHOWN:
        more = len(shown) - HEATMAPS_SHOWN
        parts.append(
            f'<details class="heatmaps"><summary>row |cos| heatmaps of {more} more setting'
            f"{'s' if more > 1 else ''}</summary>{''.join(shown[HEATMAPS_SHOWN:])}</details>"
        )
    return parts
