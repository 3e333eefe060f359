"""Verdict rules, claim pairing, and the HTML report: self-contained, escaped, every section present."""

from __future__ import annotations

import base64
import json
import math
import re
import statistics

import pytest

from smallinit.analysis import load_run, residual_flow_ratio
from smallinit.analysis.measure import held_out_batches
from smallinit.cli import main
from smallinit.data import load_tokenizer
from smallinit.report import judge, verdict_paired, verdict_unpaired
from smallinit.report.html import num

# -- verdicts -------------------------------------------------------------------------------------------------


def test_verdict_rules():
    diffs = [-0.051, -0.047, -0.055, -0.049]
    v = verdict_paired(diffs, "negative")
    assert v.label == "agree" and v.n == 4
    assert v.mean == pytest.approx(statistics.fmean(diffs))
    assert v.se == pytest.approx(statistics.stdev(diffs) / 2)
    assert verdict_paired(diffs, "positive").label == "disagree"
    assert verdict_paired([0.01, -0.02, 0.015], "positive").label == "inconclusive"  # within 2 SE of 0
    assert verdict_paired([0.3], "positive").label == "inconclusive"  # one seed: no spread
    assert verdict_paired([], "positive").label == "inconclusive"
    # an exponent against a prediction: agree inside the band, disagree clearly outside, else inconclusive
    assert verdict_paired([0.02, -0.01, 0.03], "zero", tolerance=0.15).label == "agree"
    assert verdict_paired([0.5, 0.52, 0.49], "zero", tolerance=0.15).label == "disagree"
    assert verdict_paired([0.1, 0.2, 0.15], "zero", tolerance=0.15).label == "inconclusive"
    assert judge(1.0, 0.0, 1, "positive", min_n=1).label == "agree"  # deterministic, no spread needed
    u = verdict_unpaired([1.0, 1.1, 0.9], [2.0, 2.1, 1.9], "positive")
    assert u.label == "agree" and u.mean == pytest.approx(1.0)
    assert u.se == pytest.approx(math.sqrt(2 * (0.01 / 3)))


# -- the report --------------------------------------------------------------------------------------------------

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=2", "model.d_ff=64",
        "data.tokenizer=bytes", "data.seq_len=32", "train.batch_size=4", "train.steps=4", "train.eval_every=0",
        "train.log_every=2", "train.warmup_steps=1", "analysis.every=2", "analysis.snapshots=2",
        "analysis.heatmap_rows=16"]


def _sets(items):
    return sum((["--set", s] for s in items), [])


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    corpus = root / "hostile.txt"
    corpus.write_text("<script>alert('x')</script> & <b>bold</b> text " * 400, encoding="utf-8")
    runs = root / "runs"
    for gamma in (0.5, 1.0):
        extra = [f"data.corpus={json.dumps(str(corpus))}", f"model.gamma={gamma}"]
        assert main(["train", "--out", str(runs / f"g{gamma}"), *_sets(TINY + extra)]) == 0
    assert main(["analyze", str(runs / "g1.0"), "--batches", "1", "--batch-size", "2"]) == 0
    assert main(["compare", str(runs / "g1.0"), str(runs / "g0.5"), "--out", str(root / "cmp"), "--top-k", "3",
                 "--batch-size", "2"]) == 0
    assert main(["coordcheck", "--out", str(root / "cc"), "--gammas", "0.5,1", "--steps", "1", "--batch-size", "2",
                 *_sets(["model.n_layers=2", "model.vocab_size=257", "data.seq_len=16"]), "--residual-flow",
                 "--widths", "32,64", "--seeds", "0,1"]) == 0
    assert main(["report", str(root)]) == 0
    return root


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
    for section in ("Claims and verdicts", "Loss curves (mean over seeds)", "RMSNorm factor against γ", "Loss curves", "Attention sink per layer",
                    "Residual flow", "Condensation", "Token level", "Coordinate check", "Single-model analyses"):
        assert section in page, section


def test_report_numbers_come_from_the_files(report_dir):
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    cmp = json.loads((report_dir / "cmp" / "compare.json").read_text())
    assert f"{cmp['tokens']:,} tokens" in page
    # the claims are judged by the recipes' functions from these files: C5 per γ of the width sweep, C7 from
    # the γ = 1 vs γ = 0.5 comparison (one seed, so inconclusive whatever its sign)
    sweep = json.loads((report_dir / "cc" / "residual_flow_sweep.json").read_text())
    for gamma, seed_slopes in zip(sweep["gammas"], sweep["seed_slopes"]):
        mean = statistics.fmean(s - (1 - gamma) for s in seed_slopes)
        assert f"flow exponent − (1−γ) at γ{gamma:g}: {mean:+.3f} ± " in page
    d = [b["mean_delta_sym"] for b in cmp["bins"]]
    mid_easy = statistics.fmean(d[4:9]) - statistics.fmean(d[:3])
    assert f"Δ_sym mid−easy deciles: {mid_easy:+.3f} (n=1): inconclusive" in page
    analysis = json.loads((report_dir / "runs" / "g1.0" / "analysis" / "analysis.json").read_text())
    assert {m["name"] for m in analysis["matrices"]} >= {"embed.weight", "blocks.1.mlp.down_proj.weight"}
    # analyze measured the trained model on the run's first validation windows
    run = load_run(report_dir / "runs" / "g1.0")
    x, y = next(held_out_batches(run.config, load_tokenizer("bytes"), batches=1, batch_size=2))
    assert analysis["loss"] == pytest.approx(run.model(x, y).loss.item(), rel=1e-5)
    assert analysis["residual_flow"] == pytest.approx(residual_flow_ratio(run.model, x), rel=1e-5)
    assert f"<td>{num(analysis['sink']['mean'])}</td>" in page


def test_report_refuses_an_empty_folder(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds no runs" in err
    assert not (tmp_path / "report.html").exists()
