"""Training: loss falls, checkpoints are atomic and verified, kill-and-resume is bit-exact, NaN stops."""

import contextlib
import json
import logging
import os
import signal
import subprocess

import pytest
import torch

from smallinit import Config, load_model
from smallinit.errors import CheckpointError, ConfigError, Preempted, TrainingError
from smallinit.train import Callback, Trainer, lr_at
from smallinit.train import checkpoint as ckpt
from support.runs import TINY_MODEL, final_tensors, snapshot
from support.training import TINY, resume, train_cmd, wait_for_step


def tiny(*extra: str) -> Config:
    return Config.load(overrides=[*TINY, *extra])


def test_loss_falls_and_run_folder(tmp_path):
    run = tmp_path / "run"
    summary = Trainer(tiny("train.steps=40", "train.eval_every=20", "train.lr=1e-2"), run, callbacks=[]).fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert records[0] == {"step": 0, "val_loss": vals[0]}
    assert vals[-1] < vals[0] - 1.0  # from ≈ ln(257) = 5.55 to well below
    assert summary["val_loss"] == vals[-1]
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(records[1])
    assert json.loads((run / "config.json").read_text())["model"]["vocab_size"] == 257
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_0000040"]
    model = load_model(run)
    assert not model.training and model.config.d_model == 32


def test_schedules():
    c = Config().train
    c.steps, c.warmup_steps, c.lr, c.min_lr_ratio = 100, 10, 1.0, 0.1
    assert lr_at(0, c) == pytest.approx(0.1) and lr_at(9, c) == pytest.approx(1.0)
    assert lr_at(10, c) == pytest.approx(1.0) and lr_at(100, c) == pytest.approx(0.1)
    assert lr_at(55, c) == pytest.approx(0.55)
    c.schedule, c.decay_frac = "wsd", 0.2
    assert lr_at(79, c) == pytest.approx(1.0) and lr_at(99, c) == pytest.approx(0.1)
    assert lr_at(89, c) == pytest.approx(0.55)


def test_grad_accum_matches_full_batch(tmp_path):
    a = Trainer(tiny("train.steps=3", "train.eval_every=0"), tmp_path / "a", callbacks=[])
    b = Trainer(
        tiny("train.steps=3", "train.eval_every=0", "train.grad_accum=4"), tmp_path / "b", callbacks=[]
    )
    a.fit(), b.fit()
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=n)


def test_resume_in_process_is_bit_exact(tmp_path):
    args = ("train.steps=20", "train.checkpoint_every=5", "train.eval_every=10", "train.keep_checkpoints=10")
    Trainer(tiny(*args), tmp_path / "full", callbacks=[]).fit()
    part = tmp_path / "part"

    class StopAt12(Callback):  # stop between checkpoints: steps 11-12 are lost and redone
        def on_step_end(self, trainer, record):
            if trainer.step == 12:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny(*args), part, callbacks=[StopAt12()]).fit()
    Trainer(tiny(*args), part, resume=True, callbacks=[]).fit()
    full, resumed = final_tensors(tmp_path / "full"), final_tensors(part)
    assert full.keys() == resumed.keys()
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    metrics = (part / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in metrics] == [
        json.loads(x)["step"] for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_signal_then_resume_is_bit_exact(tmp_path, sig):
    """SIGKILL loses the steps since the last checkpoint; SIGTERM checkpoints the current step, exits 75."""
    args = ("train.steps=60", "train.checkpoint_every=4", "train.eval_every=20", "train.log_every=1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(train_cmd(tmp_path / "full", *args), check=True, env=env, capture_output=True)
    run = tmp_path / "killed"
    proc = subprocess.Popen(train_cmd(run, *args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_step(run, 10)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    last = ckpt.latest_checkpoint(run).step
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL and 8 <= last < 60
    else:
        assert proc.returncode == 75 and b"--resume" in err
        assert (
            err.decode().strip().splitlines()[-1].startswith("smallinit: stopped by SIGTERM")
        )  # not "error:"
        logged = max(json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines())
        assert last == logged  # the step in flight was finished and saved
    resume(run, env)
    full, res = final_tensors(tmp_path / "full"), final_tensors(run)
    assert all(torch.equal(full[k], res[k]) for k in full)


def test_checkpoints_atomic_and_verified(tmp_path):
    run = tmp_path / "run"
    t = Trainer(tiny("train.steps=4", "train.eval_every=0", "train.keep_checkpoints=3"), run, callbacks=[])
    for _ in range(2):
        t.train_step()
        t.save()
    # a crash inside a write leaves only a temp folder, which is never taken for a checkpoint
    (run / "checkpoints" / ".step_0000003.tmp999").mkdir()
    assert ckpt.latest_checkpoint(run).step == 2
    # a truncated newest checkpoint is refused and the previous one is used
    newest = run / "checkpoints" / "step_0000002" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated"):
        ckpt.read_checkpoint(newest.parent)
    assert ckpt.latest_checkpoint(run).step == 1
    # same size, altered bytes → checksum mismatch
    f = run / "checkpoints" / "step_0000001" / "optim.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        ckpt.read_checkpoint(f.parent)
    assert ckpt.latest_checkpoint(run) is None
    with pytest.raises(CheckpointError):
        load_model(run)


def test_nonfinite_loss_stops_and_keeps_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    cfg = tiny(
        "train.steps=30",
        "train.eval_every=0",
        "train.checkpoint_every=2",
        "train.lr=1e30",
        "train.warmup_steps=0",
        "train.grad_clip=0",
    )
    t = Trainer(cfg, run, callbacks=[])
    with pytest.raises(TrainingError, match="non-finite") as e:
        t.fit()
    assert "last good checkpoint" in str(e.value) or "no checkpoint" in str(e.value)
    bad_step = t.step
    last = ckpt.latest_checkpoint(run)
    assert last is None or last.step < bad_step
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "nonfinite" and events[-1]["step"] == bad_step


def test_nonfinite_skip_counts(tmp_path):
    cfg = tiny(
        "train.steps=6",
        "train.eval_every=0",
        "train.lr=1e30",
        "train.warmup_steps=0",
        "train.grad_clip=0",
        "train.nonfinite=skip",
        "train.max_skips=100",
    )
    summary = Trainer(cfg, tmp_path / "run", callbacks=[]).fit()
    assert summary["skipped"] >= 1


def test_run_folder_is_never_overwritten(tmp_path):
    run = tmp_path / "run"
    Trainer(tiny("train.steps=2", "train.eval_every=0"), run, callbacks=[]).fit()
    before = snapshot(run)
    with pytest.raises(ConfigError, match="already holds a run"):
        Trainer(tiny("train.steps=2"), run, callbacks=[])
    with pytest.raises(ConfigError, match="--resume"):
        Trainer(tiny("train.steps=2", "train.lr=1"), run, resume=True, callbacks=[])
    assert before == snapshot(run)


def test_resume_before_the_first_checkpoint_says_so_and_keeps_the_earlier_log(tmp_path, caplog):
    """Killed before its first checkpoint: --resume starts over at step 0, says so, and keeps the old log."""

    class CrashAt3(Callback):
        def on_step_end(self, trainer, record):
            if trainer.step == 3:
                raise KeyboardInterrupt

    run, args = tmp_path / "run", ("train.steps=6", "train.checkpoint_every=0", "train.log_every=1")
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny(*args), run, callbacks=[CrashAt3()]).fit()
    earlier = (run / "metrics.jsonl").read_bytes()
    assert earlier and not ckpt.list_checkpoints(run)
    with caplog.at_level("WARNING", logger="smallinit"):
        Trainer(tiny(*args), run, resume=True, callbacks=[]).fit()
    assert f"{run} has no checkpoint yet, so training starts again from step 0" in caplog.text
    assert (run / "metrics.attempt-1.jsonl").read_bytes() == earlier
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()][:2] == [0, 1]


def test_a_stop_says_how_to_continue_the_command_that_started_it(tmp_path, monkeypatch):
    """A cell of a sweep, recipe or demo tells the user to run that command again, not `train --resume`."""

    class StopAt2(Callback):
        def on_step_end(self, trainer, record):
            if trainer.step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setenv("SMALLINIT_CONTINUE", "run the same smallinit command again")
    with pytest.raises(Preempted, match=r"at step 2, .*; to continue: run the same smallinit command again$"):
        Trainer(tiny("train.steps=6", "train.eval_every=0"), tmp_path / "run", callbacks=[StopAt2()]).fit()


def test_a_run_longer_than_its_corpus_says_so_once_at_the_start(tmp_path, caplog):
    corpus = tmp_path / "small.txt"
    corpus.write_text(
        "The quick brown fox jumps over the lazy dog. " * 60, encoding="utf-8"
    )  # ≈ 2,600 tokens
    sets = [
        *TINY_MODEL,
        f"data.corpus={json.dumps(str(corpus))}",
        "train.batch_size=8",
        "train.warmup_steps=1",
    ]
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        Trainer(Config.load(overrides=[*sets, "train.steps=8"]), tmp_path / "short")  # 2,048 tokens
    assert not [r for r in caplog.records if "repeats" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        Trainer(Config.load(overrides=[*sets, "train.steps=40"]), tmp_path / "long")  # 10,240 tokens
    (line,) = [r.getMessage() for r in caplog.records if "repeats" in r.getMessage()]
    assert "10,240 training tokens" in line and "epochs" in line and "data.corpus=large" in line


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("fused", [True, False])
def test_resumed_optimizer_state_is_placed_as_pytorch_places_it(device, fused):
    """AdamW state read from a checkpoint (CPU tensors) lands where ``Optimizer.load_state_dict`` puts it: the
    fused kernel reads ``step`` on the parameter's device. Parameters on "cuda" are fake tensors, which carry
    a device without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    saved = {
        "w.exp_avg": torch.randn(4, 3),
        "w.exp_avg_sq": torch.rand(4, 3),
        "w.step": torch.tensor(7.0),
        "b.exp_avg": torch.randn(3),
        "b.exp_avg_sq": torch.rand(3),
        "b.step": torch.tensor(7.0),
    }
    mode = FakeTensorMode(allow_non_fake_inputs=True) if device == "cuda" else contextlib.nullcontext()
    with mode:
        params = {
            n: torch.nn.Parameter(torch.zeros(s, device=device)) for n, s in (("w", (4, 3)), ("b", (3,)))
        }
        names = {id(p): n for n, p in params.items()}
        ours, reference = (torch.optim.AdamW(params.values(), fused=fused) for _ in range(2))
        ckpt.load_optimizer_tensors(ours, saved, names)
        reference.load_state_dict(
            {
                "state": {i: {k: saved[f"{n}.{k}"] for k in ckpt.ADAM_STATE} for i, n in enumerate(params)},
                "param_groups": reference.state_dict()["param_groups"],
            }
        )
        for n, p in params.items():
            got = {k: (t.device, t.dtype) for k, t in ours.state[p].items()}
            assert got == {k: (t.device, t.dtype) for k, t in reference.state[p].items()}, n
            assert got["step"][0] == (p.device if fused else torch.device("cpu"))
    if device == "cpu":
        assert all(torch.equal(ours.state[params["w"]][k], saved[f"w.{k}"]) for k in ckpt.ADAM_STATE)
