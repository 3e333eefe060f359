"""One self-contained HTML report for a run folder or a sweep folder.

Everything the report shows is read from files the other commands wrote: run folders (config.json,
metrics.jsonl with the analysis callback's records, summary.json, analysis/rowcos_step_*.npz), and
analysis.json / compare.json / coordcheck.json / residual_flow_sweep.json / findings.json (a recipe's
judged claims) anywhere below the folder. Without findings.json the claims C1–C7 are judged from the runs
found, by the recipes' own functions (smallinit.experiments.claims): there is one definition of each claim.
Figures are PNGs embedded as base64 data URIs; there are no scripts, no external links and no external
styles, and every piece of text that came from a file (config values, decoded corpus tokens and contexts)
is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .. import __version__
from ..analysis.callback import load_snapshots
from ..analysis.coordcheck import CoordCheck
from ..analysis.norm_factor import init_variance, relative_factor, rmsnorm_factor, saturation_gamma
from ..analysis.residual_flow import ResidualFlowSweep
from ..analysis.tokens import TokenGapResult
from ..errors import SmallinitError
from ..train.checkpoint import write_text_atomic
from ..train.runs import Run, find_runs, read_json
from . import figures

ANALYSIS_FILE = "analysis.json"
COMPARE_FILE = "compare.json"
COORDCHECK_FILE = "coordcheck.json"
SWEEP_FILE = "residual_flow_sweep.json"
FINDINGS_FILE = "findings.json"  # written by smallinit.experiments (recipe / demo): claims with verdicts
REPORT_FILE = "report.html"


class ReportError(SmallinitError):
    """The folder holds nothing a report can be made from."""


# -- reading ------------------------------------------------------------------------------------------------


def varying_keys(runs: Sequence[Run]) -> list[str]:
    keys = sorted({k for r in runs for k in r.config})
    return [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1]


# -- writing ------------------------------------------------------------------------------------------------


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def num(x: Any, digits: int = 4) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        return esc(x)
    x = float(x)
    if not math.isfinite(x):
        return "–"
    return f"{x:.{digits}g}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:.{digits}f}".rstrip("0").rstrip(".")


def img(fig: Figure, alt: str) -> str:
    data = base64.b64encode(figures.png(fig)).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{num(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1150px;margin:24px auto;
padding:0 16px;color:#222;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:2em}
table{border-collapse:collapse;margin:8px 0;font-size:.88em}td,th{border:1px solid #ddd;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f3f3f3}img{max-width:100%;display:block;margin:8px 0}
.v{padding:1px 7px;border-radius:8px;font-weight:600}.agree{background:#d4f4d2}.disagree{background:#f9d0d0}
.inconclusive{background:#eee}pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:.8em}
.note{color:#555;font-size:.9em}code.tok{background:#fff3c4;padding:0 2px;white-space:pre-wrap}
"""


class _Doc:
    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []

    def h2(self, text: str) -> None:
        self.parts.append(f"<h2>{esc(text)}</h2>")

    def p(self, text: str, cls: str = "") -> None:
        c = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{c}>{esc(text)}</p>")

    def raw(self, fragment: str) -> None:
        self.parts.append(fragment)

    def render(self) -> str:
        return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{esc(self.title)}</title><style>{CSS}</style></head><body>"
                f"<h1>{esc(self.title)}</h1>" + "\n".join(self.parts) + "</body></html>\n")


def group_runs(runs: Sequence[Run], vary: Sequence[str]) -> dict[str, list[Run]]:
    """Runs that differ only in the seed, under one label made of the other varying keys."""
    keys = [k for k in vary if k != "train.seed"]
    groups: dict[str, list[Run]] = {}
    for r in runs:
        label = ", ".join(f"{k.split('.')[-1]}={r.config.get(k)}" for k in keys) or "all runs"
        groups.setdefault(label, []).append(r)
    return groups


def _mean_series(series: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Mean over seeds at the steps every series has."""
    by_step: dict[int, list[float]] = {}
    for ser in series:
        for step, v in ser:
            by_step.setdefault(int(step), []).append(float(v))
    return [(st, statistics.fmean(v)) for st, v in sorted(by_step.items()) if len(v) == len(series)]


def _grid(runs: Sequence[Run], row_key: str, col_key: str) -> tuple[np.ndarray, list, list] | None:
    rows = sorted({r.config.get(row_key) for r in runs}, key=str)
    cols = sorted({r.config.get(col_key) for r in runs}, key=str)
    if len(rows) < 2 or len(cols) < 2:
        return None
    vals = np.full((len(rows), len(cols)), np.nan)
    for i, rv in enumerate(rows):
        for j, cv in enumerate(cols):
            losses = [r.val_loss for r in runs
                      if r.config.get(row_key) == rv and r.config.get(col_key) == cv and r.val_loss is not None]
            if losses:
                vals[i, j] = statistics.fmean(losses)
    return vals, rows, cols


def _judge(runs: list[Run], sweeps: list[tuple[str, ResidualFlowSweep]],
           compares: list[tuple[str, TokenGapResult]]) -> dict[str, Any]:
    """C1–C7 judged from the finished runs, residual-flow sweep and token comparisons found here, by the same
    functions as the recipes (so a folder of hand-made runs is judged exactly as a recipe's would be)."""
    from ..experiments.claims import Runs, gaps_from_compares, judge_all  # experiments builds on report

    flow = sweeps[0][1].to_dict() if sweeps else None
    claims = judge_all(Runs.finished(runs), flow, gaps_from_compares(res.to_dict() for _, res in compares))
    return {"title": "the paper's claims, judged from the runs in this folder", "claims": [c.to_dict() for c in claims]}


def _section_findings(doc: _Doc, findings: list[tuple[str, dict]]) -> None:
    for name, f in findings:
        doc.h2(f"Claims and verdicts: {f.get('title', f.get('recipe', name))}")
        origin = f"{name}: recipe {f['recipe']}, scale {f.get('scale', '?')}." if "recipe" in f else (
            "Runs are paired by seed and selected by their configs (γ, ε, gate, size); parts a claim needs that "
            "the folder lacks are marked not measured.")
        doc.p(f"{origin} Each comparison is judged by smallinit.report.verdict (agree / disagree when the mean "
              "over seeds is more than 2 standard errors from 0, inconclusive otherwise or with one seed); a claim "
              "agrees when all its comparisons agree.", "note")
        rows = []
        for c in f.get("claims", []):
            label = str(c.get("verdict", "inconclusive"))
            why = "".join(f"<li>{esc(x.get('text', ''))}: {esc(x.get('verdict', ''))}"
                          + (f" ({esc(x['reason'])})" if x.get("reason") and x["reason"] not in x.get("text", "") else "")
                          + "</li>" for x in c.get("comparisons", []))
            rows.append(f"<tr><td>{esc(c.get('claim', ''))}</td><td>{esc(c.get('statement', ''))}</td>"
                        f"<td>{esc(c.get('paper', ''))}</td><td><ul>{why}</ul>{esc('; '.join(c.get('notes', [])))}</td>"
                        f'<td><span class="v {esc(label)}">{esc(label)}</span></td></tr>')
        head = "".join(f"<th>{h}</th>" for h in ("claim", "statement", "the paper", "measured", "verdict"))
        doc.raw(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _section_runs(doc: _Doc, runs: list[Run], vary: list[str]) -> None:
    doc.h2(f"Runs ({len(runs)})")
    if not runs:
        doc.p("No run folders (config.json + metrics.jsonl) here.")
        return
    doc.raw(table(["run", *vary, "steps", "final val loss"],
                  [[r.name, *[r.config.get(k) for k in vary], r.summary.get("step", "–"),
                    "–" if r.val_loss is None else r.val_loss] for r in runs]))
    common = {k: v for k, v in sorted(runs[0].config.items()) if k not in vary}
    doc.raw(f"<details><summary>settings shared by every run</summary><pre>"
            f"{esc(json.dumps(common, indent=1, default=str))}</pre></details>")


def _section_norm_factor(doc: _Doc, runs: list[Run], analyses: list[tuple[str, dict]]) -> None:
    d = 2048
    doc.h2("RMSNorm factor against γ (Fig. 1c)")
    doc.raw(img(figures.norm_factor_figure(d), "RMSNorm factor against gamma"))
    gs = (0.5, 0.6, 0.75, 1.0, 1.25)
    doc.raw(table(["γ", "σ² = d^(−2γ)", "factor, ε=1e-5", "factor, ε=1e-12", "ideal 1/σ",
                   "relative, ε=1e-5", "relative, ε=1e-12"],
                  [[g, init_variance(g, d), rmsnorm_factor(g, 1e-5, d), rmsnorm_factor(g, 1e-12, d), d**g,
                    relative_factor(g, 1e-5, d), relative_factor(g, 1e-12, d)] for g in gs]))
    doc.p(f"At d = {d} and ε = 1e-5 the factor starts to saturate (σ² < 10ε) above γ = "
          f"{saturation_gamma(1e-5, d, 10):.2f} and is pinned (σ² < ε) above γ = {saturation_gamma(1e-5, d):.2f}.",
          "note")
    rows = []
    for r in runs:
        recs = r.analysis
        if recs:
            nf = recs[0]["norm_factor"]
            rows.append([r.name, recs[0]["step"], min(nf.values()), statistics.fmean(nf.values())])
    for name, a in analyses:
        nf = a["norm_factor"]
        rows.append([name, a.get("step", "–"), min(nf.values()), statistics.fmean(nf.values())])
    if rows:
        doc.p("Measured factor relative to the ideal 1/σ(h) (1 = the norm sees the scale), over the norms:")
        doc.raw(table(["model", "step", "min over norms", "mean over norms"], rows))


def _section_losses(doc: _Doc, runs: list[Run], vary: list[str]) -> None:
    curves = {}
    for label, group in group_runs(runs, vary).items():
        train = _mean_series([[(m["step"], m["loss"]) for m in r.metrics if "loss" in m and "event" not in m]
                              for r in group])
        val = _mean_series([[(m["step"], m["val_loss"]) for m in r.metrics if "val_loss" in m] for r in group])
        if train or val:
            curves[f"{label} ({len(group)} seed{'s' if len(group) > 1 else ''})"] = {"train": train, "val": val}
    if not curves:
        return
    doc.h2("Loss curves (mean over seeds)")
    doc.raw(img(figures.loss_curves_figure(curves), "loss curves"))
    for row_key, col_key, title in (("model.gamma", "model.norm_eps", "γ × ε"), ("model.gamma", "model.gate", "γ × gate")):
        g = _grid(runs, row_key, col_key)
        if g is None:
            continue
        vals, rows, cols = g
        doc.h2(f"Final validation loss, {title} (mean over seeds)")
        doc.raw(img(figures.grid_figure(vals, [str(x) for x in rows], [str(x) for x in cols], row_label=row_key,
                                        col_label=col_key, title=f"final val loss, {title}"), f"loss grid {title}"))
        doc.raw(table([f"{row_key} \\ {col_key}", *map(str, cols)],
                      [[str(rv), *vals[i]] for i, rv in enumerate(rows)]))


def _section_sink(doc: _Doc, runs: list[Run], vary: list[str], analyses: list[tuple[str, dict]]) -> None:
    per_layer = {}
    for label, group in group_runs(runs, vary).items():
        lasts = [r.analysis[-1] for r in group if r.analysis]
        if lasts:
            layers = np.mean([[a["sink"][k] for k in sorted(a["sink"], key=int)] for a in lasts], axis=0)
            per_layer[f"{label} @ step {lasts[0]['step']}"] = layers.tolist()
    for name, a in analyses:
        per_layer[name] = a["sink"]["per_layer"]
    if not per_layer:
        return
    doc.h2("Attention sink per layer (Fig. 1f/g)")
    doc.p("Sink score: mean attention weight that queries 2…T put on token 1, over sequences and heads, at the "
          "last measurement during training (mean over seeds), and from smallinit analyze.", "note")
    doc.raw(img(figures.sink_figure(per_layer), "sink scores per layer"))
    doc.raw(table(["model", "mean", *[f"L{i + 1}" for i in range(max(map(len, per_layer.values())))]],
                  [[k, statistics.fmean(v), *v] for k, v in per_layer.items()]))


def _section_residual(doc: _Doc, runs: list[Run], sweeps: list[tuple[str, ResidualFlowSweep]]) -> None:
    points_by_d: dict[int, list[tuple[float, float]]] = {}
    for r in runs:
        init = [a for a in r.analysis if a["step"] == 0]
        if init:
            points_by_d.setdefault(int(r.config["model.d_model"]), []).append(
                (float(r.config["model.gamma"]), float(init[0]["residual_flow"])))
    if not points_by_d and not sweeps:
        return
    doc.h2("Residual flow (Fig. 3a)")
    doc.p("‖h_L − e‖/‖e‖, mean over tokens; the paper predicts ≍ d^(1−γ): the residual branch dominates for "
          "γ < 1, balances at γ = 1 and vanishes above.", "note")
    if points_by_d:
        d = max(points_by_d, key=lambda k: len(points_by_d[k]))
        pts = sorted(points_by_d[d])
        doc.raw(img(figures.residual_flow_figure(pts, d), "residual flow against gamma"))
        doc.raw(table(["γ", "ratio at init", "d^(1−γ)"], [[g, v, d ** (1 - g)] for g, v in pts]))
    for name, sw in sweeps:
        doc.p(f"Width sweep {name}: widths {sw.widths}, seeds {sw.seeds}, depth {sw.base_config.get('n_layers')}.")
        doc.raw(img(figures.residual_sweep_figure(sw), "residual flow width sweep"))
        doc.raw(table(["γ", "predicted 1 − γ", "measured exponent", "seed sd"],
                      [[g, 1 - g, s, float(np.std(sw.seed_slopes[i], ddof=1)) if len(sw.seeds) > 1 else float("nan")]
                       for i, (g, s) in enumerate(zip(sw.gammas, sw.slopes))]))


def _section_condensation(doc: _Doc, runs: list[Run], vary: list[str]) -> None:
    series = {}
    groups = group_runs(runs, vary)
    for label, group in groups.items():
        with_recs = [r.analysis for r in group if r.analysis and r.analysis[0].get("stable_rank")]
        if with_recs:
            series[label] = {key: _mean_series([[(a["step"], statistics.fmean(a[key].values())) for a in recs
                                                 if a.get(key)] for recs in with_recs])
                             for key in ("stable_rank", "mean_abs_cos")}
    snaps = [(label, load_snapshots(group[0].path)) for label, group in groups.items()]
    snaps = [(label, sn) for label, sn in snaps if sn]
    if not series and not snaps:
        return
    doc.h2("Condensation: stable rank and row alignment over training")
    doc.p("Stable rank ‖W‖_F²/‖W‖_2² and mean |cos| between rows, averaged over the logged matrices "
          "(analysis.matrices) and over seeds. The paper: with γ = 1 matrices first condense (low stable rank, aligned rows), "
          "then expand; with γ = 0.5 they start diffuse and change slowly.", "note")
    if series:
        doc.raw(img(figures.condensation_figure(series), "stable rank and mean cos over training"))
        doc.raw(table(["run", "first step", "stable rank", "mean |cos|", "last step", "stable rank", "mean |cos|"],
                      [[k, s["stable_rank"][0][0], s["stable_rank"][0][1], s["mean_abs_cos"][0][1],
                        s["stable_rank"][-1][0], s["stable_rank"][-1][1], s["mean_abs_cos"][-1][1]]
                       for k, s in series.items() if s["stable_rank"] and s["mean_abs_cos"]]))
    for label, sn in snaps[:4]:  # early, one in between, late; the first seed of up to four settings
        chosen = [sn[0], sn[len(sn) // 2], sn[-1]] if len(sn) > 2 else sn
        doc.raw(img(figures.heatmaps_figure(chosen, f"row |cos| heatmaps, {label}"), f"row cosine heatmaps, {label}"))


def _section_tokens(doc: _Doc, compares: list[tuple[str, TokenGapResult]]) -> None:
    for name, res in compares:
        la, lb = res.meta.get("label_a", "A"), res.meta.get("label_b", "B")
        doc.h2(f"Token level: {la} vs {lb}")
        doc.p(f"{res.tokens:,} tokens; mean Δ_sym {res.mean_delta_sym:+.4f}; mean loss {la} {res.mean_loss_a:.4f}, "
              f"{lb} {res.mean_loss_b:.4f}. Δ_sym = (p_A − p_B)/(p_A + p_B) on the true next token, A = {la}; "
              f"difficulty = mean of the two losses, quantile bins. ({name})", "note")
        doc.raw(img(figures.token_gap_figure(res, la, lb), "token gap by difficulty"))
        doc.raw(table(["bin", "difficulty from", "to", "tokens", "mean Δ_sym", "SE", f"loss {lb} − {la}", "SE"],
                      [[i + 1, b.lo, b.hi, b.count, b.mean_delta_sym, b.se_delta_sym, b.mean_loss_diff, b.se_loss_diff]
                       for i, b in enumerate(res.bins)]))
        for title, items in ((f"largest gaps where {la} is better", res.top_a),
                             (f"largest gaps where {lb} is better", res.top_b)):
            if not items:
                continue
            rows = "".join(
                f"<tr><td><code class=\"tok\">{esc(t.context_text)}</code></td>"
                f"<td><code class=\"tok\">{esc(t.target_text)}</code></td><td>{num(t.p_a)}</td>"
                f"<td>{num(t.p_b)}</td><td>{num(t.delta_sym)}</td></tr>" for t in items)
            doc.raw(f"<h3>{esc(title)}</h3><table><thead><tr><th>context</th><th>true token</th>"
                    f"<th>p {esc(la)}</th><th>p {esc(lb)}</th><th>Δ_sym</th></tr></thead><tbody>{rows}</tbody></table>")


def _section_coordcheck(doc: _Doc, checks: list[tuple[str, CoordCheck]]) -> None:
    for name, cc in checks:
        doc.h2("Coordinate check over γ")
        doc.p(f"{name}: fresh models per γ, {cc.steps} AdamW steps; activation RMS per layer and the relative size "
              "of the first update. A layer whose scale moves with γ here is one the init decides.", "note")
        doc.raw(img(figures.coordcheck_figure(cc), "coordinate check"))
        acts = cc.names("activation")
        doc.raw(table(["layer", *[f"γ={g:g}, step 0" for g in cc.gammas]],
                      [[n, *cc.series("activation", n, 0)] for n in acts]))


def _section_analyses(doc: _Doc, analyses: list[tuple[str, dict]]) -> None:
    if not analyses:
        return
    doc.h2("Single-model analyses (smallinit analyze)")
    doc.raw(table(["file", "step", "loss", "tokens", "sink mean", "residual flow", "min norm factor",
                   "median stable rank / min(m,n)", "median mean |cos|"],
                  [[n, a.get("step"), a.get("loss"), a.get("tokens"), a["sink"]["mean"], a["residual_flow"],
                    min(a["norm_factor"].values()),
                    float(np.median([m["stable_rank_fraction"] for m in a["matrices"]])),
                    float(np.median([m["mean_abs_cos"] for m in a["matrices"]]))] for n, a in analyses]))


def _section_evals(doc: _Doc, evals: list[tuple[str, dict]]) -> None:
    """lm-evaluation-harness results written by ``smallinit eval`` (RUN/eval/results-*.json)."""
    if not evals:
        return
    doc.h2("Benchmarks (smallinit eval, lm-evaluation-harness)")
    rows = []
    for name, raw in evals:
        for task, metrics in sorted(raw["results"].items()):
            for metric, value in sorted(metrics.items()):
                if isinstance(value, (int, float)) and not isinstance(value, bool) and "stderr" not in metric:
                    stderr = metrics.get(metric.replace(",", "_stderr,", 1))
                    rows.append([name, task, metric, value, stderr if isinstance(stderr, (int, float)) else "–"])
    doc.raw(table(["file", "task", "metric", "value", "stderr"], rows))


def _evals(raw: dict) -> dict:
    if not isinstance(raw.get("results"), dict) or "smallinit" not in raw:
        raise KeyError("results")
    return raw


def _analysis(raw: dict) -> dict:
    for key in ("sink", "residual_flow", "norm_factor", "matrices"):
        if key not in raw:
            raise KeyError(key)
    return raw


def _findings(raw: dict) -> dict:
    if not isinstance(raw.get("claims"), list):
        raise KeyError("claims")
    return raw


def _load_all(root: Path, name: str, parse) -> list[tuple[str, Any]]:
    out = []
    for path in sorted(root.rglob(name)):
        raw = read_json(path)
        if isinstance(raw, dict):
            try:
                out.append((str(path.relative_to(root)), parse(raw)))
            except (KeyError, TypeError, ValueError):
                continue  # not ours, or from another version: skip rather than fail the report
    return out


def build_report(root: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write ROOT/report.html (or ``out``) for a run or sweep folder; returns its path."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder; pass a run folder or a sweep folder")
    runs = find_runs(root)
    analyses = _load_all(root, ANALYSIS_FILE, _analysis)
    compares = _load_all(root, COMPARE_FILE, TokenGapResult.from_dict)
    checks = _load_all(root, COORDCHECK_FILE, CoordCheck.from_dict)
    sweeps = _load_all(root, SWEEP_FILE, ResidualFlowSweep.from_dict)
    findings = _load_all(root, FINDINGS_FILE, _findings)
    evals = _load_all(root, "results-step_*.json", _evals)
    if not (runs or analyses or compares or checks or sweeps or findings or evals):
        raise ReportError(f"{root} holds no runs nor analysis outputs; pass a folder written by smallinit "
                          "train, sweep, analyze, compare or coordcheck")
    vary = varying_keys(runs)
    doc = _Doc(f"smallinit report: {root.resolve().name}")
    doc.p(f"Folder {root.resolve()} · smallinit {__version__} · {len(runs)} run(s), {len(analyses)} analysis, "
          f"{len(compares)} comparison, {len(checks)} coordinate check and {len(sweeps)} sweep file(s).", "note")
    if not findings and (runs or sweeps or compares):  # a recipe's findings already judge its runs
        findings = [(str(root), _judge(runs, sweeps, compares))]
    _section_findings(doc, findings)
    _section_runs(doc, runs, vary)
    _section_norm_factor(doc, runs, analyses)
    _section_losses(doc, runs, vary)
    _section_sink(doc, runs, vary, analyses)
    _section_residual(doc, runs, sweeps)
    _section_condensation(doc, runs, vary)
    _section_tokens(doc, compares)
    _section_coordcheck(doc, checks)
    _section_analyses(doc, analyses)
    _section_evals(doc, evals)
    path = Path(out) if out is not None else root / REPORT_FILE
    write_text_atomic(path, doc.render())
    return path
