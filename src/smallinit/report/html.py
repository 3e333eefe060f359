"""One self-contained HTML report for a run folder or a sweep folder.

Everything the report shows is read from files the other commands wrote: run folders (config.json,
metrics.jsonl with the analysis callback's records, summary.json, analysis/rowcos_step_*.npz), and
analysis.json / compare.json / coordcheck.json / residual_flow_sweep.json / findings.json (a recipe's
judged claims) anywhere below the folder. Without findings.json the claims C1–C7 are judged from the runs
found, by the recipes' own functions (smallinit.study.judging.claims): there is one definition of each claim.
Each section's data is built first, as a typed value, then rendered (smallinit.report.markup holds the HTML
primitives). Figures are PNGs embedded as base64 data URIs; there are no scripts, no external links and no
external styles, and every piece of text that came from a file (config values, decoded corpus tokens and
contexts) is HTML-escaped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smallinit.analysis.coordcheck import CoordCheck
from smallinit.analysis.measure import ANALYSIS_FILE
from smallinit.analysis.result import AnalysisResult
from smallinit.analysis.tokens import TokenGapResult
from smallinit.errors import SmallinitError
from smallinit.io import make_folder, read_json, write_text_atomic
from smallinit.measures.residual_flow import ResidualFlowSweep
from smallinit.monitor.runs import Run, find_runs
from smallinit.report.arrange import Groups, arm_keys, varying_keys
from smallinit.report.claims import a_study, claims_section, judge_folder, render_claims, render_diagnoses
from smallinit.report.condensation import condensation_section, render_condensation
from smallinit.report.diagnosis import diagnose
from smallinit.report.markup import note, page
from smallinit.report.measures import (
    norm_factor_section,
    render_norm_factor,
    render_residual,
    render_sink,
    residual_section,
    sink_section,
)
from smallinit.report.outliers import outliers_section, render_outliers
from smallinit.report.outputs import (
    analyses_section,
    eval_rows,
    parse_evals,
    render_analyses,
    render_coordchecks,
    render_evals,
)
from smallinit.report.runs import loss_section, render_losses, render_runs, runs_section
from smallinit.report.tokens import render_tokens, token_section
from smallinit.report.weights import render_weights, weights_section
from smallinit.study.judging.findings import FINDINGS_FILE
from smallinit.study.judging.findings_file import Findings, JudgedClaim
from smallinit.version import __version__

REPORT_FILE = "report.html"


class ReportError(SmallinitError):
    """The folder holds nothing a report can be made from."""


def _load_all(roots: Sequence[Path], base: Path, name: str, parse) -> list[tuple[str, Any]]:
    """Every file called ``name`` below the folders (each once), parsed, named by its path from ``base``."""
    out = []
    for path in sorted({p.resolve() for root in roots for p in root.rglob(name)}):
        raw = read_json(path)
        if isinstance(raw, dict):
            try:
                out.append((str(path.relative_to(base)), parse(raw)))
            except (KeyError, TypeError, ValueError):
                continue  # not ours, or from another version: skip rather than fail the report
    return out


def _find_runs(roots: Sequence[Path], base: Path) -> list[Run]:
    """The runs below the folders, each once, named by their path from ``base`` (a run folder given itself
    keeps its own name)."""
    runs: dict[Path, Run] = {}
    for root in roots:
        for r in find_runs(root):
            path = r.path.resolve()
            runs.setdefault(path, r.named(str(path.relative_to(base)) if path != base else path.name))
    return [runs[p] for p in sorted(runs)]


def build_report(
    roots: str | os.PathLike | Sequence[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    include_unfinished: bool = False,
) -> Path:
    """One report for one or more run, sweep or recipe folders: written to ``out``, else ROOT/report.html when
    there is one folder (several need ``out``); returns its path. Runs that have not finished are listed and
    marked, and drawn in the figures only with ``include_unfinished``."""
    roots = [Path(roots)] if isinstance(roots, (str, os.PathLike)) else [Path(r) for r in roots]
    for root in roots:
        if not root.is_dir():
            raise ReportError(f"{root} is not a folder; pass run, sweep or recipe folders")
    if not roots or (out is None and len(roots) > 1):
        raise ReportError(
            "one report from several folders needs a place of its own: add --out DIR"
            if roots
            else "pass at least one run, sweep or recipe folder"
        )
    base = Path(os.path.commonpath([r.resolve() for r in roots]))  # the folder itself when there is one
    runs = _find_runs(roots, base)
    analyses = _load_all(roots, base, ANALYSIS_FILE, AnalysisResult.from_dict)
    compares = _load_all(roots, base, TokenGapResult.FILE, TokenGapResult.from_dict)
    checks = _load_all(roots, base, CoordCheck.FILE, CoordCheck.from_dict)
    sweeps = _load_all(roots, base, ResidualFlowSweep.FILE, ResidualFlowSweep.from_dict)
    findings = _load_all(roots, base, FINDINGS_FILE, Findings.from_dict)
    evals = _load_all(roots, base, "results-step_*.json", parse_evals)
    folders = ", ".join(str(r) for r in roots)
    if not (runs or analyses or compares or checks or sweeps or findings or evals):
        raise ReportError(
            f"{folders} hold{'s' if len(roots) == 1 else ''} no runs nor analysis outputs; pass a "
            "folder written by smallinit train, sweep, recipe, demo, analyze, compare or coordcheck"
        )
    title = "smallinit report: " + " + ".join(r.resolve().name for r in roots)
    parts = [
        note(
            f"Folder{'s' if len(roots) > 1 else ''} {', '.join(str(r.resolve()) for r in roots)} · smallinit "
            f"{__version__} · {len(runs)} run(s), {len(analyses)} analysis, {len(compares)} comparison, "
            f"{len(checks)} coordinate check and {len(sweeps)} sweep file(s)."
        )
    ]
    parts += _sections(runs, analyses, compares, checks, sweeps, findings, evals, roots, include_unfinished)
    path = Path(out) if out is not None else roots[0] / REPORT_FILE
    make_folder(path.parent)
    write_text_atomic(path, page(title, parts))
    return path


def _sections(
    runs: list[Run],
    analyses: list[tuple[str, AnalysisResult]],
    compares: list[tuple[str, TokenGapResult]],
    checks: list[tuple[str, CoordCheck]],
    sweeps: list[tuple[str, ResidualFlowSweep]],
    findings: list[tuple[str, Findings]],
    evals: list[tuple[str, dict]],
    roots: Sequence[Path],
    include_unfinished: bool,
) -> list[str]:
    """Every section, in the order a reader meets them: the claims (or the runs' own diagnosis), the runs, then
    what was measured."""
    parts: list[str] = []
    shown: list[Findings] = []  # the claims the report shows, whose verdicts its figures name
    if findings:  # a recipe's findings judge its runs
        for name, f in findings:
            parts += render_claims(claims_section(name, f))
        shown = [f for _, f in findings]
    elif runs or sweeps or compares:
        judged = judge_folder(runs, sweeps, compares, roots)
        if not runs or a_study(runs, judged):
            parts += render_claims(claims_section(", ".join(str(r) for r in roots), judged))
            shown = [judged]
        else:  # no study here: the runs' own diagnosis first
            parts += render_diagnoses([diagnose(r) for r in runs])
    claims: dict[str, JudgedClaim] = {}
    for f in shown:
        for c in f.claims:
            claims.setdefault(c.key, c)
    vary = varying_keys(runs)
    pooled = runs if include_unfinished else [r for r in runs if r.summary]
    pooled_vary = arm_keys(pooled)
    groups = Groups.of(pooled, pooled_vary)
    # the activation sections draw only the runs that measured activations: their curves are named by what varies
    # among those (a folder whose other runs differ in lr or length would name every curve by those keys too)
    measured = [r for r in pooled if r.analysis]
    measured_groups = Groups.of(measured, arm_keys(measured))
    parts += render_runs(runs_section(runs, vary, pooled))
    parts += render_norm_factor(norm_factor_section(runs, analyses))
    sections = (
        (loss_section(pooled, pooled_vary, groups), render_losses),
        (sink_section(measured_groups, analyses), render_sink),
        (residual_section(runs, arm_keys(runs), sweeps, claims.get("C5")), render_residual),
        (condensation_section(measured_groups), render_condensation),
        (weights_section(measured_groups), render_weights),
        (outliers_section(measured_groups, analyses), render_outliers),
        (token_section(compares, claims.get("C7")), render_tokens),
        (checks, render_coordchecks),
        (analyses_section(analyses), render_analyses),
        (eval_rows(evals) if evals else None, render_evals),
    )
    for data, render in sections:
        if data is not None:
            parts += render(data)
    return parts
