"""Figures and the HTML report; writers for the outputs of ``smallinit analyze / compare / coordcheck``."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..analysis.coordcheck import CoordCheck
from ..analysis.measure import ANALYSIS_FILE, default_output_dir
from ..analysis.residual_flow import ResidualFlowSweep
from ..analysis.tokens import TokenGapResult
from ..io import write_result
from . import figures
from .html import build_report

__all__ = [
    "build_report", "compare_output_dir", "write_analysis", "write_compare", "write_coordcheck", "write_sweep",
]


def write_analysis(result: dict, out_dir: str | os.PathLike) -> list[Path]:
    """``smallinit analyze`` output: analysis.json and its figures in ``out_dir``."""
    out = Path(out_dir)
    return [write_result(out / ANALYSIS_FILE, result), *figures.analysis_figures(result, out)]


def compare_output_dir(result: TokenGapResult) -> Path:
    """Where ``smallinit compare`` writes by default: with A's other measurements, RUN_A/analysis/compare-B
    (B's label, in characters safe for a folder name), so a report of A's folder or its sweep finds it."""
    label_b = re.sub(r"[^\w.=-]+", "-", str(result.meta.get("label_b", "B"))).strip("-.") or "B"
    return default_output_dir(result.meta["checkpoint_a"]) / f"compare-{label_b}"


def write_compare(result: TokenGapResult, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """``smallinit compare`` output: compare.json and token_gap.png in ``out_dir``, else
    :func:`compare_output_dir`."""
    out = Path(out_dir) if out_dir is not None else compare_output_dir(result)
    path = result.save(out)
    la, lb = result.meta.get("label_a", "A"), result.meta.get("label_b", "B")
    return [path, figures.save(figures.token_gap_figure(result, la, lb), out / "token_gap.png")]


def write_coordcheck(cc: CoordCheck, out_dir: str | os.PathLike) -> list[Path]:
    out = Path(out_dir)
    path = cc.save(out)
    return [path, figures.save(figures.coordcheck_figure(cc), out / "coordcheck.png")]


def write_sweep(sweep: ResidualFlowSweep, out_dir: str | os.PathLike) -> list[Path]:
    out = Path(out_dir)
    path = sweep.save(out)
    return [path, figures.save(figures.residual_sweep_figure(sweep), out / "residual_flow_sweep.png")]
