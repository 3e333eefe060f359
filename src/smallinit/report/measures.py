"""What the report measures inside the models, against the paper's figures: the RMSNorm factor over γ (Fig. 1c),
the attention sink per layer (Fig. 1f/g) and the residual flow at initialisation (Fig. 3a)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from smallinit.analysis.result import AnalysisResult
from smallinit.measures.norm_factor import init_variance, relative_factor, rmsnorm_factor, saturation_gamma
from smallinit.measures.residual_flow import ResidualFlowSweep
from smallinit.measures.sink import uniform_sink
from smallinit.monitor.records import AnalysisRecord
from smallinit.monitor.runs import Run
from smallinit.report import figures, model_figures
from smallinit.report.arrange import SIZE_KEYS, Groups, distinct, distinguishing, setting
from smallinit.report.claims import caveat
from smallinit.report.markup import h2, img, note, or_dash, p, table
from smallinit.study.judging.findings_file import JudgedClaim

PAPER_WIDTH = 2048  # the paper's Fig. 1c
GAMMAS = (0.5, 0.6, 0.75, 1.0, 1.25)  # the rows of the analytic table


@dataclass(frozen=True)
class NormFactorSection:
    d: int  # the width the analytic curve is drawn at: the runs' own when they share one, else the paper's
    measured: list[list[Any]]  # per run or analysis: name, step, min and mean factor over the norms


def norm_factor_section(runs: list[Run], analyses: list[tuple[str, AnalysisResult]]) -> NormFactorSection:
    widths = {r.config.get("model.d_model") for r in runs}
    d = widths.pop() if len(widths) == 1 and isinstance(next(iter(widths)), int) else PAPER_WIDTH
    rows = []
    for r in runs:
        nf = r.analysis[0].norm_factor if r.analysis else None
        if nf:
            rows.append([r.name, r.analysis[0].step, min(nf.values()), statistics.fmean(nf.values())])
    for name, a in analyses:
        if nf := a.norm_factor:  # none where no norm could be measured (analyze says why)
            rows.append([name, or_dash(a.step), min(nf.values()), statistics.fmean(nf.values())])
    return NormFactorSection(d, rows)


def render_norm_factor(s: NormFactorSection) -> list[str]:
    d = s.d
    parts = [
        h2(
            "RMSNorm factor against γ (Fig. 1c)"
            + (f", at this model's width d = {d}" if d != PAPER_WIDTH else "")
        ),
        img(figures.norm_factor_figure(d), "RMSNorm factor against gamma"),
        table(
            [
                "γ",
                "σ² = d^(−2γ)",
                "factor, ε=1e-5",
                "factor, ε=1e-12",
                "ideal 1/σ",
                "relative, ε=1e-5",
                "relative, ε=1e-12",
            ],
            [
                [
                    g,
                    init_variance(g, d),
                    rmsnorm_factor(g, 1e-5, d),
                    rmsnorm_factor(g, 1e-12, d),
                    d**g,
                    relative_factor(g, 1e-5, d),
                    relative_factor(g, 1e-12, d),
                ]
                for g in GAMMAS
            ],
        ),
        note(
            f"At d = {d} and ε = 1e-5 the factor starts to saturate (σ² < 10ε) above γ = "
            f"{saturation_gamma(1e-5, d, 10):.2f} and is pinned (σ² < ε) above γ = {saturation_gamma(1e-5, d):.2f}."
        ),
    ]
    if s.measured:
        parts.append(
            p("Measured factor relative to the ideal 1/σ(h) (1 = the norm sees the scale), over the norms:")
        )
        parts.append(table(["model", "step", "min over norms", "mean over norms"], s.measured))
    return parts


ANALYZE = "smallinit analyze"  # the panel of models measured by analyze


@dataclass(frozen=True)
class SinkSection:
    panels: dict[str, dict[str, list[list[float]]]]  # panel → curve → per seed, the sink score per layer
    refs: dict[str, dict[str, figures.Reference]]  # panel → label → the score of uniform attention
    legend_title: str
    rows: list[list[Any]]  # model, seeds, step, uniform, Sink_0.3, Sink_0.8, then per layer
    unknown: list[str]  # analyses written before analyze recorded its sequence length


def _shares(found: list[dict[float, float]]) -> list[Any]:
    """Sink_0.3, Sink_0.8: mean over seeds, "–" if not recorded."""
    return [
        statistics.fmean(f[eps] for f in found) if found and all(eps in f for f in found) else "–"
        for eps in (0.3, 0.8)
    ]


def sink_section(groups: Groups, analyses: list[tuple[str, AnalysisResult]]) -> SinkSection | None:
    panels: dict[str, dict[str, list[list[float]]]] = {}
    refs: dict[str, dict[str, figures.Reference]] = {}
    rows, unknown = [], []
    for panel, curve, group in groups.items():
        measured = [r for r in group if r.analysis and r.analysis[-1].sink]
        lasts = [r.analysis[-1] for r in measured]
        if lasts:
            seeds = [list(a.sink.per_layer) for a in lasts]
            panels.setdefault(panel, {})[curve] = seeds
            lengths = sorted(
                {int(r.config["data.seq_len"]) for r in measured}
            )  # the callback's batch; no window
            refs.setdefault(panel, {}).update((figures.uniform_label(T), uniform_sink(T)) for T in lengths)
            found = [a.sink.share_above for a in lasts if a.sink.share_above]
            rows.append(
                [
                    Groups.name(panel, curve),
                    len(seeds),
                    lasts[0].step,
                    uniform_sink(lengths[0]) if len(lengths) == 1 else "–",
                    *_shares(found if len(found) == len(lasts) else []),
                    *np.mean(seeds, axis=0),
                ]
            )
    for name, a in analyses:
        if not a.sink:
            continue
        panels.setdefault(ANALYZE, {})[name] = [list(a.sink.per_layer)]
        ref = model_figures.sink_reference(a)
        if ref:
            refs.setdefault(ANALYZE, {})[ref[0]] = ref[1]
        else:
            unknown.append(name)
        rows.append(
            [
                name,
                1,
                or_dash(a.step),
                "–" if ref is None else float(np.mean(ref[1])),
                *_shares([a.sink.share_above]),
                *a.sink.per_layer,
            ]
        )
    return SinkSection(panels, refs, groups.legend_title, rows, unknown) if panels else None


def render_sink(s: SinkSection) -> list[str]:
    parts = [
        h2("Attention sink per layer (Fig. 1f/g)"),
        note(
            "Sink score: mean attention weight that queries 2…T put on token 1, over sequences and heads, at the "
            "last measurement during training (line: mean over seeds, band: their range), and from smallinit "
            "analyze. Dashed: uniform attention, the score when each query spreads its weight evenly over the keys "
            "it sees (1/i on token 1 at position i, mean over i = 2…T); a score near it is no sink, however the "
            "axis is zoomed. Sink_ε (Gu et al.): the share of (layer, head) pairs whose mean weight on token 1 "
            "exceeds ε."
        ),
    ]
    if s.unknown:
        parts.append(
            note(
                f"No uniform reference for {', '.join(s.unknown)}: written before analyze recorded its sequence "
                "length (run smallinit analyze again)."
            )
        )
    parts.append(img(figures.sink_figure(s.panels, s.legend_title, s.refs), "sink scores per layer"))
    layers = max(len(r) for r in s.rows) - 6
    parts.append(
        table(
            [
                "model",
                "seeds",
                "step",
                "uniform attention",
                "Sink_0.3",
                "Sink_0.8",
                "mean",
                *[f"L{i + 1}" for i in range(layers)],
            ],
            [[*r[:6], statistics.fmean(r[6:]), *r[6:]] for r in s.rows],
        )
    )
    return parts


@dataclass(frozen=True)
class ResidualSection:
    series: dict[str, tuple[int, list[tuple[float, float]]]]  # setting → (width, (γ, ratio at init) points)
    rows: list[list[Any]]  # per run: name, γ, ratio at init, the paper's prediction through the γ = 1 points
    sweeps: list[tuple[str, ResidualFlowSweep]]
    c5: JudgedClaim | None  # the claim the width sweep decides, where it was judged


def residual_section(
    runs: list[Run],
    vary: list[str],
    sweeps: list[tuple[str, ResidualFlowSweep]],
    c5: JudgedClaim | None = None,
) -> ResidualSection | None:
    at_init = [
        (r, a)
        for r in runs
        for a in r.analysis[:1]  # against γ: runs that say their γ (a monitored run may not)
        if a.step == 0
        and a.residual_flow is not None
        and r.config.get("model.gamma") is not None
        and r.config.get("model.d_model") is not None  # the prediction d^(1−γ) needs the width
    ]
    if not at_init and not sweeps:
        return None
    series: dict[str, tuple[int, list[tuple[float, float]]]] = {}
    rows: list[list[Any]] = []
    if at_init:
        keys = [k for k in vary if k not in ("model.gamma", "train.seed")]
        by_setting: dict[str, list[tuple[Run, AnalysisRecord]]] = {}
        for r, a in at_init:
            by_setting.setdefault(json.dumps([r.config.get(k) for k in keys], default=str), []).append((r, a))
        sizes: dict[str, list[Run]] = {}
        for r, _ in at_init:
            sizes.setdefault(json.dumps([r.config.get(k) for k in SIZE_KEYS], default=str), []).append(r)
        # every setting that separates arms of one size (the gate, ε, the emulated saturation...) is named; of
        # those that follow the size, the fewest that tell the sizes apart
        arm = [k for k in keys if k not in SIZE_KEYS and any(distinct(g, k) > 1 for g in sizes.values())]
        follow = [k for k in SIZE_KEYS if k in keys] + [
            k for k in keys if k not in SIZE_KEYS and k not in arm
        ]
        chosen = distinguishing([[r for r, _ in g] for g in by_setting.values()], follow, arm)
        label_keys = [k for k in dict.fromkeys([*SIZE_KEYS, *keys]) if k in chosen]  # the size first
        for group in by_setting.values():
            d = int(group[0][0].config["model.d_model"])
            points = sorted((float(r.config["model.gamma"]), a.residual_flow) for r, a in group)
            series[setting(group[0][0], label_keys) or f"d = {d}"] = (d, points)
            c = figures.residual_prediction(points, d)
            rows += [
                [
                    r.name,
                    float(r.config["model.gamma"]),
                    a.residual_flow,
                    c * d ** (1 - r.config["model.gamma"]),
                ]
                for r, a in sorted(group, key=lambda ra: (ra[0].config["model.gamma"], ra[0].name))
            ]
    return ResidualSection(series, rows, sweeps, c5)


def render_residual(s: ResidualSection) -> list[str]:
    parts = [
        h2("Residual flow (Fig. 3a)"),
        note(
            "‖h_L − e‖/‖e‖ at initialisation, mean over tokens; the paper predicts ≍ d^(1−γ): the residual branch "
            "dominates for γ < 1, balances at γ = 1 and vanishes above. One colour per setting (all that varies "
            "but γ and the seed); dotted: the least-squares fit ∝ d^(−kγ) through its points (the paper: k = 1); "
            "dashed: the paper's d^(1−γ) scaled to meet its points at the γ nearest 1."
        ),
    ]
    if s.series:
        parts.append(img(figures.residual_flow_figure(s.series), "residual flow against gamma"))
        widths = sorted({d for d, _ in s.series.values()})
        parts.append(
            caveat(
                f"Not C5's test: these are the runs' own models at initialisation, at width{'s' if len(widths) > 1 else ''} "
                f"{', '.join(map(str, widths))}; over γ at a fixed width a k ≠ 1 cannot be told from a factor that "
                "changes with γ, which ≍ allows. C5 is judged from the width sweep of fresh models"
                + (" below" if s.sweeps else "")
                + " (the exponent over widths at each γ against 1 − γ).",
                s.c5,
            )
        )
        parts.append(
            table(["run", "γ", "ratio at init", "paper c·d^(1−γ), c through the γ = 1 points"], s.rows)
        )
    for name, sw in s.sweeps:
        parts.append(
            p(
                f"Width sweep {name}: widths {sw.widths}, seeds {sw.seeds}, depth {sw.base_config.get('n_layers')}."
            )
        )
        parts.append(img(figures.residual_sweep_figure(sw), "residual flow width sweep"))
        if s.c5 is not None:
            parts.append(
                caveat("This sweep is C5's test: its exponent at the γ nearest 1 is the primary.", s.c5)
            )
        parts.append(
            table(
                ["γ", "predicted 1 − γ", "measured exponent", "seed sd"],
                [
                    [
                        g,
                        1 - g,
                        sl,
                        float(np.std(sw.seed_slopes[i], ddof=1)) if len(sw.seeds) > 1 else float("nan"),
                    ]
                    for i, (g, sl) in enumerate(zip(sw.gammas, sw.slopes))
                ],
            )
        )
    return parts
