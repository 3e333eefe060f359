"""Finished runs: resuming keeps everything, extending keeps the steps taken, --init-from seeds a new run;
and what training prints on the terminal."""

import contextlib
import io
import json
import logging
from pathlib import Path

import pytest
import torch

from smallinit import Config
from smallinit.cli import main
from smallinit.errors import ConfigError
from smallinit.train import Callback, Progress, Trainer
from support.runs import TINY_MODEL, final_tensors, snapshot

TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=8",
    "train.warmup_steps=2",
    "train.eval_batches=2",
    "train.log_every=2",
    "train.eval_every=4",
    "train.checkpoint_every=4",
]


def tiny(*extra: str) -> Config:
    return Config.load(overrides=[*TINY, *extra])


def sets(*extra: str) -> list[str]:
    return [a for s in (*TINY, *extra) for a in ("--set", s)]


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_resume_of_a_finished_run_keeps_everything(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *sets("train.steps=6")]) == 0
    before = snapshot(run)
    assert json.loads((run / "summary.json").read_text())["val_loss"] is not None
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume"]) == 0
    assert snapshot(run) == before  # summary.json's val_loss included
    out = capsys.readouterr()
    assert (
        out.out.startswith(f"nothing trained: {run} already reached train.steps=6")
        and out.out.count("\n") == 1
    )
    assert "done" not in out.out and "resumed" not in out.err  # not "resumed from step 6 ... done"
    # the way to train longer is one a cosine run allows: a new run from its weights, not a longer --resume
    assert f"--init-from {run} --set train.steps=N" in out.out and "--resume --set" not in out.out


def test_a_finished_run_whose_schedule_lengthens_is_told_to_resume_longer(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *sets("train.steps=4", 'train.schedule="constant"')]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume"]) == 0
    hint = capsys.readouterr().out
    assert f"smallinit train --out {run} --resume --set train.steps=N (N > 4)" in hint, hint
    assert main(["train", "--out", str(run), "--resume", "--set", "train.steps=6"]) == 0  # the hint runs


def test_cosine_run_refuses_to_extend_and_says_the_way_out(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *sets("train.steps=6")]) == 0
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--set", "train.steps=10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smallinit: error:") and err.count("\n") == 1
    assert "cosine" in err and f"--init-from {run}" in err and "train.steps=4" in err
    assert snapshot(run) == before
    assert main(["train", "--out", str(run), "--resume", "--set", "train.steps=3"]) == 2
    assert "below step 6" in capsys.readouterr().err
    assert snapshot(run) == before


@pytest.mark.parametrize("schedule", ["constant", "wsd"])
def test_extension_equals_the_longer_run_planned_from_the_start(tmp_path, schedule):
    """constant: a finished run extends; WSD: a run stopped in its stable phase (its decay starts at step 10
    of 12; the newest checkpoint is step 4) does."""
    extra = (f"train.schedule={schedule}", "train.decay_frac=0.2")
    Trainer(tiny("train.steps=16", *extra), tmp_path / "long", callbacks=[]).fit()
    run = tmp_path / "run"

    class StopAt8(Callback):
        def on_step_end(self, trainer, record):
            if trainer.step == 8 and schedule == "wsd":
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) if schedule == "wsd" else contextlib.nullcontext():
        Trainer(tiny("train.steps=12", *extra), run, callbacks=[StopAt8()]).fit()
    first = records(run)
    resumed = Trainer(
        Config.from_json_file(run / "config.json", ["train.steps=16"]), run, resume=True, callbacks=[]
    )
    assert resumed.steps_before == 12
    step = resumed.restored.step
    assert step == (12 if schedule == "constant" else 4)
    summary = resumed.fit()
    long, ext = final_tensors(tmp_path / "long"), final_tensors(run)
    assert long.keys() == ext.keys() and all(torch.equal(long[k], ext[k]) for k in long)
    assert summary["step"] == 16 and json.loads((run / "config.json").read_text())["train"]["steps"] == 16
    logged = records(run)
    kept = [r for r in first if r["step"] <= step]
    assert logged[: len(kept)] == kept  # the steps taken keep their records
    assert {"step": step, "event": "steps", "before": 12, "after": 16} in logged


def test_finished_wsd_run_refuses_to_extend(tmp_path):
    run = tmp_path / "run"
    Trainer(tiny("train.steps=12", "train.schedule=wsd"), run, callbacks=[]).fit()
    with pytest.raises(ConfigError, match=r"before the decay \(step 10\)"):
        Trainer(
            Config.from_json_file(run / "config.json", ["train.steps=20"]), run, resume=True, callbacks=[]
        )


def test_init_from_starts_a_new_run_from_the_weights(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--out", str(a), *sets("train.steps=8")]) == 0
    before = snapshot(a)
    assert main(["train", "--out", str(b), "--init-from", str(a), "--set", "train.steps=4"]) == 0
    err = capsys.readouterr().err
    assert "weights from" in err and "fresh optimizer" in err
    assert snapshot(a) == before
    # step 0 of the new run measures a's final weights on the same validation batches
    assert records(b)[0]["val_loss"] == pytest.approx(
        json.loads((a / "summary.json").read_text())["val_loss"]
    )
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["train"]["init_from"] == str((a / "checkpoints" / "step_0000008").resolve())
    assert cfg["train"]["steps"] == 4 and cfg["model"] == json.loads((a / "config.json").read_text())["model"]
    assert (
        main(["train", "--out", str(tmp_path / "c"), "--init-from", str(a), *sets("model.d_model=64")]) == 2
    )
    err = capsys.readouterr().err
    assert "model.d_model" in err and err.count("\n") == 1 and not (tmp_path / "c").exists()


def test_terminal_output(tmp_path, caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        Trainer(
            tiny("train.steps=4", "train.warmup_steps=6"), tmp_path / "run", callbacks=[Progress(stream)]
        ).fit()
    assert "train.steps=4 is shorter than train.warmup_steps=6" in caplog.text
    lines = stream.getvalue().splitlines()
    banner = "\n".join(lines[:5])
    for text in (
        "parameters",
        "without embeddings",
        "per parameter",
        "per non-embedding parameter",
        "corpus shakespeare",
        "tokenizer bytes (vocab 257)",
        "device: cpu",
        "fp32, 1 thread, 1 process" if torch.get_num_threads() == 1 else f"{torch.get_num_threads()} threads",
        str(tmp_path / "run"),
    ):
        assert text in banner, text
    vals = [x for x in lines if "| val " in x]
    assert [x.split(" |")[0] for x in vals] == ["step 0/4", "step 4/4"]  # only where measured
    assert all("loss" not in x for x in vals)
    stream = io.StringIO()
    cfg = Config.from_json_file(tmp_path / "run" / "config.json")
    Trainer(cfg, tmp_path / "run", resume=True, callbacks=[Progress(stream)]).fit()
    assert "resumed from step 4" in stream.getvalue()


def test_analyze_says_which_batches_its_loss_is_on(tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(tiny("train.steps=4"), run, callbacks=[]).fit()
    val = json.loads((run / "summary.json").read_text())["val_loss"]
    assert (
        main(
            [
                "analyze",
                str(run),
                "--set",
                "train.eval_batches=2",
                "--set",
                "train.batch_size=8",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "the validation windows training's val loss is measured on" in out
    assert float(out.split("loss ")[1].split()[0]) == pytest.approx(val, abs=1e-4)
    assert main(["analyze", str(run), "--set", "train.eval_batches=1", "--out", str(tmp_path / "y")]) == 0
    assert (
        "to measure on training's windows add --set train.eval_batches=2 --set train.batch_size=8 --set "
        "data.seq_len=32"
    ) in capsys.readouterr().out
