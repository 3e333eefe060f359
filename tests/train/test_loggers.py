"""Metric loggers: TensorBoard mirrors metrics.jsonl; --wandb without the package is a one-line error."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from smallinit.cli import main
from smallinit.config import Config
from smallinit.train import Trainer
from smallinit.train.callbacks import Callback
from smallinit.train.loggers import TensorBoardLogger, scalars
from support.runs import TINY_MODEL


def tiny(corpus: Path) -> list[str]:
    return [
        *TINY_MODEL,
        f"data.corpus={corpus}",
        "model.max_seq_len=64",
        "train.steps=4",
        "train.batch_size=4",
        "train.warmup_steps=1",
        "train.log_every=2",
        "train.eval_every=2",
        "train.eval_batches=1",
    ]


def test_tensorboard_mirrors_every_logged_number(corpus, tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    # an MoE model, so the trainer also logs "moe" event records (tagged moe/...)
    overrides = [*tiny(corpus), "train.tensorboard=true", "model.moe.num_experts=2", "model.moe.top_k=1"]
    Trainer(Config.load(overrides=overrides), tmp_path / "run", callbacks=[]).fit()

    expected: dict[str, dict[int, float]] = {}
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        prefix = record["event"] + "/" if "event" in record else ""
        for key, value in record.items():
            if key not in ("step", "event") and isinstance(value, (int, float)) and math.isfinite(value):
                expected.setdefault(prefix + key, {})[record["step"]] = float(value)
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "moe/balance_loss"} <= set(expected)

    acc = event_accumulator.EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(expected)
    for tag, by_step in expected.items():
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert got.keys() == by_step.keys(), tag
        for step, value in by_step.items():
            assert got[step] == pytest.approx(value, rel=1e-6), (tag, step)


class _Crash(Callback):
    def on_step_end(self, trainer, record):
        if record["step"] == 3:
            raise RuntimeError("simulated crash after step 3")


def test_tensorboard_after_resume_matches_metrics(corpus, tmp_path):
    """A crash after step 3 (checkpoint at 2) then --resume: TensorBoard drops the replayed step 3."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    cfg = [*tiny(corpus), "train.tensorboard=true", "train.log_every=1", "train.checkpoint_every=2"]
    crashing = Trainer(Config.load(overrides=cfg), tmp_path / "run", callbacks=[_Crash()])
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashing.fit()
    for cb in crashing.callbacks:  # what a crashed process had flushed
        if isinstance(cb, TensorBoardLogger):
            cb.writer.close()
    Trainer(Config.load(overrides=cfg), tmp_path / "run", resume=True, callbacks=[]).fit()

    losses = {
        r["step"]: r["loss"]
        for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").open())
        if "loss" in r and "event" not in r
    }
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    events = acc.Scalars("loss")
    assert [e.step for e in events] == [1, 2, 3, 4] == sorted(losses)
    assert [e.value for e in events] == pytest.approx([losses[s] for s in (1, 2, 3, 4)], rel=1e-6)


def test_scalars_flattens_tables_and_skips_the_rest():
    record = {
        "step": 7,
        "event": "probe",
        "a": 1,
        "ok": True,
        "t": {"x": 0.5, "y": {"z": 2}},
        "lst": [1, 2],
        "s": "text",
        "n": float("nan"),
    }
    assert scalars(record) == {"probe/a": 1.0, "probe/ok": 1.0, "probe/t/x": 0.5, "probe/t/y/z": 2.0}


def test_tensorboard_is_off_by_default(corpus, tmp_path):
    Trainer(Config.load(overrides=[*tiny(corpus), "train.steps=1"]), tmp_path / "run", callbacks=[]).fit()
    assert not (tmp_path / "run" / "tb").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_flag_without_the_package_is_a_one_line_error(corpus, tmp_path, capsys):
    argv = ["train", "--set", "train.wandb=true", "--out", str(tmp_path / "run")]
    for item in tiny(corpus):
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "wandb" in err
    assert not (tmp_path / "run").exists()
