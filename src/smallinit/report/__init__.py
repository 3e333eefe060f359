"""Figures and the HTML report; writers for the outputs of ``smallinit analyze / compare / coordcheck``."""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from smallinit.analysis.coordcheck import CoordCheck
from smallinit.analysis.measure import ANALYSIS_FILE, default_output_dir
from smallinit.analysis.result import AnalysisResult
from smallinit.analysis.tokens import TokenGapResult
from smallinit.io import write_result
from smallinit.measures.condensation import MatrixStat
from smallinit.measures.massive import MASSIVE_RATIO
from smallinit.measures.residual_flow import ResidualFlowSweep
from smallinit.measures.sink import uniform_sink
from smallinit.report import figures, model_figures
from smallinit.report.html import build_report

__all__ = [
    "analysis_lines",
    "build_report",
    "compare_output_dir",
    "write_analysis",
    "write_compare",
    "write_coordcheck",
    "write_sweep",
]


def write_analysis(result: AnalysisResult, out_dir: str | os.PathLike) -> list[Path]:
    """``smallinit analyze`` output: analysis.json and its figures in ``out_dir``."""
    out = Path(out_dir)
    return [write_result(out / ANALYSIS_FILE, result.to_dict()), *model_figures.analysis_figures(result, out)]


def analysis_lines(result: AnalysisResult, seq_len: int | None) -> list[str]:
    """What ``smallinit analyze`` prints of a result (a run's, or a Hugging Face model's, which has no γ or
    step): each number with what it is and what to compare it with."""
    cfg = result.run_config
    m = cfg.model if cfg else None
    sink = result.sink
    if result.seq_len is not None:  # what it measured on (a Hugging Face model's default included)
        seq_len = result.seq_len
    where = f"step {result.step}" if m else Path(result.checkpoint).name
    span = f"queries 2…{seq_len}" if seq_len else "queries 2…T"
    even = sink.uniform if sink else None  # from the layers' own masks (a sliding window included)
    if even is None and seq_len and seq_len >= 2:
        even = uniform_sink(seq_len)
    uniform = f"attention spread evenly gives {even:.4f}; " if even is not None else ""
    flow_scale = (
        f"at initialisation the paper has it scale as d^(1−γ), here {m.d_model ** (1 - m.gamma):.3g} "
        f"for d = {m.d_model}, γ = {m.gamma:g}, up to a constant: "
        if m
        else ""
    )
    factor_init = (
        f"; at initialisation this config gives {result.norm_factor_analytic:.4f}"
        if result.norm_factor_analytic is not None
        else ""
    )
    lines = [f"{where}: loss {result.loss:.4f} nats/token on {result.tokens:,} tokens"]
    if sink:
        lines += [
            f"sink score {sink.mean:.4f}: mean attention weight on token 1 of {span}, over layers and heads "
            f"({uniform}1 = every query looks only at token 1)",
            f"Sink_0.3 {sink.share_above[0.3]:.0%}: the share of (layer, head) pairs whose mean attention on "
            "token 1 exceeds 0.3, the sink literature's measure (Gu et al. 2025)",
        ]
    if result.residual_flow is not None:
        lines.append(
            f"residual flow {result.residual_flow:.4g}: ‖h_L − e‖/‖e‖, how far the final norm's input "
            f"moved from the embedding ({flow_scale}compare it with models of another γ or width at the same step)"
        )
    if result.norm_factor:
        lines.append(
            f"min norm factor {min(result.norm_factor.values()):.4f}: the smallest norm factor over the "
            f"ideal 1/σ of its input (1 = the norm sees the input's scale{factor_init})"
        )
    if result.max_attention_logit:
        top = max(result.max_attention_logit)
        layer = result.max_attention_logit.index(top) + 1
        lines.append(
            f"largest attention logit {top:.4g} (layer {layer}): max scale·q·k before softmax over the keys a "
            "query may see; one that grows along training saturates the softmax"
        )
    if result.massive:
        ratio = max(result.massive.ratio)
        dims = list(dict.fromkeys(d for layer in result.massive.dims for d in layer))
        lines.append(
            f"massive activations: max |h| / median |h| of the residual stream {ratio:.4g} at its largest "
            f"layer; {f'dimensions {dims} hold' if dims else 'no dimension holds'} an activation ≥ "
            f"{MASSIVE_RATIO:g}× the median (Sun et al. 2024)"
        )
    lines += _stable_rank_lines(result.matrices)
    lines += [f"not measured, {key}: {why}" for key, why in result.not_measured.items()]
    return lines + [f"note, {note}" for note in result.notes]


def _stable_rank_lines(mats: Sequence[MatrixStat]) -> list[str]:
    """The stable rank analyze computes, median and lowest over the weight matrices."""
    if not mats:
        return []
    low = min(mats, key=lambda m: m.stable_rank_fraction)
    median = statistics.median(m.stable_rank_fraction for m in mats)
    return [
        f"stable rank ‖W‖_F²/‖W‖_2²: median {median:.1%} of min(m, n) over {len(mats)} matrices, lowest "
        f"{low.stable_rank:.1f} of {min(low.shape)} ({low.name}); a small share = condensed rows"
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
    return [path, figures.save(model_figures.token_gap_figure(result, la, lb), out / "token_gap.png")]


def write_coordcheck(cc: CoordCheck, out_dir: str | os.PathLike) -> list[Path]:
    out = Path(out_dir)
    path = cc.save(out)
    return [path, figures.save(model_figures.coordcheck_figure(cc), out / "coordcheck.png")]


def write_sweep(sweep: ResidualFlowSweep, out_dir: str | os.PathLike) -> list[Path]:
    out = Path(out_dir)
    path = sweep.save(out)
    return [path, figures.save(figures.residual_sweep_figure(sweep), out / "residual_flow_sweep.png")]
