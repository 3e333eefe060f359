"""Weight norms in the report: each setting's matrix RMS over training, alone and against √(η/λ), the steady
state decoupled weight decay drives it to (Q2 asks whether the γ gap washes out there)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from smallinit.report import figures
from smallinit.report.arrange import Groups
from smallinit.report.markup import h2, img, note, table


@dataclass(frozen=True)
class WeightsSection:
    panels: dict[
        str, dict[str, dict[str, list]]
    ]  # panel → curve → "rms" | "rms_ratio" → per seed (step, median)
    legend_title: str
    rows: list[list]  # per setting, its first and last step: name, step, median RMS, median RMS / √(η/λ)


def weights_section(groups: Groups) -> WeightsSection | None:
    """The settings whose Monitor recorded matrix RMS (runs from before it was recorded have none)."""
    panels: dict[str, dict[str, dict[str, list]]] = {}
    rows = []
    for panel, curve, group in groups.items():
        recs = [r.analysis for r in group if any(a.by_matrix("rms") for a in r.analysis)]
        if not recs:
            continue
        c = {
            key: [
                [(a.step, statistics.median(v.values())) for a in rr if (v := a.by_matrix(key))]
                for rr in recs
            ]
            for key in ("rms", "rms_ratio")
        }
        panels.setdefault(panel, {})[curve] = c
        steps, rms, _, _ = figures.seed_mean(c["rms"])
        ratio = dict(zip(*figures.seed_mean(c["rms_ratio"])[:2])) if any(c["rms_ratio"]) else {}
        if len(steps):
            rows += [[Groups.name(panel, curve), steps[i], rms[i], ratio.get(steps[i], "—")] for i in (0, -1)]
    if not panels:
        return None
    return WeightsSection(panels, groups.legend_title, rows)


def render_weights(s: WeightsSection) -> list[str]:
    return [
        h2("Weight norms: matrix RMS over training"),
        note(
            "The median over the logged matrices (analysis.matrices) of each matrix's RMS, and of its RMS over "
            "√(η/λ) (its optimizer's peak rate over its weight decay, where it decays): decoupled weight decay "
            "pulls every matrix towards a steady state set by η and λ whatever γ drew it, once Σηλ passes 1. "
            "Line: mean over seeds, band: their range. Q2 (smallinit's question, not a claim of the paper) asks "
            "whether the γ gap washes out there."
        ),
        img(
            figures.courses_figure(s.panels, figures.WEIGHT_RMS, s.legend_title),
            "weight RMS over training",
        ),
        table(["setting", "step (first, last)", "median RMS", "median RMS / √(η/λ)"], s.rows),
    ]
