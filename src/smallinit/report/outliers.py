"""Logit growth and massive activations in the report: the largest attention logit (what Megatron logs to catch
logit growth) and the residual stream's largest |h| over its median (Sun et al.'s massive activations) over
training, per setting, and for the models smallinit analyze measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smallinit.analysis.result import AnalysisResult
from smallinit.measures.massive import MASSIVE_RATIO
from smallinit.report import figures
from smallinit.report.arrange import Groups
from smallinit.report.markup import h2, img, note, or_dash, table


@dataclass(frozen=True)
class OutliersSection:
    panels: dict[str, dict[str, dict[str, list]]]  # panel → curve → measure → per seed (step, largest layer)
    legend_title: str
    rows: list[list[Any]]  # per setting's first and last record, per analysis: name, step, logit, ratio, dims


def _dims(dims: tuple[tuple[int, ...], ...]) -> str:
    """The dimensions holding massive activations, over layers, in order of first appearance."""
    found = list(dict.fromkeys(d for layer in dims for d in layer))
    return ", ".join(map(str, found)) or "none"


def outliers_section(groups: Groups, analyses: list[tuple[str, AnalysisResult]]) -> OutliersSection | None:
    panels: dict[str, dict[str, dict[str, list]]] = {}
    rows: list[list[Any]] = []
    for panel, curve, group in groups.items():
        recs = [[a for a in r.analysis if a.max_attention_logit or a.massive] for r in group]
        recs = [rr for rr in recs if rr]
        if not recs:
            continue
        panels.setdefault(panel, {})[curve] = {
            "max_attention_logit": [
                [(a.step, max(a.max_attention_logit)) for a in rr if a.max_attention_logit] for rr in recs
            ],
            "massive": [[(a.step, max(a.massive.ratio)) for a in rr if a.massive] for rr in recs],
        }
        first = recs[0]  # the first seed's course: where a massive dimension sits is a seed's own
        rows += [[Groups.name(panel, curve), *_row(a)] for a in (first[0], first[-1])]
    rows += [[name, *_row(a)] for name, a in analyses if a.max_attention_logit or a.massive]
    return OutliersSection(panels, groups.legend_title, rows) if rows else None


def _row(a) -> list[Any]:
    return [
        or_dash(getattr(a, "step", None)),
        max(a.max_attention_logit) if a.max_attention_logit else "–",
        max(a.massive.ratio) if a.massive else "–",
        _dims(a.massive.dims) if a.massive else "–",
    ]


def render_outliers(s: OutliersSection) -> list[str]:
    parts = [
        h2("Attention logits and massive activations"),
        note(
            "Largest attention logit: the maximum of scale·q·k over layers, heads and the keys each query may see, "
            "before softmax (a logit that keeps growing saturates the softmax). Massive activations: per layer, "
            "the residual stream's max |h| over its median |h|; the dimensions listed hold an activation of at "
            f"least {MASSIVE_RATIO:g}× the median on some token (Sun et al., 2024). Line: mean over seeds, band: "
            "their range; the table's rows are a setting's first seed, first and last measurement."
        ),
    ]
    if s.panels:
        parts.append(
            img(
                figures.courses_figure(s.panels, figures.OUTLIERS, s.legend_title),
                "attention logits, massive activations",
            )
        )
    parts.append(
        table(["model", "step", "largest logit", "max |h| / median |h|", "massive dimensions"], s.rows)
    )
    return parts
