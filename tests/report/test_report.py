"""The HTML report: self-contained, escaped, every section present, figures that keep their legends off the
data and on the canvas, and outputs that land where the command says."""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
import statistics
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from smallinit.analysis import load_run, residual_flow_ratio
from smallinit.analysis.measure import held_out_batches
from smallinit.analysis.result import AnalysisResult
from smallinit.cli import main
from smallinit.data import load_tokenizer
from smallinit.monitor.runs import Run, find_runs
from smallinit.report import figures, model_figures
from smallinit.report.arrange import Groups, arm_keys, grids, varying_keys
from smallinit.report.condensation import HEATMAPS_SHOWN
from smallinit.report.markup import PAGE_WIDTH_PX, num, token_text
from support.report import fake_run, gap_result
from support.runs import TINY_MODEL

# -- the report --------------------------------------------------------------------------------------------------

TINY = [
    *TINY_MODEL,
    "train.batch_size=4",
    "train.steps=4",
    "train.eval_every=0",
    "train.log_every=2",
    "train.warmup_steps=1",
    "analysis.every=2",
    "analysis.snapshots=2",
    "analysis.heatmap_rows=16",
]


def _sets(items):
    return sum((["--set", s] for s in items), [])


RUNS = {
    "g0.5": ["model.gamma=0.5"],
    "g1.0": ["model.gamma=1.0"],
    "g1.0-seed1": ["model.gamma=1.0", "train.seed=1"],
    "d16": ["model.gamma=1.0", "model.d_model=16"],
}  # two seeds of one setting, two sizes


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    corpus = root / "hostile.txt"
    corpus.write_text("<script>alert('x')</script> & <b>bold</b> text\n" * 400, encoding="utf-8")
    runs = root / "runs"
    for name, extra in RUNS.items():
        assert (
            main(
                [
                    "train",
                    "--out",
                    str(runs / name),
                    *_sets(TINY + extra),
                    "--set",
                    f"data.corpus={json.dumps(str(corpus))}",
                ]
            )
            == 0
        )
    assert (
        main(["analyze", str(runs / "g1.0"), "--set", "train.eval_batches=1", "--set", "train.batch_size=2"])
        == 0
    )
    with pytest.MonkeyPatch.context() as mp:  # compare without --out writes beside run A, not here
        mp.chdir(root)
        assert (
            main(
                [
                    "compare",
                    str(runs / "g1.0"),
                    str(runs / "g0.5"),
                    "--top-k",
                    "3",
                    "--set",
                    "train.batch_size=2",
                ]
            )
            == 0
        )
    assert (
        main(
            [
                "coordcheck",
                "--out",
                str(root / "cc"),
                "--gammas",
                "0.5,1",
                "--steps",
                "1",
                "--set",
                "train.batch_size=2",
                *_sets(["model.n_layers=2", "model.vocab_size=257", "data.seq_len=16"]),
                "--residual-flow",
                "--widths",
                "32,64",
                "--seeds",
                "0,1",
            ]
        )
        == 0
    )
    assert main(["report", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def drawn(report_dir, tmp_path_factory):
    """The report of the runs and the coordinate check as two folders, with every figure it drew and every
    warning raised while drawing."""
    made: list[Figure] = []
    real_png = figures.png
    out = tmp_path_factory.mktemp("two") / "both.html"
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mp.setattr(figures, "png", lambda fig, *a, **kw: made.append(fig) or real_png(fig, *a, **kw))
        assert main(["report", str(report_dir / "runs"), str(report_dir / "cc"), "--out", str(out)]) == 0
    return SimpleNamespace(
        figures=made, warnings=[str(w.message) for w in caught], page=out.read_text(encoding="utf-8")
    )


def test_report_is_self_contained_and_escaped(report_dir):
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"<script|<link|<iframe|@import|href=|https?://", page, re.IGNORECASE)
    srcs = re.findall(r'src="([^"]*)"', page)
    assert len(srcs) >= 9
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # the corpus text reaches the page only escaped (top tokens and their contexts)
    assert "&lt;script&gt;" in page or "&lt;/script&gt;" in page
    for section in (
        "Claims and verdicts",
        "Loss curves (mean over seeds)",
        "RMSNorm factor against γ",
        "Loss curves",
        "Attention sink per layer",
        "Residual flow",
        "Condensation",
        "Weight norms: matrix RMS over training",
        "Token level",
        "Coordinate check",
        "Single-model analyses",
    ):
        assert section in page, section


def test_the_weight_norms_table_is_each_runs_recorded_matrix_rms(report_dir):
    """The weight-RMS section's last row of a setting is the mean over its seeds of the median over the matrices of
    the RMS each run's Monitor wrote, and the same over √(η/λ) (AdamW's lr and weight decay)."""
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    section = page.split("Weight norms: matrix RMS over training", 1)[1].split("<h2>", 1)[0]
    last = [Run.load(report_dir / "runs" / name).analysis[-1] for name in ("g1.0", "g1.0-seed1")]
    rms, ratio = (
        statistics.fmean(statistics.median(a.by_matrix(k).values()) for a in last)
        for k in ("rms", "rms_ratio")
    )
    assert f"<td>d = 32 · γ = 1</td><td>4</td><td>{num(rms)}</td><td>{num(ratio)}</td>" in section
    assert ratio == pytest.approx(rms / math.sqrt(3e-3 / 0.1), rel=1e-6)


def test_the_activation_sections_name_curves_by_what_varies_among_the_runs_that_measured(
    report_dir, tmp_path
):
    """A run that recorded no activations (here at another lr and length) is no curve of the activation sections,
    so their curves are not named by its settings: the weight-norm rows stay "d = 32 · γ = 1"."""
    import shutil

    shutil.copytree(report_dir / "runs", tmp_path / "runs")
    fake_run(tmp_path / "runs" / "other", 3.0, "train.lr=0.01", "analysis.every=0")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    section = page.split("Weight norms: matrix RMS over training", 1)[1].split("<h2>", 1)[0]
    assert "<td>d = 32 · γ = 1</td>" in section and "lr" not in section.split("<table", 1)[1]


def test_report_numbers_come_from_the_files(report_dir):
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    cmp = json.loads(
        (report_dir / "runs" / "g1.0" / "analysis" / "compare-g0.5" / "compare.json").read_text()
    )
    assert f"{cmp['tokens']:,} tokens" in page
    # the claims are judged by the recipes' functions from these files: C5 per γ of the width sweep, C7 from
    # the γ = 1 vs γ = 0.5 comparison (one seed: not testable here, whatever its sign)
    sweep = json.loads((report_dir / "cc" / "residual_flow_sweep.json").read_text())
    for gamma, seed_slopes in zip(sweep["gammas"], sweep["seed_slopes"]):
        mean = statistics.fmean(s - (1 - gamma) for s in seed_slopes)
        assert f"flow exponent − (1−γ) at γ{gamma:g}: {mean:+.3f} ± " in page
    d = cmp["meta"]["split"][
        "profile_bins"
    ]  # the profile is judged on the half of the tokens its precondition was not
    mid_easy = statistics.fmean(d[4:9]) - statistics.fmean(d[:3])
    assert f"Δ_sym mid−easy deciles (profile half): {mid_easy:+.3f} (n=1): not testable here" in page
    analysis = json.loads((report_dir / "runs" / "g1.0" / "analysis" / "analysis.json").read_text())
    assert {m["name"] for m in analysis["matrices"]} >= {"embed.weight", "blocks.1.mlp.down_proj.weight"}
    # analyze measured the trained model on the run's first validation windows
    run = load_run(report_dir / "runs" / "g1.0")
    x, y = next(held_out_batches(run.config, load_tokenizer("bytes"), batches=1, batch_size=2))
    assert analysis["loss"] == pytest.approx(run.model(x, y).loss.item(), rel=1e-5)
    assert analysis["residual_flow"] == pytest.approx(residual_flow_ratio(run.model, x), rel=1e-5)
    assert f"<td>{num(analysis['sink']['mean'])}</td>" in page


def test_analyze_says_what_each_number_is(report_dir, tmp_path, capsys):
    """No number alone: each line names what it measures and what to compare it with."""
    capsys.readouterr()
    assert (
        main(
            [
                "analyze",
                str(report_dir / "runs" / "g1.0"),
                "--set",
                "train.eval_batches=1",
                "--set",
                "train.batch_size=2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 4: loss ") and "nats/token" in lines[0]
    assert lines[1].startswith("sink score ") and "attention spread evenly gives" in lines[1]
    assert lines[2].startswith("Sink_0.3 ") and "exceeds 0.3" in lines[2]
    assert (
        lines[3].startswith("residual flow ")
        and "‖h_L − e‖/‖e‖" in lines[3]
        and "d^(1−γ), here 1 for d = 32" in lines[3]
    )
    assert lines[4].startswith("min norm factor ") and "at initialisation this config gives" in lines[4]
    assert lines[5].startswith("largest attention logit ") and "before softmax" in lines[5]
    assert lines[6].startswith("massive activations: max |h| / median |h| ") and "Sun et al." in lines[6]
    assert lines[7].startswith("stable rank ‖W‖_F²/‖W‖_2²: median ") and "of min(m, n) over" in lines[7]
    assert (
        "this loss is on 2 windows of 32 tokens from the start of the validation split, training's val "
        "loss on 32 windows of 32 tokens, so the two differ a little; to measure on training's windows "
        "add --set train.eval_batches=8 --set train.batch_size=4 --set data.seq_len=32"
    ) in lines[8:]


def test_report_refuses_an_empty_folder(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds no runs" in err
    assert not (tmp_path / "report.html").exists()


# -- figures a person can read -----------------------------------------------------------------------------------


def _overlap(a: Bbox, b: Bbox) -> float:
    """Area (px²) shared by two boxes."""
    return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))


def layout_problems(fig: Figure) -> list[str]:
    """What would make a figure hard to read: a legend over any axes' plotting area, a title or another
    legend, anything drawn outside the canvas (clipped in the PNG), or a plotting area squeezed to less than
    half its share of the width."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    legends = [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend() is not None)]
    titles = [
        t for t in [*fig.texts, *(ax.title for ax in axes)] if t.get_text()
    ]  # fig.texts holds the suptitle
    problems = []
    for i, legend in enumerate(legends):
        box = legend.get_window_extent(renderer)
        for ax in axes:
            if _overlap(box, ax.get_window_extent(renderer)) > 1.0:
                problems.append(f"legend over the axes titled {ax.get_title()!r}")
        for text in titles:
            if _overlap(box, text.get_window_extent(renderer)) > 1.0:
                problems.append(f"legend over the title {text.get_text()!r}")
        if any(_overlap(box, other.get_window_extent(renderer)) > 1.0 for other in legends[i + 1 :]):
            problems.append("two legends over each other")
    drawn, canvas_box = fig.get_tightbbox(renderer), fig.bbox_inches.padded(0.02)  # inches
    if not (canvas_box.contains(drawn.x0, drawn.y0) and canvas_box.contains(drawn.x1, drawn.y1)):
        problems.append(f"something drawn at {drawn.bounds} leaves the canvas {fig.bbox_inches.bounds}")
    for ax in axes:
        spec = ax.get_subplotspec()
        if (
            spec is not None
            and ax.get_window_extent(renderer).width < 0.5 * fig.bbox.width / spec.get_gridspec().ncols
        ):
            problems.append(f"axes {ax.get_title()!r} squeezed")
    labels = [ax.yaxis.label for ax in axes if ax.yaxis.label.get_text()]
    for i, label in enumerate(labels):
        box = label.get_window_extent(renderer)
        for other in [*labels[i + 1 :], *titles]:
            if _overlap(box, other.get_window_extent(renderer)) > 1.0:
                problems.append(f"the y label {label.get_text()!r} runs into {other.get_text()!r}")
    return problems


def test_the_layout_check_sees_a_bad_figure():
    fig = Figure(figsize=(4, 3), layout="constrained")
    ax = fig.subplots()
    for i in range(12):
        ax.plot([0, 1], [i, i + 1], label=f"d_ff=96, d_model=32, gamma=0.5, gate=none, n_heads=2, seed {i}")
    ax.legend(loc="center")  # over the data, and wider than the figure
    problems = layout_problems(fig)
    assert any("legend over the axes" in p for p in problems) and any(
        "leaves the canvas" in p for p in problems
    )
    fig = Figure(figsize=(6, 3), layout="constrained")
    fig.subplots().plot([0, 1], [0, 1], label="a line with a long label")
    fig.suptitle("loss: thin train, thick validation; line = mean over seeds, band = their range")
    fig.legend(loc="outside right upper")
    assert any("legend over the title" in p for p in layout_problems(fig))


def test_every_report_figure_reads(drawn):
    assert len(drawn.figures) >= 10
    for fig in drawn.figures:
        assert layout_problems(fig) == [], (fig.get_suptitle(), [ax.get_title() for ax in fig.axes][:2])
    assert drawn.warnings == []  # e.g. "constrained_layout not applied" would be one


def test_many_settings_still_read(recwarn):
    """A folder with a dozen settings (the cpu-long study's 113 runs have 13): the residual flow keeps one legend
    entry per setting, the loss grid wraps its long panel titles, and both stay on the canvas, legible."""
    labels = [
        f"d_model=24, gate=elementwise, ε=1e-12, norm_eps_width=0, lr={lr:g}"
        for lr in np.geomspace(1e-3, 1e-1, 13)
    ]
    flow = figures.residual_flow_figure({s: (24, [(g, 24.0 ** (1 - g)) for g in (0.5, 1.0)]) for s in labels})
    grid = figures.grid_figure(
        {s: (np.ones((2, 2)), ["0.5", "1"], ["1e-05", "1e-12"]) for s in labels[:2]},
        row_label="γ",
        col_label="ε",
        title="final val loss, γ × ε",
    )
    for fig in (flow, grid):
        figures.png(fig)
        # a legend wider than its plot widens the figure (figures._widen_for) so the plot keeps its planned size,
        # which can be under half the figure's width: the plots are held to a size in inches instead
        assert [p for p in layout_problems(fig) if "squeezed" not in p] == [] and smallest_text_px(
            fig
        ) >= 10.0
    assert flow.axes[0].get_window_extent().width >= 3 * flow.dpi
    assert min(ax.get_window_extent().width for ax in grid.axes[:2]) >= 1.5 * grid.dpi
    assert len(flow.axes[0].get_legend().get_texts()) == len(labels)
    assert len({tuple(c.get_facecolor()[0]) for c in flow.axes[0].collections}) == len(
        labels
    )  # a colour each
    assert not [w for w in recwarn if "constrained_layout" in str(w.message)]


def smallest_text_px(fig: Figure) -> float:
    """The smallest text of a figure as a reader of the report sees it at 1400 px: its size at the PNG's dpi,
    times the scale the page shows the PNG at (a figure wider than the text column is shrunk to it)."""
    FigureCanvasAgg(fig).draw()
    shown = min(1.0, PAGE_WIDTH_PX / (fig.get_figwidth() * figures.DPI))
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) * figures.DPI / 72 * shown


def test_no_figure_text_is_under_10_px_on_the_page(drawn):
    sizes = {
        next((ax.get_title() for ax in fig.axes if ax.get_title()), "?"): smallest_text_px(fig)
        for fig in drawn.figures
    }
    assert min(sizes.values()) >= 10.0, {t: round(px, 1) for t, px in sizes.items() if px < 10}


def test_table_headers_say_what_they_are(drawn):
    """No header twice in one table (two "stable rank", two "SE", "steps" beside train.steps), and the runs'
    config keys keep their section (train.steps, not steps; analysis.every, not every)."""
    for head in re.findall(r"<thead><tr>(.*?)</tr></thead>", drawn.page):
        headers = re.findall(r"<th>(.*?)</th>", head)
        assert len(headers) == len(set(headers)), headers
    runs_head = re.findall(r"<th>(.*?)</th>", drawn.page.split("<h2>Runs", 1)[1].split("</thead>", 1)[0])
    assert runs_head[:3] == ["run", "final val loss", "status"]  # the key columns first: never scrolled away
    assert all("." in h for h in runs_head[3:]), runs_head


def test_figure_labels_name_only_what_differs(report_dir):
    runs = find_runs(report_dir / "runs")
    groups = Groups.of(runs, varying_keys(runs))
    # d_ff, the head counts and the corpus are shared; d_model tells the panels apart, γ the curves at d = 32
    assert {(p, c, len(g)) for p, c, g in groups.items()} == {
        ("d = 16", "γ = 1", 1),
        ("d = 32", "γ = 0.5", 1),
        ("d = 32", "γ = 1", 2),
    }
    assert groups.legend_title == "γ; 1/2 seeds each"


def test_how_a_run_ran_does_not_split_its_arm(tmp_path):
    """train.compile = "auto" resolves per run (a warm compile cache pays sooner), so the seeds of one arm can
    record different choices; the curves and the loss grids are the arms, the same math compiled or not."""
    runs = [
        Run(
            tmp_path / f"r{i}",
            f"r{i}",
            {
                "model.gamma": g,
                "model.norm_eps": eps,
                "train.seed": s,
                "train.compile": s == 1,
                "train.threads": 1 + s,
            },
            {"val_loss": 2.0},
        )
        for i, (g, eps, s) in enumerate(itertools.product((0.5, 1.0), (1e-5, 1e-12), (0, 1, 2)))
    ]
    assert arm_keys(runs) == ["model.gamma", "model.norm_eps", "train.seed"]
    groups = Groups.of(runs, arm_keys(runs))
    assert sorted(len(g) for _, _, g in groups.items()) == [3] * 4 and "compile" not in groups.legend_title
    ((title, (values, rows, cols)),) = grids(runs, arm_keys(runs), "model.gamma", "model.norm_eps").items()
    assert values.shape == (2, 2) and "compile" not in title


def test_seeds_are_a_mean_and_a_band():
    seeds = [[(0, 3.0), (10, 2.0), (20, 1.0)], [(0, 3.4), (10, 2.6), (20, 1.2)], [(0, 3.2), (10, 2.2)]]
    fig = figures.loss_curves_figure({"d=32": {"γ=1": {"val": seeds}}, "d=64": {"γ=1": {"val": seeds[:1]}}})
    ax32, ax64 = fig.axes[:2]
    (line,) = ax32.lines  # one line for three seeds, at the steps all of them have
    assert list(line.get_xdata()) == [0, 10] and np.allclose(line.get_ydata(), [3.2, 2.2666667])
    (band,) = ax32.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(2.0) and ys.max() == pytest.approx(3.4)  # the range over the seeds
    assert len(ax64.lines) == 1 and not ax64.collections  # one seed: no band
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["γ=1"]  # one legend entry for both panels
    assert ax32.lines[0].get_color() == ax64.lines[0].get_color()


# -- the page ------------------------------------------------------------------------------------------------------


def test_page_folds_heatmaps_and_boxes_no_table(drawn):
    """Every row and column of a table is on the page, at 1400 px and in print: no box that scrolls (a box cut
    the runs' table to 15 rows and its last column in a screenshot); a long cell wraps instead."""
    page = drawn.page
    shown, _, folded = page.partition('<details class="heatmaps">')
    assert shown.count('alt="row cosine heatmaps') == HEATMAPS_SHOWN
    assert folded.count('alt="row cosine heatmaps') == 3 - HEATMAPS_SHOWN  # three settings (seeds pooled)
    assert page.count("<table") > 5 and not re.search(r"overflow-[xy]|max-height|nowrap}", page)
    assert "td{overflow-wrap:anywhere}" in page
    for run in RUNS:  # both folders in one report
        assert f"<td>runs/{run}</td>" in page
    assert "Coordinate check over γ" in page


def test_whitespace_tokens_are_visible(report_dir):
    assert token_text("\n") == "⏎" and token_text(" the") == "␠the" and token_text("\t<b>") == "⇥&lt;b&gt;"
    assert token_text("a b\nc", spaces=False) == "a b⏎c"
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    targets = re.findall(r'<td><code class="tok">[^<]*</code></td><td><code class="tok">([^<]*)</code>', page)
    assert targets and all(targets)  # no empty cell where a newline or a space was the true token


def test_a_verdict_label_of_any_wording_gets_a_badge():
    from smallinit.report.markup import verdict_badge

    assert (
        verdict_badge("not testable here") == '<span class="v v-not-testable-here">not testable here</span>'
    )
    assert verdict_badge("<x>") == '<span class="v v-&lt;x&gt;">&lt;x&gt;</span>'


# -- where outputs land ----------------------------------------------------------------------------------------------


def test_compare_writes_beside_run_a_and_says_where(report_dir, capsys):
    out = report_dir / "runs" / "g1.0" / "analysis" / "compare-g0.5"
    assert {p.name for p in out.iterdir()} == {"compare.json", "token_gap.png"}
    assert not (report_dir / "compare").exists()  # the fixture ran it from report_dir
    assert (
        main(
            [
                "compare",
                str(report_dir / "runs" / "d16"),
                str(report_dir / "runs" / "g1.0"),
                "--labels",
                "small,γ = 1 / big",
                "--top-k",
                "1",
                "--set",
                "train.batch_size=2",
                "--max-tokens",
                "64",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    target = report_dir / "runs" / "d16" / "analysis" / "compare-γ-=-1-big"
    assert f"wrote {target / 'compare.json'}" in printed and (target / "token_gap.png").is_file()


def test_coordcheck_writes_under_runs_and_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "coordcheck",
                "--gammas",
                "1",
                "--steps",
                "1",
                "--set",
                "train.batch_size=2",
                *_sets(
                    [
                        "model.d_model=16",
                        "model.n_layers=1",
                        "model.n_heads=2",
                        "model.n_kv_heads=2",
                        "model.d_ff=32",
                        "model.vocab_size=257",
                        "data.seq_len=8",
                    ]
                ),
            ]
        )
        == 0
    )
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]
    assert sorted(p.name for p in (tmp_path / "runs" / "coordcheck").iterdir()) == [
        "coordcheck.json",
        "coordcheck.png",
    ]
    assert "wrote runs/coordcheck/coordcheck.json" in capsys.readouterr().out


def test_report_of_several_folders_needs_out(report_dir, tmp_path, capsys):
    assert main(["report", str(report_dir / "runs"), str(report_dir / "cc")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--out DIR" in err
    assert not (report_dir / "runs" / "report.html").exists()
    assert (
        main(["report", str(report_dir / "runs"), str(tmp_path / "missing"), "--out", str(tmp_path / "r")])
        == 2
    )
    assert "is not a folder" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_loss_gaps_along_training_are_drawn_from_the_findings(tmp_path):
    """A findings.json whose loss comparisons carry their trajectory gets the gap figure, laid out cleanly."""
    from smallinit.report.claims import claims_section
    from smallinit.study.judging.findings_file import Findings

    traj = {
        "steps": [0, 10, 20, 30, 40],
        "tokens_per_param": [0, 5, 10, 15, 20],
        "gaps": [[0.5, -0.2, -0.1, -0.05, -0.04], [0.4, -0.3, -0.15, -0.06, -0.05]],
    }
    claims = [
        {
            "claim": "C1",
            "comparisons": [
                {"label": "L(γ.5)−L(γ1) @d16×4", "trajectory": traj},
                {"label": "no curve", "trajectory": None},
            ],
        }
    ]
    panels = claims_section("findings.json", Findings.from_dict({"claims": claims})).gaps
    assert list(panels) == ["C1"] and list(panels["C1"]) == ["L(γ.5)−L(γ1) @d16×4"]
    assert [x for x, _ in panels["C1"]["L(γ.5)−L(γ1) @d16×4"][0]] == [5, 10, 15, 20]  # step 0 left out
    fig = figures.gap_figure(panels)
    assert layout_problems(fig) == []
    (tmp_path / "findings.json").write_text(json.dumps({"recipe": "demo", "title": "t", "claims": claims}))
    assert main(["report", str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "loss gaps along training" in html
    assert (
        "does not withhold it" in html and "settled (the same sign" not in html
    )  # the rule in force, not the old veto


# -- what the figures pool ---------------------------------------------------------------------------------------


def _loss_rows(page: str, section: str) -> list[list[float]]:
    """The losses (numbers > 1.5: γ and ε are smaller) of each row of the tables in one section of the page."""
    part = page.split(f"<h2>{section}", 1)[1].split("<h2>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", part.split("<tbody>", 1)[1] if "<tbody>" in part else "")
    cells = [[float(c) for c in re.findall(r"<td>([-0-9.e]+)</td>", row)] for row in rows]
    return [[c for c in row if c > 1.5] for row in cells]


def test_a_width_effect_is_not_shown_as_an_epsilon_effect(tmp_path):
    """ε = 1e-12 at d = 16 and d = 24, ε = 1e-5 at d = 16 only; the loss depends on the width alone. A γ × ε
    grid that pooled the widths would show a 0.2-nat "ε effect"; and an unfinished run stays out of it."""
    for gamma in (0.5, 1.0):
        for seed in (0, 1):
            for d, eps in ((16, 1e-5), (16, 1e-12), (24, 1e-12)):
                fake_run(
                    tmp_path / f"d{d}-eps{eps:g}-g{gamma}-s{seed}",
                    3.0 if d == 16 else 2.6,
                    f"model.d_model={d}",
                    f"model.gamma={gamma}",
                    f"model.norm_eps={eps}",
                    f"train.seed={seed}",
                )
    fake_run(
        tmp_path / "stopped",
        9.0,
        "model.d_model=16",
        "model.gamma=1.0",
        "model.norm_eps=1e-5",
        "train.seed=2",
        finished=False,
    )
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    rows = _loss_rows(page, "Final validation loss, γ × ε")
    assert rows and all(row == [3.0, 3.0] for row in rows), rows  # each width alone: no ε effect
    assert "<td>stopped</td><td>9</td><td>unfinished: step 2 of 4</td>" in page


# -- what a reader sees first ----------------------------------------------------------------------------------------


def test_a_claims_row_lists_its_primary_first(tmp_path):
    """As the terminal's table: a secondary listed first would read as the reason for the verdict."""
    claims = [
        {
            "claim": "C5",
            "verdict": "inconclusive",
            "comparisons": [
                {
                    "label": "exp γ0.5",
                    "role": "secondary",
                    "text": "flow exponent at γ0.5",
                    "verdict": "agree",
                },
                {
                    "label": "exp γ1",
                    "role": "primary",
                    "text": "flow exponent at γ1",
                    "verdict": "inconclusive",
                },
            ],
        }
    ]
    (tmp_path / "findings.json").write_text(json.dumps({"recipe": "demo", "title": "t", "claims": claims}))
    assert main(["report", str(tmp_path)]) == 0
    items = re.findall(r"<li>(.*?)</li>", (tmp_path / "report.html").read_text(encoding="utf-8"))
    assert items == ["primary: flow exponent at γ1: inconclusive", "flow exponent at γ0.5: agree"]


def test_every_sink_figure_has_the_uniform_reference(drawn, report_dir):
    """A dashed line at the score of evenly spread attention, 1/i on token 1 for the query at i, mean over
    i = 2..T: the runs' at their sequence length (32), analyze's from the layers' masks."""
    even = sum(1 / i for i in range(2, 33)) / 31
    sink = [fig for fig in drawn.figures if any("sink score" in ax.get_ylabel() for ax in fig.axes)]
    assert sink
    for fig in sink:
        for ax in (ax for ax in fig.axes if "sink score" in ax.get_ylabel()):
            lines = {
                ln.get_label(): ln for ln in ax.get_lines() if ln.get_label().startswith("uniform attention")
            }
            assert list(lines) == ["uniform attention (T = 32)"], [ln.get_label() for ln in ax.get_lines()]
            line = lines["uniform attention (T = 32)"]
            assert line.get_linestyle() == "--" and np.allclose(line.get_ydata(), even)
    assert "<th>uniform attention</th>" in drawn.page and f"<td>{num(even)}</td>" in drawn.page
    analysis = json.loads((report_dir / "runs" / "g1.0" / "analysis" / "analysis.json").read_text())
    label, value = model_figures.sink_reference(AnalysisResult.from_dict(analysis))
    assert label == "uniform attention (T = 32)" and value == pytest.approx(even)


def test_the_flow_legend_names_every_setting_that_separates_the_arms(tmp_path):
    """The demo's arms differ in the gate, ε and the emulated saturation at once: naming the gate alone would
    credit it with the whole difference."""
    from smallinit.report.measures import residual_section

    arms = {
        "fixed": ["model.gate=elementwise", "model.norm_eps=1e-12"],
        "baseline": ["model.gate=none", "model.norm_eps=1e-05", "model.norm_eps_width=2048"],
    }
    for arm, sets in arms.items():
        for gamma in (0.5, 1.0):
            folder = tmp_path / f"{arm}-{gamma}"
            fake_run(folder, 3.0, f"model.gamma={gamma}", *sets)
            with open(folder / "metrics.jsonl", "a") as f:
                f.write(
                    json.dumps(
                        {
                            "event": "analysis",
                            "step": 0,
                            "residual_flow": 2.0 / gamma,
                            "sink": {"0": 0.1},
                            "norm_factor": {"n": 1.0},
                            "stable_rank": {},
                            "mean_abs_cos": {},
                        }
                    )
                    + "\n"
                )
    runs = find_runs(tmp_path)
    series = residual_section(runs, arm_keys(runs), []).series
    assert sorted(series) == ["elementwise gate, ε = 1e-12", "no gate, emulated ε = 1e-5 (d = 2048)"], list(
        series
    )


def test_heatmaps_of_the_judged_arm_come_first_with_a_colour_bar(tmp_path):
    """C6 judges γ 0.5 and 1 of the fixed arm: their heatmaps are the ones its verdict is read against."""
    from smallinit.report.condensation import c6_judged

    arms = {
        "baseline": ["model.gate=none", "model.norm_eps=1e-05"],
        "fixed": ["model.gate=elementwise", "model.norm_eps=1e-12"],
    }
    groups = []
    for arm, sets in arms.items():
        for gamma in (0.5, 1.0):
            fake_run(tmp_path / f"{arm}-{gamma}", 3.0, f"model.gamma={gamma}", *sets)
            groups.append(find_runs(tmp_path / f"{arm}-{gamma}"))
    judged = c6_judged(groups)
    assert sorted(judged.values()) == [0, 1] and {id(groups[2]), id(groups[3])} == set(judged)
    assert judged[id(groups[3])] == 0  # γ = 1 first: the setting whose rebound C6 tests
    long = "gpt_neox.layers.0.attention.query_key_value.weight"  # a Hugging Face name, longer than a panel
    snap = {
        "step": 0,
        "matrices": {"blocks.0.attn.q_proj.weight": np.eye(4), long: np.eye(4)},
        "mean_abs_cos": {},
    }
    fig = figures.heatmaps_figure([snap, {**snap, "step": 4}])
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "|cos| between two rows"]
    assert len(bars) == 1 and bars[0].get_ylim() == (0.0, 1.0)
    assert layout_problems(fig) == []


def test_the_judged_heatmaps_are_at_the_reference_learning_rate(tmp_path):
    """An lr sweep beside the fixed arm (the full demo's) does not put its rates among the settings C6 judges."""
    from smallinit.report.condensation import c6_judged

    fixed = ["model.gate=elementwise", "model.norm_eps=1e-12"]
    groups = {}
    for lr, seeds in ((0.003, (0, 1)), (0.01, (0,))):
        for gamma in (0.5, 1.0):
            for seed in seeds:
                name = f"lr{lr}-g{gamma}-s{seed}"
                fake_run(
                    tmp_path / name,
                    3.0,
                    f"model.gamma={gamma}",
                    f"train.lr={lr}",
                    f"train.seed={seed}",
                    *fixed,
                )
            groups[lr, gamma] = [
                r for seed in seeds for r in find_runs(tmp_path / f"lr{lr}-g{gamma}-s{seed}")
            ]
    judged = c6_judged(list(groups.values()))
    assert set(judged) == {id(groups[0.003, 0.5]), id(groups[0.003, 1.0])}


def test_token_comparisons_of_several_seeds_are_pooled_with_the_seeds_folded(tmp_path):
    for seed, shift in ((0, 0.0), (1, 0.1), (2, 0.2)):
        gap_result(seed, shift).save(tmp_path / f"seed{seed}")
    made = []
    real = model_figures.token_gap_pooled_figure
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_figures, "token_gap_pooled_figure", lambda *a: made.append(real(*a)) or made[-1])
        assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    shown, _, folded = page.partition("<details><summary>each seed on its own: 3 comparisons")
    assert (
        "<h2>Token level: γ = 1 vs γ = 0.5 (3 seeds pooled)</h2>" in shown and "<h2>Token level" not in folded
    )
    assert shown.count('alt="token gap by difficulty, seeds pooled"') == 1
    assert (
        folded.count('alt="token gap by difficulty"') == 3 and folded.count("<h3>Token level: γ=1 (seed") == 3
    )
    # bin 1: Δ_sym 0, 0.1, 0.2 over the seeds: mean 0.1, SE 0.1/√3
    assert "<td>1</td><td>300</td><td>0.1</td><td>0.0577</td>" in shown
    heights = [bar.get_height() for bar in made[0].axes[0].patches]
    assert heights == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert layout_problems(made[0]) == []


def test_analyze_figure_stays_legible_with_many_long_module_names(tmp_path):
    """17 norms with Hugging Face's long names (8 layers): a row each, every label on the canvas, and each
    matrix's stable rank written in the figure."""
    names = [
        f"model.layers.{i}.{kind}"
        for i in range(8)
        for kind in ("input_layernorm", "post_attention_layernorm")
    ]
    mats = [
        {
            "name": f"model.layers.{i}.self_attn.q_proj.weight",
            "shape": [64, 64],
            "stable_rank": 10.0 + i,
            "stable_rank_fraction": (10.0 + i) / 64,
            "mean_abs_cos": 0.1,
        }
        for i in range(8)
    ]
    result = {
        "sink": {"per_layer": [0.1] * 8, "uniform_per_layer": [0.05] * 8},
        "seq_len": 64,
        "norm_factor": {**{n: 0.9 for n in names}, "model.norm": 0.8},
        "matrices": mats,
    }
    made = []
    real = model_figures.save
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_figures, "save", lambda fig, path, *a: made.append(fig) or real(fig, path, *a))
        model_figures.analysis_figures(
            AnalysisResult.from_dict(result), tmp_path
        )  # a file with only these fields
    sink, norms = made
    assert [ln.get_label() for ln in sink.axes[0].get_lines()][-1] == "uniform attention (T = 64)"
    FigureCanvasAgg(norms).draw()
    ax = norms.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == [
        "layers.0.input_layernorm",
        "layers.0.post_attention_layernorm",
    ]
    assert ax.get_window_extent().height >= 17 * 15  # at least 15 px a row
    assert layout_problems(norms) == [] and smallest_text_px(norms) >= 10.0
    assert {t.get_text() for t in norms.axes[1].texts} >= {"10.0 of 64", "17.0 of 64"}


def test_demo_refuses_an_out_that_is_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("mine")
    for out in ("taken", "taken/below"):
        assert main(["demo", "--scale", "quick", "--out", out]) == 2
        err = capsys.readouterr().err
        assert (
            err.strip().endswith("is a file, not a folder; choose another --out") and err.count("\n") == 1
        ), err
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["taken"] and (tmp_path / "taken").read_text() == "mine"
    )


def test_a_course_no_run_recorded_says_so_in_its_axes():
    """A Monitor outside smallinit's trainer records each matrix's RMS but no √(η/λ) unless told: the second
    panel of the weight-norm figure says why it is empty instead of drawing bare axes."""
    curves = {"all runs": {"rms": [[(0, 0.02), (10, 0.03)]], "rms_ratio": [[]]}}  # one seed, no ratio
    fig = figures.courses_figure({"": curves}, figures.WEIGHT_RMS)
    rms, ratio = fig.axes[:2]
    assert not rms.texts and rms.lines
    assert [t.get_text() for t in ratio.texts] == [figures.WEIGHT_RMS[1].missing] and not ratio.lines
    assert "steady_rms" in figures.WEIGHT_RMS[1].missing
    assert layout_problems(fig) == []
