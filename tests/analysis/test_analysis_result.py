"""analysis.json as a type (smallinit.analysis.result): what analyze writes is what the type reads back, an
older file with fields missing still parses, anything else is refused, and the report and analyze's lines
show the file's numbers."""

from __future__ import annotations

import contextlib
import io
import json
import statistics

import numpy as np
import pytest

from smallinit.analysis.result import AnalysisResult
from smallinit.cli import main
from smallinit.measures.sink import Sink
from smallinit.report import build_report
from smallinit.report.markup import num
from support.runs import TINY_MODEL

# the order analyze has always written a run's analysis.json in (a reader diffing two files relies on it)
RUN_KEYS = [
    "checkpoint",
    "step",
    "config",
    "data",
    "sink",
    "residual_flow",
    "norm_factor",
    "max_attention_logit",
    "massive",
    "loss",
    "not_measured",
    "tokens",
    "seq_len",
    "matrices",
    "matrices_left_out",
    "norm_factor_analytic",
]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """A tiny run trained for 2 steps and analysed on 2 batches: (the folder above the run, the analysis
    folder, what analyze printed)."""
    root = tmp_path_factory.mktemp("analysed")
    sets = [*TINY_MODEL, "train.batch_size=2", "train.steps=2", "train.eval_every=0", "train.warmup_steps=1"]
    assert main(["train", "--out", str(root / "run"), *sum((["--set", s] for s in sets), [])]) == 0
    out = root / "run" / "analysis"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert (
            main(
                [
                    "analyze",
                    str(root / "run"),
                    "--out",
                    str(out),
                    "--set",
                    "train.eval_batches=2",
                    "--set",
                    "train.batch_size=2",
                ]
            )
            == 0
        )
    return root, out, printed.getvalue()


def _row(cells) -> str:
    return "<tr>" + "".join(f"<td>{num(c)}</td>" for c in cells) + "</tr>"


def test_what_analyze_writes_the_type_reads_back_attribute_for_attribute(analysed):
    root, out, printed = analysed
    raw = json.loads((out / "analysis.json").read_text())
    a = AnalysisResult.from_dict(raw)
    assert a.to_dict() == raw and list(a.to_dict()) == list(raw) == RUN_KEYS
    assert list(a.to_dict()["sink"]) == list(raw["sink"])
    # the attributes are the file's values, not re-derived ones
    s = raw["sink"]
    assert a.sink.per_layer == tuple(s["per_layer"]) and len(a.sink.per_layer) == 2
    assert a.sink.per_head == tuple(map(tuple, s["per_head"])) and a.sink.layers == tuple(s["layers"])
    assert (a.sink.mean, a.sink.uniform, a.sink.uniform_per_layer) == (
        s["mean"],
        s["uniform"],
        tuple(s["uniform_per_layer"]),
    )
    assert a.sink.share_above == {0.3: s["share_above"]["0.3"], 0.8: s["share_above"]["0.8"]}
    assert (a.residual_flow, a.loss, a.tokens, a.seq_len) == (raw["residual_flow"], raw["loss"], 128, 32)
    assert a.norm_factor == raw["norm_factor"] and list(a.norm_factor) == list(raw["norm_factor"])
    assert [m.to_dict() for m in a.matrices] == raw["matrices"]
    assert [m.stable_rank_fraction for m in a.matrices] == [
        m["stable_rank_fraction"] for m in raw["matrices"]
    ]
    assert a.step == 2 and a.checkpoint == raw["checkpoint"] and a.data == raw["data"] and a.hf_config is None
    assert a.run_config.model.d_model == 32 and a.norm_factor_analytic == raw["norm_factor_analytic"]
    assert a.not_measured == {} and a.notes == ()
    # analyze's lines print the file's numbers
    assert (
        f"sink score {s['mean']:.4f}: " in printed and f"Sink_0.3 {s['share_above']['0.3']:.0%}: " in printed
    )
    assert f"residual flow {raw['residual_flow']:.4g}: " in printed

    # the report shows the same sink and Sink_ε numbers: the sink table's row and the analyses table's
    page = build_report(root).read_text(encoding="utf-8")
    name = "run/analysis/analysis.json"
    shares = [s["share_above"]["0.3"], s["share_above"]["0.8"]]
    assert (
        _row(
            [
                name,
                1,
                2,
                float(np.mean(s["uniform_per_layer"])),
                *shares,
                statistics.fmean(s["per_layer"]),
                *s["per_layer"],
            ]
        )
        in page
    )
    mats = raw["matrices"]
    assert (
        _row(
            [
                name,
                2,
                raw["loss"],
                128,
                s["mean"],
                shares[0],
                raw["residual_flow"],
                min(raw["norm_factor"].values()),
                float(np.median([m["stable_rank_fraction"] for m in mats])),
                float(np.median([m["mean_abs_cos"] for m in mats])),
            ]
        )
        in page
    )


def test_an_older_file_parses_with_what_it_lacks_empty_and_the_report_says_so(analysed, tmp_path):
    _, out, _ = analysed
    raw = json.loads((out / "analysis.json").read_text())
    for key in ("seq_len", "not_measured", "matrices_left_out", "norm_factor_analytic", "data", "tokens"):
        del raw[key]
    raw["sink"] = {
        k: raw["sink"][k] for k in ("per_layer", "per_head", "mean")
    }  # before layers, uniform, Sink_ε
    old = AnalysisResult.from_dict(raw)
    assert (
        old.seq_len is None and old.tokens is None and old.not_measured == {} and old.matrices_left_out == {}
    )
    assert old.sink.share_above == {} and old.sink.uniform is None and old.sink.uniform_per_layer == ()
    assert (
        old.norm_factor_analytic is None
        and old.data is None
        and old.sink.per_layer == tuple(raw["sink"]["per_layer"])
    )
    (tmp_path / "analysis.json").write_text(json.dumps(raw))
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert (
        "No uniform reference for analysis.json: written before analyze recorded its sequence length" in page
    )
    s = raw["sink"]
    assert (
        _row(["analysis.json", 1, 2, "–", "–", "–", statistics.fmean(s["per_layer"]), *s["per_layer"]])
        in page
    )


def test_what_is_not_an_analysis_is_refused_not_read_as_an_empty_one():
    with pytest.raises(ValueError, match="not an analysis"):
        AnalysisResult.from_dict({"matrices": []})  # none of the measurements
    with pytest.raises(ValueError, match="not an analysis"):
        AnalysisResult.from_dict({"sink": {"per_layer": [0.1]}})  # no matrices
    with pytest.raises(TypeError, match="sink.per_layer"):
        AnalysisResult.from_dict({"matrices": [], "sink": {"per_layer": "0.1, 0.2"}})
    with pytest.raises(TypeError, match="residual_flow"):
        AnalysisResult.from_dict({"matrices": [], "residual_flow": "high"})
    assert (
        AnalysisResult.from_dict({"matrices": [], "sink": {}, "residual_flow": 1.5}).sink is None
    )  # empty: none
    assert Sink.from_dict({"per_layer": [0.5], "share_above": {"0.3": 1.0}}).share_above == {0.3: 1.0}
