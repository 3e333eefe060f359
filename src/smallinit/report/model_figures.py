"""Figures of one model or one pair of models, for smallinit analyze, compare and coordcheck: the token-level
gap by difficulty, the coordinate check, and an analysed model's norms and matrices. Built as
:mod:`smallinit.report.figures` builds the paper's (no pyplot), with its canvas, legends and sizes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from smallinit.analysis.coordcheck import CoordCheck
from smallinit.analysis.result import AnalysisResult
from smallinit.analysis.tokens import TokenGapResult
from smallinit.measures.sink import uniform_sink
from smallinit.report.figures import (
    SMALL,
    Reference,
    canvas,
    legend_right,
    save,
    shared_legend,
    sink_figure,
    uniform_label,
)

TOKEN_PANELS = (
    ("delta_sym", "mean Δ_sym (> 0: A better)", "symmetric probability gap"),
    ("loss_diff", "mean loss(B) − loss(A)", "loss difference"),
)


def _token_axes(ax, ylabel: str, title: str) -> None:
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("difficulty bin (1 = easiest)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")


def token_gap_figure(result: TokenGapResult, label_a: str = "A", label_b: str = "B") -> Figure:
    """Δ_sym and loss difference (B − A) by difficulty quantile bin, ± 2 SE (tokens as independent)."""
    fig, axes = canvas(ncols=2, w=5.2)
    x = np.arange(1, len(result.bins) + 1)
    for ax, (key, ylabel, title) in zip(axes[0], TOKEN_PANELS):
        m = np.array([getattr(b, f"mean_{key}") for b in result.bins])
        se = np.array([getattr(b, f"se_{key}") for b in result.bins])
        ax.bar(x, m, yerr=2 * np.nan_to_num(se), color=np.where(m >= 0, "C0", "C3"), capsize=2)
        _token_axes(ax, ylabel, title)
    fig.suptitle(f"A = {label_a}, B = {label_b}; bars ± 2 SE", fontsize=SMALL)
    return fig


def token_gap_pooled_figure(
    results: Sequence[TokenGapResult], label_a: str = "A", label_b: str = "B"
) -> Figure:
    """The token-level comparison pooled over seeds: per difficulty bin (each seed's own quantiles, so bin i is
    the same share of each seed's tokens) the mean over seeds of Δ_sym and of the loss difference (B − A), ± 2 SE
    over seeds (the seeds, not the tokens, are the independent samples), and each seed's value as a dot."""
    fig, axes = canvas(ncols=2, w=5.2)
    k = min(len(r.bins) for r in results)
    x = np.arange(1, k + 1)
    for ax, (key, ylabel, title) in zip(axes[0], TOKEN_PANELS):
        per_seed = np.array([[getattr(b, f"mean_{key}") for b in r.bins[:k]] for r in results])
        m = per_seed.mean(axis=0)
        se = per_seed.std(axis=0, ddof=1) / math.sqrt(len(results)) if len(results) > 1 else np.zeros(k)
        ax.bar(
            x,
            m,
            yerr=2 * se,
            color=np.where(m >= 0, "C0", "C3"),
            alpha=0.75,
            capsize=2,
            label="mean over seeds ± 2 SE",
        )
        for row in per_seed:
            ax.plot(x, row, "o", color="k", ms=2.5, alpha=0.6)
        ax.plot([], [], "o", color="k", ms=2.5, alpha=0.6, label="one seed")
        _token_axes(ax, ylabel, title)
    fig.suptitle(f"A = {label_a}, B = {label_b}; {len(results)} seeds pooled", fontsize=SMALL)
    shared_legend(fig, None)
    return fig


def coordcheck_figure(cc: CoordCheck) -> Figure:
    """Coordinate check over γ: activation RMS per layer at the first and last step, and the relative
    update RMS(ΔW)/RMS(W) of each matrix kind after step 1."""
    g = np.asarray(cc.gammas)
    acts = cc.names("activation")
    fig, axes = canvas(ncols=3, w=3.6)
    for ax, step in zip(axes[0, :2], (0, cc.steps)):
        for i, name in enumerate(acts):
            ax.plot(
                g,
                cc.series("activation", name, step),
                marker="o",
                color=matplotlib.colormaps["viridis"](i / max(1, len(acts) - 1)),
                label=name,
            )
        ax.set_yscale("log")
        ax.set_xlabel("γ")
        ax.set_ylabel("activation RMS")
        ax.set_title(f"activations, step {step}")
        ax.grid(alpha=0.3)
    legend_right(axes[0, 1], title="layer", title_fontsize=SMALL)  # one colour per layer in both panels
    ax = axes[0, 2]
    kinds: dict[str, list[str]] = {}
    for name in cc.names("relative_update"):
        if name.endswith(".weight") and "norm" not in name:
            kinds.setdefault(name.split(".")[-2], []).append(name)
    for i, (kind, names) in enumerate(kinds.items()):
        vals = np.nanmean([cc.series("relative_update", n, 1) for n in names], axis=0)
        ax.plot(g, vals, marker="o", color=f"C{i % 10}", label=kind)
    ax.set_yscale("log")
    ax.set_xlabel("γ")
    ax.set_ylabel("RMS(ΔW) / RMS(W) after step 1")
    ax.set_title(f"relative updates, {cc.optimizer}")
    legend_right(ax, title="matrix", title_fontsize=SMALL)
    ax.grid(alpha=0.3)
    return fig


ROW_IN = 0.2  # inches per named row (a norm, a matrix): 18 px at DPI, room for one line of SMALL text


def short_names(names: Sequence[str]) -> list[str]:
    """Module names without the prefix they all share (up to a dot) and without ".weight": what tells them apart."""
    parts = [n.removesuffix(".weight").split(".") for n in names]
    k = 0  # components every name shares, each name keeping at least one of its own
    while len(parts) > 1 and all(len(p) > k + 1 and p[k] == parts[0][k] for p in parts):
        k += 1
    if k and any(p[k].isdigit() for p in parts):
        k -= 1  # "layers.0.mlp", not "0.mlp"
    return [".".join(p[k:]) for p in parts]


def norms_matrices_figure(result: AnalysisResult) -> Figure:
    """``smallinit analyze``'s norms and matrices, one row per module (the figure grows with them): each norm's
    measured factor over the ideal 1/σ of its input, and each matrix's stable rank over min(m, n) with its value
    written beside it, and its rows' mean |cos|."""
    nf, mats = result.norm_factor, result.matrices
    rows = max(len(nf), len(mats), 4)
    fig = Figure(figsize=(12.0, ROW_IN * rows + 1.6), layout="constrained")
    ax_n, ax_m = fig.subplots(1, 2, width_ratios=[1, 1.3])
    for ax, names in ((ax_n, list(nf)), (ax_m, [m.name for m in mats])):
        ax.set_yticks(range(len(names)), labels=short_names(names) if names else [], fontsize=SMALL)
        ax.set_ylim(rows - 0.5, -0.5)  # the first module on top, rows of equal height in both panels
        ax.grid(alpha=0.3, axis="x")
    ax_n.scatter(list(nf.values()), range(len(nf)), color="C0", zorder=3)
    ax_n.axvline(1.0, color="0.3", ls="--", lw=1, label="1: the norm sees its input's scale")
    ax_n.set_xlim(0, 1.1)
    ax_n.set_xlabel("measured factor / ideal 1/σ(h)")
    ax_n.set_title("RMSNorm sensitivity per norm")
    frac = [m.stable_rank_fraction for m in mats]
    ax_m.barh(range(len(mats)), frac, color="C1", height=0.7, label="stable rank / min(m, n)")
    for i, m in enumerate(mats):
        ax_m.text(frac[i] + 0.01, i, f"{m.stable_rank:.1f} of {min(m.shape)}", va="center", fontsize=SMALL)
    cos = [(i, m.mean_abs_cos) for i, m in enumerate(mats) if m.mean_abs_cos is not None]
    if cos:
        ax_m.scatter(
            [c for _, c in cos],
            [i for i, _ in cos],
            marker="D",
            s=14,
            color="C2",
            zorder=3,
            label="mean |cos| of rows",
        )
    ax_m.set_xlim(0, 1.25)  # room for the stable rank written beside each bar
    ax_m.set_xlabel("fraction")
    median = float(np.median([m.stable_rank for m in mats])) if mats else float("nan")
    ax_m.set_title(f"matrices: stable rank ‖W‖_F²/‖W‖_2² (median {median:.1f})")
    handles = [h for ax in (ax_n, ax_m) for h in ax.get_legend_handles_labels()[0]]
    # off the rows
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=SMALL)
    return fig


def analysis_figures(result: AnalysisResult, out_dir: str | Path) -> list[Path]:
    """The figures of one ``smallinit analyze`` result: sink per layer (with the uniform-attention reference
    when the result records its sequence length), norm factors and matrix stats."""
    out_dir = Path(out_dir)
    paths = []
    if result.sink:  # a model without softmax attention has none
        panel = "attention sink per layer"
        ref = sink_reference(result)
        paths.append(
            save(
                sink_figure(
                    {panel: {"model": [list(result.sink.per_layer)]}},
                    uniform={panel: dict([ref])} if ref else None,
                ),
                out_dir / "sink.png",
            )
        )
    return [*paths, save(norms_matrices_figure(result), out_dir / "norms_matrices.png")]


def sink_reference(result: AnalysisResult) -> tuple[str, Reference] | None:
    """(label, uniform-attention score) of an analyze result: per layer from the layers' own masks where it was
    measured so (a sliding window's layers differ), else from the sequence length; None when neither is recorded."""
    T = result.seq_len
    per_layer = list(result.sink.uniform_per_layer) if result.sink else []
    if per_layer:
        if max(per_layer) - min(per_layer) <= 1e-9 * max(per_layer):
            return uniform_label(T), per_layer[0]
        return f"{uniform_label(T)}, each layer's window", per_layer
    return (uniform_label(T), uniform_sink(int(T))) if T and T >= 2 else None
