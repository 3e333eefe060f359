"""Matplotlib figures that mirror the paper's, from measurement results (no model needed).

Every function returns a ``matplotlib.figure.Figure`` built without pyplot, so no GUI backend is chosen
and no global figure state is touched (rendering uses Agg); :func:`png` renders one to PNG bytes,
:func:`save` to a file.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from smallinit.io import write_atomic
from smallinit.measures.norm_factor import rmsnorm_factor
from smallinit.measures.residual_flow import ResidualFlowSweep
from smallinit.report.arrange import value

DPI = 90
# The smallest text a figure draws, in points: 11.25 px at DPI, so still ≥ 10 px when a figure up to
# 1.125 × the report's 1150 px column is shown scaled to it. Figures are sized to fit that column.
SMALL = 9


def png(fig: Figure, dpi: int = DPI) -> bytes:
    buf = io.BytesIO()
    # constrained layout places every label and legend; the tight box keeps a legend wider than its estimate whole
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.05)
    return buf.getvalue()


def save(fig: Figure, path: str | Path, dpi: int = DPI) -> Path:
    path = Path(path)
    data = png(fig, dpi)
    write_atomic(path, lambda f: f.write(data))
    return path


def canvas(ncols: int = 1, nrows: int = 1, w: float = 5.0, h: float = 3.6) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _widen_for(legend) -> None:
    """Make the figure wider by the legend's width, so a long legend leaves the plots their planned size."""
    fig = legend.get_figure(root=True)
    fig.set_figwidth(fig.get_figwidth() + legend.get_window_extent().width / fig.dpi)


LEGEND_ROWS = 16  # a taller legend than its figure collapses the axes: more entries go into further columns


def legend_right(ax, **kw) -> None:
    """The legend beside the axes, never over the data (constrained layout makes room for it)."""
    n = len(ax.get_legend_handles_labels()[0])
    if n:
        _widen_for(
            ax.legend(
                loc="upper left",
                bbox_to_anchor=(1.02, 1.0),
                borderaxespad=0.0,
                fontsize=SMALL,
                ncols=math.ceil(n / LEGEND_ROWS),
                **kw,
            )
        )


Series = Sequence[tuple[float, float]]  # (x, y) points of one seed


def seed_mean(seeds: Sequence[Series]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x, mean, lowest and highest over seeds, at the x that every seed has."""
    by_x: dict[float, list[float]] = {}
    for series in seeds:
        for x, y in series:
            by_x.setdefault(float(x), []).append(float(y))
    xs = sorted(x for x, ys in by_x.items() if len(ys) == len(seeds))
    ys = np.array([by_x[x] for x in xs]).reshape(len(xs), len(seeds))
    return np.array(xs), ys.mean(axis=1), ys.min(axis=1), ys.max(axis=1)


def _plot_seeds(
    ax, seeds: Sequence[Series], color, label: str | None = None, band_alpha: float = 0.2, **kw
) -> None:
    """The mean over seeds as a line; with two or more seeds, the range between them as a band."""
    x, mean, lo, hi = seed_mean(seeds)
    if not len(x):
        return
    ax.plot(x, mean, color=color, label=label, **kw)
    if len(seeds) > 1:
        ax.fill_between(x, lo, hi, color=color, alpha=band_alpha, lw=0)


def _colors(labels: Sequence[str]) -> dict[str, tuple]:
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def _panels(
    panels: Mapping[str, Mapping[str, Any]], ncols_per_panel: int = 1, w: float = 4.6, h: float = 3.4
) -> tuple[Figure, list[np.ndarray], dict[str, tuple]]:
    """One row of axes per panel title (several panels side by side when each is one axes), and one colour
    per curve label, the same in every panel."""
    n = max(1, len(panels))
    per_row = min(n, 2) if ncols_per_panel == 1 else 1  # two panels and a legend fit the page's column
    rows = math.ceil(n / per_row)
    fig, axes = canvas(ncols=per_row * ncols_per_panel, nrows=rows, w=w, h=h)
    flat = [
        axes[i // per_row, (i % per_row) * ncols_per_panel : (i % per_row + 1) * ncols_per_panel]
        for i in range(n)
    ]
    for extra in axes.flat[n * ncols_per_panel :]:
        extra.set_visible(False)
    labels = list(dict.fromkeys(label for curves in panels.values() for label in curves))
    return fig, flat, _colors(labels)


def shared_legend(fig: Figure, title: str | None) -> None:
    """One legend for every panel, right of them: each label once, in order of first appearance."""
    handles: dict[str, Any] = {}
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    if handles:
        _widen_for(
            fig.legend(
                list(handles.values()),
                list(handles),
                loc="outside right upper",
                fontsize=SMALL,
                title=title,
                title_fontsize=SMALL,
            )
        )


def norm_factor_figure(
    d: int = 2048, eps: Sequence[float] = (1e-5, 1e-12), gammas: Sequence[float] | None = None
) -> Figure:
    """Fig. 1c: the RMSNorm factor (σ² + ε)^(−1/2), σ² = d^(−2γ), against γ for two ε, and the ideal 1/σ."""
    g = np.linspace(0.25, 1.5, 126) if gammas is None else np.asarray(gammas, dtype=float)
    fig, ax = canvas()
    ax = ax[0, 0]
    for e in eps:
        ax.plot(g, rmsnorm_factor(g, e, d), lw=2.5, label=f"ε = {value(e)}")
    ax.plot(g, np.power(float(d), g), "k--", lw=1, label="ideal 1/σ = d^γ")
    ax.set_yscale("log")
    ax.set_xlabel("γ")
    ax.set_ylabel("RMSNorm factor")
    ax.set_title(f"RMSNorm factor at init, d = {d}")
    legend_right(ax)
    ax.grid(alpha=0.3)
    return fig


def loss_curves_figure(
    panels: Mapping[str, Mapping[str, Mapping[str, Sequence[Series]]]], legend_title: str | None = None
) -> Figure:
    """Loss curves, one panel per title: ``{panel: {curve: {"train": [per-seed [(step, loss)]], "val": [...]}}}``.
    Each curve is the mean over its seeds (train thin, validation thick with markers), its band the range
    over the seeds; one legend beside the panels."""
    fig, axes, colors = _panels(panels, w=4.6, h=3.4)
    for (title, curves), (ax,) in zip(panels.items(), axes):
        for label, c in curves.items():
            if c.get("train"):
                _plot_seeds(
                    ax,
                    c["train"],
                    colors[label],
                    None if c.get("val") else label,
                    lw=0.9,
                    alpha=0.8,
                    band_alpha=0.12,
                )
            if c.get("val"):
                _plot_seeds(ax, c["val"], colors[label], label, lw=2, marker="o", ms=3)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    shared_legend(fig, legend_title)
    return fig


def grid_figure(
    panels: Mapping[str, tuple[np.ndarray, Sequence[str], Sequence[str]]],
    *,
    row_label: str,
    col_label: str,
    title: str,
) -> Figure:
    """Heatmaps of final losses (mean over seeds) with the numbers written in the cells, one panel per
    ``{panel title: (values, row labels, column labels)}``, on one colour scale."""
    shapes = [np.asarray(v, dtype=float).shape for v, _, _ in panels.values()]
    n_rows, n_cols = max(s[0] for s in shapes), max(s[1] for s in shapes)
    per_row = min(len(panels), 3)
    fig, axes = canvas(
        ncols=per_row, nrows=math.ceil(len(panels) / per_row), w=1.3 * n_cols + 1.6, h=0.6 * n_rows + 1.6
    )
    finite = np.concatenate([np.asarray(v, dtype=float).ravel() for v, _, _ in panels.values()])
    finite = finite[np.isfinite(finite)]
    norm = matplotlib.colors.Normalize(*(finite.min(), finite.max()) if len(finite) else (0, 1))
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (panel, (values, rows, cols)) in zip(axes.flat, panels.items()):
        values = np.asarray(values, dtype=float)
        im = ax.imshow(values, cmap="viridis_r", norm=norm, aspect="auto")
        ax.set_xticks(range(len(cols)), labels=list(cols))
        ax.set_yticks(range(len(rows)), labels=list(rows))
        ax.set_xlabel(col_label)
        ax.set_ylabel(row_label)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                if math.isfinite(values[i, j]):
                    r, g, b, _ = im.cmap(norm(values[i, j]))
                    # readable on light and dark cells
                    ink = "k" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "w"
                    ax.text(j, i, f"{values[i, j]:.4f}", ha="center", va="center", color=ink)
        ax.set_title(textwrap.fill(panel, 32) if panel else title)  # a long setting must not widen its panel
    if any(panels):
        fig.suptitle(title)
    fig.colorbar(im, ax=list(axes.flat[: len(panels)]), shrink=0.8)
    return fig


def uniform_label(seq_len: int | None) -> str:
    return f"uniform attention (T = {seq_len})" if seq_len else "uniform attention"


Reference = float | Sequence[float]  # one value for every layer, or one per layer (a sliding window's differ)


def sink_figure(
    panels: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    legend_title: str | None = None,
    uniform: Mapping[str, Mapping[str, Reference]] | None = None,
) -> Figure:
    """Fig. 1f/g: sink score per layer, ``{panel: {model: [per-seed scores by layer]}}``; each line the mean
    over seeds, its band their range. ``uniform``: ``{panel: {label: score}}``, dashed, the score of evenly
    spread attention, the reference a score is read against (noise far below it on a zoomed axis is no sink)."""
    fig, axes, colors = _panels(panels)
    for (title, models), (ax,) in zip(panels.items(), axes):
        for label, seeds in models.items():
            _plot_seeds(
                ax, [list(enumerate(s, start=1)) for s in seeds], colors[label], label, marker="o", ms=4
            )
        # after the data: last in the legend
        for i, (label, ref) in enumerate((uniform or {}).get(title, {}).items()):
            style = {"color": "0.3", "lw": 1.2, "ls": ("--", "-.", ":")[i % 3], "label": label}
            if isinstance(ref, (int, float)):
                ax.axhline(ref, **style)
            else:
                ax.plot(range(1, len(ref) + 1), ref, **style)
        ax.set_xlabel("layer")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("sink score (weight on token 1)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    shared_legend(fig, legend_title)
    return fig


def residual_fit(points: Sequence[tuple[float, float]], d: int) -> tuple[float, float]:
    """Least-squares line through (γ, ln ratio): the ratio ≈ c·d^(−k·γ), returned as (c, k). The paper's
    d^(1−γ) is k = 1."""
    g = np.asarray([p[0] for p in points], dtype=float)
    log_r = np.log(np.asarray([p[1] for p in points], dtype=float))
    slope, intercept = np.polyfit(g, log_r, 1)
    return float(np.exp(intercept)), float(-slope / math.log(d))


def residual_prediction(points: Sequence[tuple[float, float]], d: int) -> float:
    """c of the paper's c·d^(1−γ) through the measured points at the γ nearest 1 (their geometric mean)."""
    g = np.asarray([p[0] for p in points], dtype=float)
    r = np.asarray([p[1] for p in points], dtype=float)
    near = np.isclose(g, g[np.argmin(np.abs(g - 1.0))])
    return float(np.exp(np.mean(np.log(r[near] / float(d) ** (1 - g[near])))))


def residual_flow_figure(series: Mapping[str, tuple[int, Sequence[tuple[float, float]]]]) -> Figure:
    """Fig. 3a: residual-flow ratio at init against γ, one colour per ``{label: (width d, [(γ, ratio)])}``:
    the measured points, the least-squares fit through them (dotted) and the paper's d^(1−γ) through the
    points at the γ nearest 1 (dashed)."""
    fig, ax = canvas()
    ax = ax[0, 0]
    colors = _colors(list(series))
    for label, (d, points) in series.items():  # one legend entry per setting: many settings fit
        g = np.asarray([p[0] for p in points], dtype=float)
        line = np.linspace(g.min() - 0.05, g.max() + 0.05, 100)
        color = colors[label]
        if len(set(g)) > 1:
            c, k = residual_fit(points, d)
            ax.plot(line, c * np.power(float(d), -k * line), ":", color=color)
            label = f"{label}: fit ∝ d^(−{k:.2f}γ)"
        ax.scatter(g, [p[1] for p in points], color=color, zorder=3, label=label)
        c = residual_prediction(points, d)
        ax.plot(line, c * np.power(float(d), 1 - line), "--", color=color, lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("γ")
    ax.set_ylabel("‖h_L − e‖ / ‖e‖")
    ax.set_title("residual flow at init")
    legend_right(
        ax,
        title="dots: measured; dotted: their fit;\ndashed: the paper's d^(1−γ) through γ = 1",
        title_fontsize=SMALL,
    )
    ax.grid(alpha=0.3)
    return fig


def residual_sweep_figure(sweep: ResidualFlowSweep) -> Figure:
    """Residual-flow ratio against width per γ (log-log) with fitted and predicted exponents."""
    fig, axes = canvas(ncols=2, w=4.4)
    ax, ax2 = axes[0]
    d = np.asarray(sweep.widths, dtype=float)
    for gi, gamma in enumerate(sweep.gammas):
        mean = np.exp(np.log(sweep.ratios[gi]).mean(axis=1))
        ax.plot(d, mean, marker="o", color=f"C{gi}", label=f"γ = {gamma:g}: slope {sweep.slopes[gi]:+.2f}")
        ax.plot(d, mean[0] * (d / d[0]) ** (1 - gamma), ls=":", color=f"C{gi}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("width d")
    ax.set_ylabel("‖h_L − e‖ / ‖e‖")
    ax.set_title("ratio vs width (dotted: d^(1−γ))")
    legend_right(ax)
    ax.grid(alpha=0.3)
    g = np.asarray(sweep.gammas)
    ax2.plot(g, 1 - g, "k--", label="predicted 1 − γ")
    ax2.fill_between(g, 1 - g - 0.15, 1 - g + 0.15, color="0.85", label="± 0.15")
    spread = sweep.seed_slopes.std(axis=1, ddof=1) if sweep.seed_slopes.shape[1] > 1 else np.zeros(len(g))
    ax2.errorbar(g, sweep.slopes, yerr=spread, fmt="o", color="C3", label="measured exponent (± seed sd)")
    ax2.set_xlabel("γ")
    ax2.set_ylabel("exponent of d")
    ax2.set_title("fitted exponent vs prediction")
    legend_right(ax2)
    ax2.grid(alpha=0.3)
    return fig


@dataclass(frozen=True)
class Course:
    """One measure drawn over training: its key in a curve's table, its axis label and title, its scale, and
    what its axes say where no run recorded it."""

    key: str
    ylabel: str
    title: str
    log: bool = False
    missing: str = "no run here recorded it"


CONDENSATION = (
    Course("stable_rank", "stable rank ‖W‖_F²/‖W‖_2²", "stable rank"),
    Course("mean_abs_cos", "mean |cos| between rows", "row alignment"),
)
WEIGHT_RMS = (
    Course("rms", "median over matrices of RMS(W)", "weight RMS", log=True),
    Course(
        "rms_ratio",
        "median over matrices of RMS(W) / √(η/λ)",
        "against weight decay's √(η/λ)",
        missing="no run here recorded √(η/λ): weight decay off,\nor a Monitor not given steady_rms\n(smallinit's trainer gives it)",
    ),
)
OUTLIERS = (
    Course("max_attention_logit", "largest scale·q·k over layers", "attention logits"),
    Course("massive", "max |h| / median |h|, largest layer", "massive activations", log=True),
)


def courses_figure(
    panels: Mapping[str, Mapping[str, Mapping[str, Sequence[Series]]]],
    courses: Sequence[Course],
    legend_title: str | None = None,
) -> Figure:
    """Measures over training, one row of axes per panel title and one axes per course:
    ``{panel: {curve: {course.key: [per-seed [(step, v)]]}}}``; the line is the mean over seeds, the band their
    range (:data:`CONDENSATION`: stable rank and mean |cos|, averaged over the logged matrices; :data:`OUTLIERS`:
    the largest attention logit and the massive-activation ratio, each the largest over layers; :data:`WEIGHT_RMS`:
    the logged matrices' median RMS, alone and over √(η/λ))."""
    fig, rows, colors = _panels(panels, ncols_per_panel=len(courses), w=4.6, h=3.2)
    for (title, curves), axes in zip(panels.items(), rows):
        for label, s in curves.items():
            for ax, c in zip(axes, courses):
                if s.get(c.key):
                    _plot_seeds(ax, s[c.key], colors[label], label, marker=".")
        for ax, c in zip(axes, courses):
            ax.set_ylabel(c.ylabel)
            ax.set_title(f"{title}: {c.title}".lstrip(": "), fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if not any(any(s.get(c.key) or ()) for s in curves.values()):  # bare axes read as a failed plot
                ax.text(0.5, 0.5, c.missing, ha="center", va="center", transform=ax.transAxes, fontsize=SMALL)
            elif c.log:
                ax.set_yscale("log")
    shared_legend(fig, legend_title)
    return fig


def heatmaps_figure(snapshots: Sequence[Mapping]) -> Figure:
    """Row-cosine heatmaps: one row per matrix, one column per snapshot step (clustered row order)."""
    names = list(dict.fromkeys(n for s in snapshots for n in s["matrices"]))
    fig, axes = canvas(ncols=max(1, len(snapshots)), nrows=max(1, len(names)), w=2.3, h=2.3)
    norm = matplotlib.colors.Normalize(0, 1)  # every panel on one scale, so its colour bar reads them all
    for j, snap in enumerate(snapshots):
        for i, name in enumerate(names):
            ax = axes[i, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if name in snap["matrices"]:
                ax.imshow(snap["matrices"][name], norm=norm, cmap="magma", interpolation="nearest")
                cos = snap.get("mean_abs_cos", {}).get(name, float("nan"))
                ax.set_title(f"step {snap['step']}, mean|cos| {cos:.2f}", fontsize=SMALL)
            if j == 0:
                ax.set_ylabel(_wrapped(name.replace(".weight", "")), fontsize=SMALL)
    bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm, "magma"), ax=axes.ravel().tolist(), shrink=0.6)
    bar.set_label("|cos| between two rows", fontsize=SMALL)
    bar.ax.tick_params(labelsize=SMALL)
    return fig


def _wrapped(name: str, width: int = 26) -> str:
    """A dotted parameter name on lines of at most ``width`` characters, broken after a dot, so that a long one
    (gpt_neox.layers.0.attention.query_key_value) stays beside its own row of panels."""
    lines = [""]
    for part in name.split("."):
        piece = part if not lines[-1] else "." + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += "."
            lines.append(part)
        else:
            lines[-1] += piece
    return "\n".join(lines)


# the two panels of a token-level comparison: (result field, y label, title)
def gap_figure(panels: Mapping[str, Mapping[str, Sequence[Series]]]) -> Figure:
    """Loss gaps along training, one panel per claim: ``{claim: {comparison: [per-seed [(tokens per
    non-embedding parameter, gap)]]}}``, > 0 the paper's direction; the mean over seeds with their range.
    A verdict is stated at the budget the runs reached; the curve shows how the gap got there."""
    fig, axes, colors = _panels(panels, w=4.6, h=3.4)
    for (title, curves), (ax,) in zip(panels.items(), axes):
        ax.axhline(0.0, color="k", lw=0.8)
        for label, seeds in curves.items():
            _plot_seeds(ax, seeds, colors[label], label, lw=1.8, marker="o", ms=3)
        ax.set_xlabel("tokens per non-embedding parameter")
        ax.set_ylabel("loss gap (nats/token)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    shared_legend(fig, "> 0: the paper's direction")
    return fig
