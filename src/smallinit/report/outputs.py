"""The report's sections for the single commands' outputs: smallinit coordcheck, analyze and eval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from smallinit.analysis.coordcheck import CoordCheck
from smallinit.analysis.result import AnalysisResult
from smallinit.report import model_figures
from smallinit.report.markup import h2, img, note, or_dash, table


def render_coordchecks(checks: list[tuple[str, CoordCheck]]) -> list[str]:
    parts = []
    for name, cc in checks:
        parts += [
            h2("Coordinate check over γ"),
            note(
                f"{name}: fresh models per γ, {cc.steps} {cc.optimizer} steps; activation RMS per layer and the relative "
                "size of the first update. A layer whose scale moves with γ here is one the init decides."
            ),
            img(model_figures.coordcheck_figure(cc), "coordinate check"),
            table(
                ["layer", *[f"γ={g:g}, step 0" for g in cc.gammas]],
                [[n, *cc.series("activation", n, 0)] for n in cc.names("activation")],
            ),
        ]
    return parts


ANALYSIS_HEADER = [
    "file",
    "step",
    "loss",
    "tokens",
    "sink mean",
    "Sink_0.3 (share of heads)",
    "residual flow",
    "min norm factor",
    "median stable rank / min(m,n)",
    "median mean |cos|",
]


@dataclass(frozen=True)
class AnalysesSection:
    rows: list[list[Any]]  # one per analysis.json, ANALYSIS_HEADER's columns
    not_measured: list[str]  # what analyze could not measure on a model, and why


def analyses_section(analyses: list[tuple[str, AnalysisResult]]) -> AnalysesSection | None:
    if not analyses:
        return None
    rows = [
        [
            n,
            or_dash(a.step),
            a.loss,
            a.tokens,
            or_dash(a.sink.mean) if a.sink else "–",
            a.sink.share_above.get(0.3, "–") if a.sink else "–",
            or_dash(a.residual_flow),
            min(a.norm_factor.values()) if a.norm_factor else "–",
            float(np.median([m.stable_rank_fraction for m in a.matrices])) if a.matrices else "–",
            float(np.median([m.mean_abs_cos for m in a.matrices])) if a.matrices else "–",
        ]
        for n, a in analyses
    ]
    missing = [
        f"{n}: {what} not measured: {why}" for n, a in analyses for what, why in a.not_measured.items()
    ]
    return AnalysesSection(rows, missing)


def render_analyses(s: AnalysesSection) -> list[str]:
    return [
        h2("Single-model analyses (smallinit analyze)"),
        table(ANALYSIS_HEADER, s.rows),
        *(note(line) for line in s.not_measured),
    ]


def eval_rows(evals: list[tuple[str, dict]]) -> list[list[Any]]:
    """lm-evaluation-harness results written by ``smallinit eval`` (RUN/eval/results-*.json): file, task, metric,
    value, stderr."""
    rows = []
    for name, raw in evals:
        for task, metrics in sorted(raw["results"].items()):
            for metric, value in sorted(metrics.items()):
                if isinstance(value, (int, float)) and not isinstance(value, bool) and "stderr" not in metric:
                    stderr = metrics.get(metric.replace(",", "_stderr,", 1))
                    rows.append(
                        [name, task, metric, value, stderr if isinstance(stderr, (int, float)) else "–"]
                    )
    return rows


def render_evals(rows: list[list[Any]]) -> list[str]:
    return [
        h2("Benchmarks (smallinit eval, lm-evaluation-harness)"),
        table(["file", "task", "metric", "value", "stderr"], rows),
    ]


def parse_evals(raw: dict) -> dict:
    if not isinstance(raw.get("results"), dict) or "smallinit" not in raw:
        raise KeyError("results")
    return raw
