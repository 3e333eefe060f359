"""Verdict rules, claim pairing, and the HTML report: self-contained, escaped, every section present."""

from __future__ import annotations

import base64
import json
import math
import re
import statistics
from pathlib import Path

import pytest

from smallinit.analysis import load_run, residual_flow_ratio
from smallinit.analysis.measure import held_out_batches
from smallinit.cli import main
from smallinit.data import load_tokenizer
from smallinit.report import judge, verdict_paired, verdict_unpaired
from smallinit.report.html import CLAIMS, Run, evaluate_claims, num

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


def _run(gamma: float, seed: int, loss: float, eps: float = 1e-12) -> Run:
    cfg = {"model.gamma": gamma, "model.norm_eps": eps, "model.gate": "none", "train.seed": seed, "train.steps": 10}
    return Run(Path("."), f"g{gamma}-e{eps}-s{seed}", cfg, summary={"val_loss": loss, "step": 10})


def test_claims_pair_runs_by_seed_within_each_context():
    runs = []
    for s, noise in enumerate([0.002, -0.001, 0.0]):
        runs += [_run(0.5, s, 3.00 + noise), _run(1.0, s, 2.95 + noise)]  # γ = 1 better by 0.05 per seed
        runs += [_run(0.5, s, 3.00 + noise, 1e-5), _run(1.0, s, 3.02 + noise * 3, 1e-5)]  # worse at ε = 1e-5
    rows = [r for r in evaluate_claims(runs) if r.claim.id == "C1"]
    assert len(rows) == 2  # one per ε: the ε key is held equal inside a comparison
    by_ctx = {r.context: r for r in rows}
    good, bad = by_ctx["model.norm_eps=1e-12"], by_ctx["model.norm_eps=1e-05"]
    assert good.verdict.label == "agree" and good.verdict.mean == pytest.approx(-0.05)
    assert bad.verdict.label == "disagree"
    c2 = [r for r in evaluate_claims(runs) if r.claim.id == "C2"]  # ε 1e-5 → 1e-12, per γ
    assert {r.context for r in c2} == {"model.gamma=0.5", "model.gamma=1.0"}
    single = evaluate_claims([_run(0.5, 0, 3.0), _run(1.0, 0, 2.9)])
    assert [r.verdict.label for r in single if r.claim.id == "C1"] == ["inconclusive"]
    assert {c.id for c in CLAIMS} >= {"C1", "C2", "C3"}


def test_token_verdict_locates_the_gain():
    from smallinit.analysis.tokens import DifficultyBin, TokenGapResult
    from smallinit.report.html import token_verdict

    def result(means):
        bins = [DifficultyBin(i, i + 1, 100, i + 0.5, m, 0.01, m, 0.01) for i, m in enumerate(means)]
        return TokenGapResult(tokens=100 * len(means), mean_delta_sym=0.0, mean_loss_a=0.0, mean_loss_b=0.0,
                              bins=bins, top_a=[], top_b=[])

    assert token_verdict(result([0.0, 0.2, 0.3, 0.05])).label == "agree"  # interior peak, clear of both ends
    assert token_verdict(result([0.5, 0.2, 0.1, 0.05])).label == "disagree"  # gains on the easiest tokens
    assert token_verdict(result([0.0, 0.2, 0.3, 0.5])).label == "disagree"  # gains on the noisiest tokens
    assert token_verdict(result([0.0, 0.2, 0.3, 0.29])).label == "inconclusive"  # peak not clear of the end
    assert token_verdict(result([-0.5, -0.2, -0.1, -0.3])).label == "inconclusive"  # A better nowhere


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
                 "--batch-size", "2", "--bins", "4"]) == 0
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
    sweep = json.loads((report_dir / "cc" / "residual_flow_sweep.json").read_text())
    assert len(sweep["slopes"]) == 2 and page.count("C5</td>") == 2  # one verdict row per γ
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
