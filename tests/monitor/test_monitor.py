"""The Monitor along training that smallinit does not run: a plain loop on a Hugging Face model, its records
read back by `smallinit report`, its bad inputs refused in one line; and smallinit's own Python Trainer
honouring analysis.every exactly as the CLI does."""

from __future__ import annotations

import logging
import multiprocessing as mp

import pytest
import torch

from smallinit import Monitor
from smallinit.config import Config
from smallinit.errors import ConfigError, ModelError
from smallinit.measures.activations import measure_activations
from smallinit.monitor.records import parse_record
from smallinit.monitor.runs import find_runs
from smallinit.report import build_report
from smallinit.train import Trainer
from support.monitor import records, tiny_qwen3, tokens
from support.runs import TINY_MODEL

transformers = pytest.importorskip("transformers")


def test_a_plain_loop_is_measured_and_reported(tmp_path):
    model, held_out = tiny_qwen3(), tokens(4, seed=1)
    out = tmp_path / "loop"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with Monitor(
        model, every=25, batch=held_out, out=out, total_steps=100, settings={"model.gamma": 1.0}
    ) as mon:
        mon(0)
        for step in range(1, 101):
            x = tokens(8, seed=100 + step)
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon(step)
            mon(step)  # a second call at the same step records nothing more
    recs = records(out)
    assert [r["step"] for r in recs] == [0, 25, 50, 75, 100]
    # each record is the measurement of the model as it was at that step: the last one is today's model
    again = measure_activations(model, held_out[:, :-1], held_out[:, 1:])
    assert recs[-1]["residual_flow"] == pytest.approx(again.residual_flow, rel=1e-6)
    assert recs[-1]["loss"] == pytest.approx(again.loss, rel=1e-6) and recs[-1]["loss"] < recs[0]["loss"] - 1
    first = parse_record(recs[0])
    assert len(first.sink.per_layer) == 2 and first.matrices and first.norm_factor
    assert len(first.max_attention_logit) == 2 and len(first.massive.ratio) == 2
    val = [
        r for r in records(out, None) if "val_loss" in r
    ]  # the held-out loss, as the report's validation curve
    assert [(r["step"], r["val_loss"]) for r in val] == [(r["step"], r["loss"]) for r in recs]
    assert sorted(p.name for p in (out / "analysis").glob("*.npz"))[0] == "rowcos_step_0000000.npz"
    (run,) = find_runs(tmp_path)
    assert run.config["model.gamma"] == 1.0 and run.config["model.class"] == "Qwen3ForCausalLM"
    html = build_report(out).read_text()
    for section in ("Loss curves", "Attention sink", "Residual flow", "Condensation"):
        assert section in html, section


def test_the_saturation_guard_speaks_once_at_step_0(tmp_path, caplog):
    model = tiny_qwen3(eps=1e-2)  # at d = 32, γ = 1: σ² ≈ 1e-3, so ε = 1e-2 saturates every norm
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        with Monitor(model, every=1, batch=tokens(2), out=tmp_path / "m") as mon:
            mon(0)
            mon(1)
    lines = [r.getMessage() for r in caplog.records if "saturated" in r.getMessage()]
    assert len(lines) == 1 and "at step 0" in lines[0] and "set_norm_eps_" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        with Monitor(tiny_qwen3(), every=1, batch=tokens(2), out=tmp_path / "n") as mon:
            mon(0)
    assert not [r for r in caplog.records if "saturated" in r.getMessage()]


def _hold(folder, ready, done):
    with Monitor(tiny_qwen3(), every=1, batch=tokens(2), out=folder):
        ready.set()
        done.wait(30)


def test_bad_input_is_one_line(tmp_path):
    model = tiny_qwen3()
    with pytest.raises(ConfigError, match="every or norm_every"):
        Monitor(model, every=0, batch=tokens(2), out=tmp_path / "a")
    with pytest.raises(ConfigError, match="more than the model's context of 64"):
        Monitor(model, batch=tokens(2, T=80), out=tmp_path / "b")
    with pytest.raises(ConfigError, match="batch= .* or data="):
        Monitor(model, out=tmp_path / "c")
    with pytest.raises(ModelError, match=r"cannot run Linear\(tokens\) on token ids .*; pass call="):
        Monitor(torch.nn.Linear(4, 4), batch=tokens(2), out=tmp_path / "d")
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        Monitor(model, batch=tokens(2), out=tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine"
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(tmp_path / "held", ready, done))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(
            ConfigError, match="being written by another training process; .*choose another out="
        ):
            Monitor(model, batch=tokens(2), out=tmp_path / "held")
    finally:
        done.set()
        holder.join(30)


def test_a_fresh_start_keeps_the_earlier_records_and_a_resume_drops_the_later_ones(tmp_path):
    model, out = tiny_qwen3(), tmp_path / "m"
    with Monitor(model, every=1, batch=tokens(2), out=out) as mon:
        for step in range(4):
            mon(step)
    with Monitor(model, every=1, batch=tokens(2), out=out, start_step=2) as mon:  # resumed from step 2
        mon(3)
    assert [r["step"] for r in records(out)] == [0, 1, 2, 3]
    with Monitor(model, every=1, batch=tokens(2), out=out) as mon:  # started over
        mon(0)
    assert [r["step"] for r in records(out)] == [0]
    assert (out / "metrics.attempt-1.jsonl").is_file()


def test_smallinits_own_trainer_honours_analysis_every_from_python(tmp_path):
    cfg = Config.load(
        None,
        overrides=[
            *TINY_MODEL,
            "train.steps=6",
            "train.batch_size=2",
            "train.eval_every=0",
            "train.warmup_steps=1",
            "analysis.every=3",
            "analysis.snapshots=2",
        ],
    )
    Trainer(cfg, tmp_path / "run", callbacks=[]).fit()
    assert [r["step"] for r in records(tmp_path / "run")] == [0, 3, 6]
    assert sorted(p.name for p in (tmp_path / "run" / "analysis").glob("*.npz")) == [
        "rowcos_step_0000000.npz",
        "rowcos_step_0000006.npz",
    ]
    cfg.analysis.every, cfg.analysis.norm_every = 0, 2  # the norm factors alone
    Trainer(cfg, tmp_path / "norms", callbacks=[]).fit()
    assert not records(tmp_path / "norms")
    assert [r["step"] for r in records(tmp_path / "norms", "norm_factor")] == [0, 2, 4, 6]


def test_the_trainers_guard_is_silent_where_saturation_is_asked_for(tmp_path, caplog):
    base = [
        *TINY_MODEL,
        "model.gamma=1.0",
        "train.steps=1",
        "train.batch_size=2",
        "train.eval_every=0",
        "train.warmup_steps=1",
        "analysis.every=1",
        "analysis.snapshots=0",
    ]
    for name, extra, warns in (
        ("saturated", ["model.norm_eps=1e-2"], True),
        ("emulated", ["model.norm_eps=1e-5", "model.norm_eps_width=2048"], False),
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="smallinit"):
            Trainer(Config.load(None, overrides=[*base, *extra]), tmp_path / name, callbacks=[]).fit()
        assert any("saturated at step 0" in r.getMessage() for r in caplog.records) == warns, name


def test_a_step_due_for_both_returns_the_full_record_and_a_dropped_monitor_frees_its_folder(tmp_path):
    import gc

    mon = Monitor(tiny_qwen3(), every=2, norm_every=1, batch=tokens(2), out=tmp_path / "m")
    assert mon(1)["event"] == "norm_factor" and mon(2)["event"] == "analysis"  # what an engine's loggers get
    del mon  # never closed: a training that raised
    gc.collect()
    Monitor(tiny_qwen3(), every=1, batch=tokens(2), out=tmp_path / "m").close()


def test_analyze_averages_ragged_heads_and_norms_some_batches_missed():
    from smallinit.measures.activations import Activations
    from smallinit.measures.sink import Sink

    a = Activations(Sink((0.2, 0.5), ((0.1, 0.3), (0.5,))), norm_factor={"n1": 1.0, "n2": 0.5}, notes=("x",))
    b = Activations(
        Sink((0.4, 0.7), ((0.3, 0.5), (0.7,))), norm_factor={"n1": 0.0}, not_measured={"n2": "why"}
    )
    mean = Activations.mean([a, b])
    assert [list(h) for h in mean.sink.per_head] == [pytest.approx([0.2, 0.4]), pytest.approx([0.6])]
    assert mean.sink.per_layer == pytest.approx((0.3, 0.6))
    assert mean.norm_factor == {"n1": 0.5, "n2": 0.5} and mean.not_measured == {"n2": "why"}
    assert mean.notes == ("x",)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_each_matrix_rms_is_recorded_beside_the_steady_state_of_its_optimizer(tmp_path, optimizer):
    """The RMS read back from metrics.jsonl is the weights' own at that step (the last record against the final
    checkpoint), and √(η/λ) is that of the optimizer holding the matrix: Muon's rate under Muon."""
    out = tmp_path / "run"
    cfg = Config.load(
        None,
        overrides=[
            *TINY_MODEL,
            "train.steps=4",
            "train.batch_size=2",
            "train.eval_every=0",
            "train.warmup_steps=1",
            "train.lr=0.004",
            "train.muon_lr=0.016",
            "train.weight_decay=0.25",
            f"train.optimizer={optimizer}",
            "analysis.every=4",
            'analysis.matrices=["*.attn.q_proj.weight", "*.mlp.down_proj.weight"]',
        ],
    )
    trainer = Trainer(cfg, out, callbacks=[])
    trainer.fit()
    last = parse_record(records(out)[-1])
    assert last.step == 4 and len(last.matrices) == 4
    params = dict(trainer.model.named_parameters())
    eta = 0.016 if optimizer == "muon" else 0.004
    for m in last.matrices:
        W = params[m.name].detach().double()
        assert m.rms == pytest.approx(W.pow(2).mean().sqrt().item(), rel=1e-9)
        assert m.steady_rms == pytest.approx((eta / 0.25) ** 0.5)
        assert m.rms_ratio == pytest.approx(m.rms / m.steady_rms)


def test_a_part_frozen_in_eval_mode_stays_so_after_an_observation(tmp_path):
    """A user who froze part of the model in eval mode (its dropout off) keeps it so: the Monitor measures in eval
    mode and puts back each module's own mode, not the root's on every module (which would turn that part's
    dropout on for the rest of training)."""
    model = tiny_qwen3()
    model.train()
    model.model.layers[0].eval()
    mon = Monitor(model, every=1, norm_every=1, batch=tokens(2), out=tmp_path / "m")
    mon(0)
    mon(1)
    mon.close()
    assert model.training and model.model.layers[1].training
    assert not any(m.training for m in model.model.layers[0].modules())
