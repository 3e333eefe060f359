"""A run folder has one writer: a second `smallinit train` into a folder another process is training is
refused with one line and exit 2, and leaves the first run's files byte for byte as they were."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smallinit.cli import main
from support.runs import TINY_MODEL, snapshot

TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=4",
    "train.eval_batches=1",
    "train.log_every=1",
    "train.eval_every=0",
    "train.warmup_steps=2",
]


def _sets(*extra: str) -> list[str]:
    return [w for kv in (*TINY, *extra) for w in ("--set", kv)]


def _start(run: Path, *extra: str) -> subprocess.Popen:
    """A training process that runs until stopped (one optimizer step per logged line)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "smallinit", "train", "--out", str(run), *_sets("train.steps=100000", *extra)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(proc: subprocess.Popen, ready, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the first run exited early: {proc.stderr.read()}")
        assert time.monotonic() < deadline, "the first run did not start"
        time.sleep(0.2)


def _steps_logged(run: Path) -> int:
    try:
        return (run / "metrics.jsonl").read_text().count("\n")
    except OSError:
        return 0


class _StillRunning(Exception):
    pass


@contextlib.contextmanager
def _at_most(seconds: int):
    """A refused writer returns at once; one that trains instead is stopped here rather than run forever."""

    def stop(*_):
        raise _StillRunning(f"the second writer was still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _refused_and_unchanged(run: Path, other: Path, capsys) -> None:
    before = snapshot(run)
    capsys.readouterr()
    attempts = {  # the --resume race first, then an extension, --init-from and a fresh run into the folder
        "resume": ["train", "--out", str(run), "--resume"],
        "extend": ["train", "--out", str(run), "--resume", "--set", "train.steps=200000"],
        "init-from": ["train", "--out", str(run), "--init-from", str(other)],
        "fresh": ["train", "--out", str(run), *_sets("train.steps=2")],
    }
    for name, argv in attempts.items():
        with _at_most(30):
            code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, (name, err)
        assert "being written by another training process" in err, (name, err)
        assert snapshot(run) == before, name  # metrics.jsonl, config.json, checkpoints: byte for byte


def test_a_second_writer_is_refused_and_changes_nothing(tmp_path, capsys):
    """Before any checkpoint and after one (the first run paused with SIGSTOP, so its files hold still). Each state
    is its own run, one that never checkpoints and one that does every 2 steps: a single run's window between its
    second step and its first checkpoint can pass between two polls of a fast machine."""
    other = tmp_path / "other"
    assert main(["train", "--out", str(other), *_sets("train.steps=2")]) == 0
    for every, checkpointed in ((0, False), (2, True)):
        run = tmp_path / f"run-{every}"
        proc = _start(run, f"train.checkpoint_every={every}")
        try:
            _wait_for(
                proc,
                lambda r=run, c=checkpointed: _steps_logged(r) >= 2 and (r / "checkpoints").is_dir() == c,
            )
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                assert (run / "checkpoints").is_dir() == checkpointed
                _refused_and_unchanged(run, other, capsys)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.5)
            assert proc.poll() is None  # the first run trains on
        finally:
            proc.kill()
            proc.wait()


def test_two_fresh_runs_into_one_folder_one_is_refused(tmp_path):
    """`for k in x y; do smallinit train --out same & done`: exactly one of them trains, alone."""
    run = tmp_path / "same"
    procs = [_start(run, "train.checkpoint_every=0") for _ in range(2)]
    try:
        deadline = time.monotonic() + 300  # a failsafe only: a loaded machine is slow
        while all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "both processes are training into the same folder"
            time.sleep(0.2)
        refused = next(p for p in procs if p.poll() is not None)
        err = refused.stderr.read()
        assert refused.returncode == 2 and err.count("\n") == 1, err
        assert "being written by another training process" in err or "already holds a run" in err, err
        survivor = next(p for p in procs if p is not refused)
        _wait_for(survivor, lambda: _steps_logged(run) >= 3)
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert steps == sorted(set(steps))  # one writer: every step once, in order
    finally:
        for p in procs:
            p.kill()
            p.wait()
