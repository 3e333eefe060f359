"""metrics.jsonl read back as types: every record a real run writes parses to the values in the file, an older
file that lacks fields still parses, and a line of a kind not typed is skipped, never read as another kind."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from smallinit.analysis.result import AnalysisResult
from smallinit.cli import main
from smallinit.config import Config
from smallinit.measures.activations import Activations
from smallinit.measures.condensation import MatrixStat
from smallinit.measures.massive import MassiveActivations
from smallinit.measures.sink import Sink
from smallinit.monitor.metrics import append_record
from smallinit.monitor.records import AnalysisRecord, EvalRecord, NormFactorRecord, StepRecord, parse_record
from smallinit.monitor.runs import Run
from support.runs import TINY_MODEL


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "run"
    sets = [
        *TINY_MODEL,
        "train.steps=6",
        "train.batch_size=2",
        "train.eval_every=3",
        "train.eval_batches=1",
        "train.log_every=2",
        "train.warmup_steps=1",
        "train.device=cpu",
        "train.precision=fp32",
        "train.threads=1",
        "data.corpus=shakespeare",
        "analysis.every=3",
        "analysis.norm_every=1",
        "analysis.batch_size=2",
    ]
    assert main(["train", "--out", str(out), *sum((["--set", s] for s in sets), [])]) == 0
    return out


def lines(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_each_record_of_a_real_run_parses_to_the_values_in_its_file(run_dir):
    raw = lines(run_dir)
    run = Run.load(run_dir)
    evals = [r for r in raw if "val_loss" in r]
    assert [(e.step, e.val_loss) for e in run.evals] == [(r["step"], r["val_loss"]) for r in evals]
    assert [e.step for e in run.evals] == [0, 3, 6]
    steps = [r for r in raw if "loss" in r and "event" not in r]
    assert [(s.step, s.loss, s.lr, s.grad_norm, s.tokens_per_s) for s in run.train_log] == [
        (r["step"], r["loss"], r["lr"], r["grad_norm"], r["tokens_per_s"]) for r in steps
    ]
    analysis = [r for r in raw if r.get("event") == "analysis"]
    assert [a.step for a in run.analysis] == [r["step"] for r in analysis] == [0, 3, 6]
    for a, r in zip(run.analysis, analysis):
        assert a.sink.per_layer == tuple(r["sink"]["per_layer"]) and len(a.sink.per_layer) == 2
        assert a.sink.mean == r["sink"]["mean"] and a.sink.per_head == tuple(
            map(tuple, r["sink"]["per_head"])
        )
        assert {str(eps): v for eps, v in a.sink.share_above.items()} == r["sink"]["share_above"]
        assert set(a.sink.share_above) == {0.3, 0.8}
        assert a.norm_factor == r["norm_factor"] and list(a.norm_factor) == list(
            r["norm_factor"]
        )  # module order
        assert a.mean_norm_factor == pytest.approx(sum(r["norm_factor"].values()) / len(r["norm_factor"]))
        assert (
            a.by_matrix("stable_rank") == {m["name"]: m["stable_rank"] for m in r["matrices"]} and a.matrices
        )
        assert a.by_matrix("mean_abs_cos") == {m["name"]: m["mean_abs_cos"] for m in r["matrices"]}
        assert a.max_attention_logit == tuple(r["max_attention_logit"]) and len(a.max_attention_logit) == 2
        assert a.massive.ratio == tuple(r["massive"]["ratio"]) and len(a.massive.ratio) == 2
        assert (a.residual_flow, a.loss, a.not_measured) == (r["residual_flow"], r["loss"], r["not_measured"])
        assert a.to_dict() == r  # the writer's dict: the schema is this one type
    norms = [r for r in raw if r.get("event") == "norm_factor"]
    assert [(n.step, n.norm_factor) for n in run.norm_records] == [
        (r["step"], r["norm_factor"]) for r in norms
    ]
    assert [n.step for n in run.norm_records] == list(range(7))
    for rec in (*run.evals, *run.train_log, *run.norm_records):
        assert rec.to_dict() in raw
    assert run.cfg == Config.from_json_file(run_dir / "config.json") and run.cfg.analysis.every == 3


def test_an_older_file_without_later_fields_parses(tmp_path):
    old = {"event": "analysis", "step": 10, "sink": {"1": 0.5, "0": 0.25}, "stable_rank": {"q": 3.0}}
    a = parse_record(old)
    assert isinstance(a, AnalysisRecord)
    assert (a.step, a.sink.per_layer, a.by_matrix("stable_rank")) == (
        10,
        (0.25, 0.5),
        {"q": 3.0},
    )  # layer order
    assert (a.sink.mean, a.residual_flow, a.loss, a.mean_norm_factor, a.massive) == (None,) * 5
    assert (a.sink.share_above, a.norm_factor, a.by_matrix("mean_abs_cos"), a.not_measured) == (
        {},
        {},
        {},
        {},
    )
    assert a.max_attention_logit == () and a.matrices[0].stable_rank_fraction is None  # no shape then
    assert parse_record({"event": "norm_factor", "step": 0}) == NormFactorRecord(0, {})
    assert parse_record({"step": 4, "loss": 2.5}) == StepRecord(4, 2.5)
    nan = parse_record({"step": 5, "val_loss": float("nan")})
    assert isinstance(nan, EvalRecord) and not nan.finite and math.isnan(nan.val_loss)


def test_a_kind_not_typed_is_skipped_not_misread(tmp_path):
    (tmp_path / "config.json").write_text(Config.load(overrides=TINY_MODEL).to_json())
    recs = [
        {"step": 0, "val_loss": 5.0},
        {"event": "analysis_v2", "step": 1, "sink": {"0": 0.9}, "norm_factor": {"n": 0.1}},  # a later kind
        {"event": "moe", "step": 1, "loss": 9.0, "balance_loss": 0.1},  # known, but no type here
        {"event": "steps", "step": 1, "before": 0, "after": 4},
        {"event": "analysis", "step": "one", "sink": {"0": 0.9}},  # not a step
        {"event": "nonfinite", "step": 2, "loss": float("nan"), "lr": 1e-3, "grad_norm": float("inf")},
        {"step": 4, "val_loss": 4.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n{torn")
    run = Run.load(tmp_path)
    assert run.analysis == [] and run.norm_records == [] and run.train_log == []
    assert [(e.step, e.val_loss) for e in run.evals] == [(0, 5.0), (4, 4.0)]
    assert [r.step for r in run.nonfinite] == [2] and run.nonfinite[0].nonfinite
    assert parse_record({"event": 3, "step": 0, "val_loss": 1.0}) is None  # an event that is no name


# Every field of the typed measurement, each set to a value that is not its default: a field the Monitor's
# metrics.jsonl or analyze's analysis.json drops, or reads back as something else, fails below.
EVERY_FIELD = Activations(
    sink=Sink(
        per_layer=(0.1, 0.2),
        per_head=((0.1,), (0.2, 0.3)),
        mean=0.15,
        layers=("a", "b"),
        uniform=0.05,
        uniform_per_layer=(0.04, 0.06),
        share_above={0.3: 0.25, 0.8: 0.0},
    ),
    residual_flow=1.5,
    norm_factor={"n1": 0.9, "n0": 0.5},
    max_attention_logit=(3.0, 41.5),
    massive=MassiveActivations(ratio=(5.0, 612.0), dims=((), (7, 3))),
    loss=2.25,
    not_measured={"norm_factor:x": "why not"},
    notes=("sink: how",),
)


def test_every_field_of_a_measurement_survives_the_monitors_file_and_analyzes_file(tmp_path):
    listed = ["sink", "residual_flow", "norm_factor", "max_attention_logit", "massive", "loss"]
    assert [f.name for f in dataclasses.fields(Activations)] == [*listed, "not_measured", "notes"]
    for f in dataclasses.fields(Activations):
        assert getattr(EVERY_FIELD, f.name) not in (None, {}, ()), f.name
    (tmp_path / "config.json").write_text(Config.load(overrides=TINY_MODEL).to_json())
    matrices = (MatrixStat("w", (4, 8), 2.5, 0.125),)
    append_record(tmp_path, AnalysisRecord(**vars(EVERY_FIELD), step=7, matrices=matrices).to_dict())
    from_metrics = Run.load(tmp_path).analysis[0]
    written = json.dumps(AnalysisResult(**vars(EVERY_FIELD), matrices=matrices, tokens=64).to_dict())
    from_analysis = AnalysisResult.from_dict(json.loads(written))
    for back in (from_metrics, from_analysis):
        for f in dataclasses.fields(Activations):
            assert getattr(back, f.name) == getattr(EVERY_FIELD, f.name), f.name
        assert back.matrices == matrices
    assert from_metrics.step == 7 and from_analysis.tokens == 64
