"""One self-contained HTML report for a run folder or a sweep folder.

Everything the report shows is read from files the other commands wrote: run folders (config.json,
metrics.jsonl with the analysis callback's records, summary.json, analysis/rowcos_step_*.npz), and
analysis.json / compare.json / coordcheck.json / residual_flow_sweep.json / findings.json (a recipe's
judged claims) anywhere below the folder.
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
from dataclasses import dataclass, field
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
from ..config import flatten
from ..errors import SmallinitError
from ..train.checkpoint import write_text_atomic
from . import figures
from .verdict import Verdict, verdict_paired

ANALYSIS_FILE = "analysis.json"
COMPARE_FILE = "compare.json"
COORDCHECK_FILE = "coordcheck.json"
SWEEP_FILE = "residual_flow_sweep.json"
FINDINGS_FILE = "findings.json"  # written by smallinit.experiments (recipe / demo): claims with verdicts
REPORT_FILE = "report.html"
SLOPE_TOLERANCE = 0.15  # acceptance band for the residual-flow exponent against 1 − γ


class ReportError(SmallinitError):
    """The folder holds nothing a report can be made from."""


# -- reading ------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


@dataclass
class Run:
    path: Path
    name: str
    config: dict[str, Any]  # flattened: "model.gamma" → 1.0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None

    @property
    def final_val_loss(self) -> float:
        if self.summary and isinstance(self.summary.get("val_loss"), (int, float)):
            return float(self.summary["val_loss"])
        vals = [r["val_loss"] for r in self.metrics if isinstance(r.get("val_loss"), (int, float))]
        return float(vals[-1]) if vals else float("nan")

    @property
    def analysis(self) -> list[dict[str, Any]]:
        return [r for r in self.metrics if r.get("event") == "analysis"]

    def metric(self, name: str) -> float:
        """``val_loss`` (final) or ``sink_mean`` (last analysis record)."""
        if name == "val_loss":
            return self.final_val_loss
        recs = self.analysis
        return float(recs[-1][name]) if recs and name in recs[-1] else float("nan")


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a crash
            if isinstance(rec, dict):
                out.append(rec)
    return out


def find_runs(root: Path) -> list[Run]:
    runs = []
    for cfg_file in sorted(root.rglob("config.json")):
        folder = cfg_file.parent
        raw = _read_json(cfg_file)
        if not isinstance(raw, dict) or "model" not in raw or not (folder / "metrics.jsonl").exists():
            continue
        name = str(folder.relative_to(root)) if folder != root else folder.name
        summary = _read_json(folder / "summary.json")
        runs.append(Run(folder, name, flatten(raw), _read_metrics(folder / "metrics.jsonl"),
                        summary if isinstance(summary, dict) else None))
    return runs


def varying_keys(runs: Sequence[Run]) -> list[str]:
    keys = sorted({k for r in runs for k in r.config})
    return [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True) for r in runs}) > 1]


# -- claims -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    key: str  # the config key the claim varies
    baseline: Any
    treated: tuple[Any, ...]
    metric: str  # "val_loss" | "sink_mean"
    expected: str  # sign of metric(treated) − metric(baseline)


CLAIMS = (
    Claim("C1", "γ = 1 reaches a lower final validation loss than γ = 0.5", "model.gamma", 0.5, (1.0,),
          "val_loss", "negative"),
    Claim("C2", "ε = 1e-12 lowers the final loss against ε = 1e-5 (the paper: clearly at γ = 1, ≈ 0 at γ = 0.5)",
          "model.norm_eps", 1e-5, (1e-12,), "val_loss", "negative"),
    Claim("C3", "the attention output gate lowers the final loss (the paper: clearly at γ = 1)", "model.gate",
          "none", ("headwise", "elementwise"), "val_loss", "negative"),
    Claim("C3s", "small init raises the attention sink score (last measurement)", "model.gamma", 0.5, (1.0,),
          "sink_mean", "positive"),
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


@dataclass
class ClaimRow:
    claim: Claim
    treated: Any
    context: str  # the other settings shared by the compared runs
    baseline_values: list[float]
    treated_values: list[float]
    verdict: Verdict


def evaluate_claims(runs: Sequence[Run], claims: Iterable[Claim] = CLAIMS) -> list[ClaimRow]:
    """Pair runs that differ only in the claim's key (and the seed); judge the per-seed differences."""
    vary = varying_keys(runs)
    rows = []
    for claim in claims:
        others = [k for k in vary if k not in (claim.key, "train.seed")]
        groups: dict[str, dict[str, dict[int, float]]] = {}
        for r in runs:
            value = r.config.get(claim.key)
            arm = "base" if _same(value, claim.baseline) else next(
                (f"t:{t}" for t in claim.treated if _same(value, t)), None)
            if arm is None:
                continue
            ctx = ", ".join(f"{k}={r.config.get(k)}" for k in others)
            groups.setdefault(ctx, {}).setdefault(arm, {})[int(r.config.get("train.seed", 0))] = r.metric(claim.metric)
        for ctx, arms in sorted(groups.items()):
            base = arms.get("base")
            for t in claim.treated:
                treated = arms.get(f"t:{t}")
                if not base or not treated:
                    continue
                seeds = sorted(set(base) & set(treated))
                diffs = [treated[s] - base[s] for s in seeds]
                if not any(math.isfinite(x) for x in diffs):
                    continue
                rows.append(ClaimRow(claim, t, ctx or "(nothing else varies)", [base[s] for s in seeds],
                                     [treated[s] for s in seeds], verdict_paired(diffs, claim.expected)))
    return rows


def sweep_verdicts(sweep: ResidualFlowSweep) -> list[Verdict]:
    """C5 per γ: the per-seed fitted exponents minus 1 − γ, against the ± SLOPE_TOLERANCE band."""
    return [verdict_paired(sweep.seed_slopes[i] - (1 - g), "zero", tolerance=SLOPE_TOLERANCE)
            for i, g in enumerate(sweep.gammas)]


def token_verdict(result: TokenGapResult, z: float = 2.0) -> Verdict:
    """C7: the gain (Δ_sym) peaks at intermediate-to-high difficulty, not on the easiest or noisiest tokens.

    Let p be the bin with the largest mean Δ_sym (standard errors treat tokens as independent). If A is not
    better there by more than z·SE, inconclusive (A gains nowhere). If p is an interior bin and exceeds both the easiest and the hardest bin by more than z·SE: agree. If p is the
    easiest or the hardest bin and exceeds the runner-up by more than z·SE: disagree. Otherwise
    inconclusive.
    """
    m = np.array([b.mean_delta_sym for b in result.bins])
    se = np.nan_to_num(np.array([b.se_delta_sym for b in result.bins]), nan=np.inf)
    n = int(sum(b.count for b in result.bins))
    if len(m) < 3:
        return Verdict("inconclusive", float("nan"), float("nan"), n, "interior peak", "fewer than 3 bins")
    p = int(np.argmax(m))
    if not m[p] > z * se[p]:  # A gains in no bin: there is nothing whose place could be judged
        return Verdict("inconclusive", float(m[p]), float(se[p]), n, "interior peak",
                       f"A is not clearly better in any bin (largest mean Δ_sym {m[p]:.3g}, SE {se[p]:.2g})")

    def margin(q: int) -> tuple[float, float, bool]:
        d, s = float(m[p] - m[q]), float(math.hypot(se[p], se[q]))
        return d, s, d > z * s

    if p in (0, len(m) - 1):
        q = int(np.argsort(m)[-2])
        d, s, clear = margin(q)
        where = "easiest" if p == 0 else "hardest"
        return Verdict("disagree" if clear else "inconclusive", d, s, n, "interior peak",
                       f"Δ_sym peaks in the {where} bin, {d:.3g} above bin {q + 1} (SE {s:.2g})")
    (d0, s0, c0), (d1, s1, c1) = margin(0), margin(len(m) - 1)
    return Verdict("agree" if c0 and c1 else "inconclusive", float(m[p]), float(se[p]), n, "interior peak",
                   f"peak in bin {p + 1} of {len(m)}: {d0:.3g} above the easiest (SE {s0:.2g}), "
                   f"{d1:.3g} above the hardest (SE {s1:.2g})")


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


def badge(v: Verdict) -> str:
    return f'<span class="v {esc(v.label)}">{esc(v.label)}</span>'


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
            losses = [r.final_val_loss for r in runs
                      if r.config.get(row_key) == rv and r.config.get(col_key) == cv and math.isfinite(r.final_val_loss)]
            if losses:
                vals[i, j] = statistics.fmean(losses)
    return vals, rows, cols


def _section_findings(doc: _Doc, findings: list[tuple[str, dict]]) -> None:
    for name, f in findings:
        doc.h2(f"Recipe findings: {f.get('title', f.get('recipe', name))}")
        doc.p(f"{name}: recipe {f.get('recipe', '?')}, scale {f.get('scale', '?')}. Verdicts as computed by the "
              "recipe (each comparison by smallinit.report.verdict; a claim agrees when all its comparisons agree).",
              "note")
        rows = []
        for c in f.get("claims", []):
            label = str(c.get("verdict", "inconclusive"))
            why = "".join(f"<li>{esc(x.get('text', ''))}: {esc(x.get('verdict', ''))} ({esc(x.get('reason', ''))})</li>"
                          for x in c.get("comparisons", []))
            rows.append(f"<tr><td>{esc(c.get('claim', ''))}</td><td>{esc(c.get('statement', ''))}</td>"
                        f"<td>{esc(c.get('paper', ''))}</td><td><ul>{why}</ul>{esc('; '.join(c.get('notes', [])))}</td>"
                        f'<td><span class="v {esc(label)}">{esc(label)}</span></td></tr>')
        head = "".join(f"<th>{h}</th>" for h in ("claim", "statement", "the paper", "measured", "verdict"))
        doc.raw(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _section_claims(doc: _Doc, rows: list[ClaimRow], sweep_rows: list[tuple[str, Verdict]],
                    token_rows: list[tuple[str, Verdict]]) -> None:
    doc.h2("Claims and verdicts (pairwise, from the runs here)")
    doc.p("Each verdict is computed from the runs in this folder: per-seed differences (treated − baseline, "
          "same seed), agree / disagree when their mean differs from 0 by more than 2 standard errors in the "
          "expected / opposite direction, inconclusive otherwise or with a single seed "
          "(smallinit.report.verdict).", "note")
    if not (rows or sweep_rows or token_rows):
        doc.p("No comparison is possible here: the runs do not differ in γ, ε or the gate with everything "
              "else equal, and there is no residual-flow sweep or token comparison.")
        return
    body = []
    for r in rows:
        v = r.verdict
        body.append(f"<tr><td>{esc(r.claim.id)}</td><td>{esc(r.claim.text)}</td>"
                    f"<td>{esc(r.claim.key)}: {esc(r.claim.baseline)} → {esc(r.treated)}</td><td>{esc(r.context)}</td>"
                    f"<td>{esc(r.claim.metric)}</td><td>{num(v.mean)} ± {num(v.se)} (n={v.n})</td>"
                    f"<td>{badge(v)}</td><td>{esc(v.reason)}</td></tr>")
    for what, v in sweep_rows:
        body.append(f"<tr><td>C5</td><td>residual flow ‖h_L − e‖/‖e‖ ≍ d^(1−γ)</td><td>{esc(what)}</td>"
                    f"<td>fresh models</td><td>exponent − (1 − γ)</td><td>{num(v.mean)} ± {num(v.se)} (n={v.n})</td>"
                    f"<td>{badge(v)}</td><td>{esc(v.reason)}</td></tr>")
    for what, v in token_rows:
        body.append(f"<tr><td>C7</td><td>gains concentrate on moderately-to-highly difficult tokens</td>"
                    f"<td>{esc(what)}</td><td>token level</td><td>peak mean Δ_sym</td>"
                    f"<td>{num(v.mean)} ± {num(v.se)}</td><td>{badge(v)}</td><td>{esc(v.reason)}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("claim", "paper says", "comparison", "held equal", "metric",
                                              "difference", "verdict", "why"))
    doc.raw(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _section_runs(doc: _Doc, runs: list[Run], vary: list[str]) -> None:
    doc.h2(f"Runs ({len(runs)})")
    if not runs:
        doc.p("No run folders (config.json + metrics.jsonl) here.")
        return
    doc.raw(table(["run", *vary, "steps", "final val loss"],
                  [[r.name, *[r.config.get(k) for k in vary], (r.summary or {}).get("step", "–"),
                    r.final_val_loss] for r in runs]))
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
        raw = _read_json(path)
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
    sweep_rows = [(f"{name}: γ = {g:g}", v) for name, sw in sweeps for g, v in zip(sw.gammas, sweep_verdicts(sw))]
    token_rows = [(name, token_verdict(res)) for name, res in compares]
    _section_findings(doc, findings)
    _section_claims(doc, evaluate_claims(runs), sweep_rows, token_rows)
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
