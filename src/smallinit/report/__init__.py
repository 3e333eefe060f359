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
    "analysis_lines", "build_report", "compare_output_dir", "write_analysis", "write_compare", "write_coordcheck", "write_sweep",
]


def write_analysis(result: dict, out_dir: str | os.PathLike) -> list[Path]:
    """``smallinit analyze`` output: analysis.json and its figures in ``out_dir``."""
    out = Path(out_dir)
    return [write_result(out / ANALYSIS_FILE, result), *figures.analysis_figures(result, out)]


def analysis_lines(result: dict, seq_len: int) -> list[str]:
    """What ``smallinit analyze`` prints of a result: each number with what it is and what to compare it with."""
    m = result["config"]["model"]
    d, gamma = m["d_model"], m["gamma"]
    uniform = sum(1 / t for t in range(2, seq_len + 1)) / max(1, seq_len - 1)  # causal attention spread evenly
    return [
        f"step {result['step']}: loss {result['loss']:.4f} nats/token on {result['tokens']:,} tokens",
        f"sink score {result['sink']['mean']:.4f}: mean attention weight on token 1 of queries 2…{seq_len}, over "
        f"layers and heads (attention spread evenly gives {uniform:.4f}; 1 = every query looks only at token 1)",
        f"residual flow {result['residual_flow']:.4g}: ‖h_L − e‖/‖e‖, how far the last hidden state moved from the "
        f"embedding (at initialisation the paper has it scale as d^(1−γ), here {d ** (1 - gamma):.3g} for d = {d}, "
        f"γ = {gamma:g}, up to a constant: compare it with runs of another γ or width at the same step)",
        f"min norm factor {min(result['norm_factor'].values()):.4f}: the smallest RMSNorm factor over the ideal "
        f"1/σ of its input (1 = the norm sees the input's scale; at initialisation this config gives "
        f"{result['norm_factor_analytic']:.4f})",
    ]


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
