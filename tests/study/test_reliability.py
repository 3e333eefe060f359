"""Faults: SIGKILL at any moment (inside checkpoint writes too), torn or tampered checkpoints, failing writes.

What must hold: resume always finds the newest complete checkpoint and ends bit-identical to an
uninterrupted run; a damaged or foreign checkpoint is refused with one line and the run folder is left
byte-identical; a write that fails (disk full, read-only) stops with one line and keeps the last checkpoint.
"""

import builtins
import contextlib
import errno
import hashlib
import io
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from smallinit import Config, load_model
from smallinit.cli import main
from smallinit.errors import SmallinitError, StorageError
from smallinit.io import sha256_file
from smallinit.train import Callback, Trainer
from smallinit.train import checkpoint as ckpt
from support.runs import TINY_MODEL, snapshot, tensors_of

TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=8",
    "train.warmup_steps=2",
    "train.eval_batches=2",
]


def tiny(*extra: str) -> Config:
    return Config.load(overrides=[*TINY, *extra])


def assert_same_tensors(a: Path, b: Path) -> None:
    ta, tb = tensors_of(a), tensors_of(b)
    assert ta.keys() == tb.keys()
    assert all(torch.equal(ta[k], tb[k]) for k in ta), [k for k in ta if not torch.equal(ta[k], tb[k])]


def records(run: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock field, which differs between any two runs."""
    out = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in out]


def one_line(text: str) -> str:
    """The error line of a CLI run's stderr (progress lines may precede it)."""
    assert "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert last.startswith("smallinit: error: "), text
    return last


# -- SIGKILL at random moments ---------------------------------------------------------------------------

CRASH_ARGS = (
    *TINY,
    "train.steps=30",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=2",
    "train.eval_every=10",
    "train.log_every=1",
)


def _start(run: Path, resume: bool) -> subprocess.Popen:
    sets = [] if resume else [a for s in CRASH_ARGS for a in ("--set", s)]
    cmd = [
        sys.executable,
        "-m",
        "smallinit",
        "train",
        "--out",
        str(run),
        *sets,
        *(["--resume"] if resume else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # same threads: same floats
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _logged_step(run: Path) -> int:
    """The last step in metrics.jsonl (-1 if none); a line torn by the kill is ignored."""
    steps = [-1]
    with contextlib.suppress(FileNotFoundError):
        for line in (run / "metrics.jsonl").read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                steps.append(json.loads(line)["step"])
    return max(steps)


def _temp_folders(run: Path) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return [e.name for e in os.scandir(run / "checkpoints") if e.name.startswith(".")]
    return []


def _newest_complete(run: Path) -> int | None:
    """Independently of smallinit: the newest named checkpoint, asserted complete (sizes, sha256, loadable)."""
    named = sorted((p for p in (run / "checkpoints").glob("step_*")), key=lambda p: int(p.name[5:]))
    if not named:
        return None
    newest = named[-1]
    state = json.loads((newest / "state.json").read_text())
    for fname, meta in state["files"].items():
        data = (newest / fname).read_bytes()
        assert len(data) == meta["bytes"] and hashlib.sha256(data).hexdigest() == meta["sha256"], newest
        load_file(newest / fname)
    assert state["step"] == int(newest.name[5:])
    return state["step"]


def _kill(proc: subprocess.Popen, run: Path, mode: str, at_step: int, delay: float) -> bool | None:
    """SIGKILL ``proc`` per plan; None if it finished first, else whether it died inside a checkpoint write."""
    debris = set(_temp_folders(run))  # left by earlier kills, until the next save removes them
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if mode == "early" and (run / "metrics.jsonl").exists():
            break
        if mode != "early" and _logged_step(run) >= at_step:
            if mode == "in_write":  # wait for the next checkpoint's temporary folder to appear
                while proc.poll() is None and not set(_temp_folders(run)) - debris:
                    time.sleep(0.0005)
            break
        time.sleep(0.002)
    time.sleep(delay)
    if proc.poll() is not None:
        return None
    proc.kill()
    proc.wait(timeout=60)
    return bool(set(_temp_folders(run)) - debris)


def test_sigkill_at_random_moments_then_resume(tmp_path):
    """Six kills (seeded): before the first checkpoint, between steps, and inside checkpoint writes."""
    reference = _start(tmp_path / "reference", resume=False)
    run, rng = tmp_path / "killed", random.Random(1234)
    plan = [("early", 0, 0.0)] + [
        (rng.choice(["in_write", "step"]), rng.randint(1, 5), rng.uniform(0, 0.004)) for _ in range(5)
    ]
    plan[2] = ("in_write", plan[2][1], plan[2][2])  # at least two kills aimed inside a write
    plan[4] = ("in_write", plan[4][1], plan[4][2])
    proc, newest_before, outcomes = _start(run, resume=False), None, []
    for mode, ahead, delay in plan:
        landed = _kill(proc, run, mode, _logged_step(run) + ahead, delay)
        if landed is None:
            break
        outcomes.append((mode, landed))
        newest = _newest_complete(run) if (run / "checkpoints").is_dir() else None
        logged = _logged_step(run)
        # every checkpoint due before the last logged step was completed: at most one interval is redone
        due = (logged - 1) // 2 * 2
        assert (newest or 0) >= due and (newest or 0) >= (newest_before or 0), (newest, logged, newest_before)
        found = ckpt.newest_checkpoint(run)  # what resume will use: the newest complete one
        assert (found.step if found else None) == newest
        newest_before = newest
        proc = _start(run, resume=(run / "config.json").exists())
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    ref_out, ref_err = reference.communicate(timeout=120)
    assert reference.returncode == 0, ref_err.decode()

    assert len(outcomes) >= 5 and any(landed for mode, landed in outcomes if mode == "in_write"), outcomes
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_0000028", "step_0000030"]
    assert _temp_folders(run) == []  # debris of the killed writers was removed by later saves
    final = Path("checkpoints") / "step_0000030"
    assert_same_tensors(run / final, tmp_path / "reference" / final)
    assert records(run) == records(tmp_path / "reference")  # no record lost or repeated


# -- torn or tampered checkpoints ------------------------------------------------------------------------

TAMPER_ARGS = (
    "train.steps=4",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=3",
    "train.eval_every=0",
    "train.log_every=1",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished 4-step run (checkpoints at steps 2 and 4), and the same with another seed."""
    root = tmp_path_factory.mktemp("tamper")
    Trainer(tiny(*TAMPER_ARGS), root / "run", callbacks=[]).fit()
    Trainer(tiny(*TAMPER_ARGS, "train.seed=1"), root / "other", callbacks=[]).fit()
    return root


def _rewrite(ck: Path, fname: str, tensors: dict[str, torch.Tensor] | None = None, data: bytes | None = None):
    """Replace a tensor file and update state.json to match it, as a careless tool (or an attacker) would."""
    if tensors is not None:
        save_file(tensors, ck / fname)
    else:
        (ck / fname).write_bytes(data)
    state = json.loads((ck / "state.json").read_text())
    state["files"][fname] = {"bytes": (ck / fname).stat().st_size, "sha256": sha256_file(ck / fname)}
    (ck / "state.json").write_text(json.dumps(state))


def _edit_json(path: Path, edit) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def _drop_first(ck: Path, fname: str, suffix: str = "") -> None:
    t = load_file(ck / fname)
    victim = next(k for k in t if k.endswith(suffix))
    _rewrite(ck, fname, {k: v for k, v in t.items() if k != victim})


def _wrong_shape(ck: Path) -> None:
    t = load_file(ck / "model.safetensors")
    k = next(iter(t))
    t[k] = torch.zeros(t[k].shape[0] + 1, *t[k].shape[1:])
    _rewrite(ck, "model.safetensors", t)


def _wrong_dtype(ck: Path, fname: str, suffix: str = "") -> None:
    t = load_file(ck / fname)
    k = next(k for k in t if k.endswith(suffix))
    t[k] = t[k].to(torch.float64)  # every value survives the cast: only the dtype gives it away
    _rewrite(ck, fname, t)


def _truncate(ck: Path, fname: str, update_state: bool) -> None:
    data = (ck / fname).read_bytes()[: (ck / fname).stat().st_size // 2]
    if update_state:
        _rewrite(ck, fname, data=data)
    else:
        (ck / fname).write_bytes(data)


def _set_state(**fields):
    return lambda run, other, ck: _edit_json(ck / "state.json", lambda s: s.update(fields))


# name: (how (run, other run, newest checkpoint), expected words, whether load_model refuses too (it reads no
# optimizer state), whether the newest checkpoint fails verification (then the message names the older one))
TAMPERS = {
    "truncated model file": (
        lambda r, o, ck: _truncate(ck, "model.safetensors", False),
        "truncated",
        True,
        True,
    ),
    "truncated, state.json updated": (
        lambda r, o, ck: _truncate(ck, "model.safetensors", True),
        "not a readable safetensors",
        True,
        False,
    ),
    "truncated optimizer file": (
        lambda r, o, ck: _truncate(ck, "optim.safetensors", False),
        "truncated",
        True,
        True,
    ),
    "missing tensor": (lambda r, o, ck: _drop_first(ck, "model.safetensors"), "missing", True, False),
    "missing optimizer tensor": (
        lambda r, o, ck: _drop_first(ck, "optim.safetensors", "exp_avg_sq"),
        "exp_avg_sq is missing",
        False,
        False,
    ),
    "wrong shape": (lambda r, o, ck: _wrong_shape(ck), "shape", True, False),
    "wrong dtype": (lambda r, o, ck: _wrong_dtype(ck, "model.safetensors"), "is float64", True, False),
    "wrong optimizer dtype": (
        lambda r, o, ck: _wrong_dtype(ck, "optim.safetensors", "exp_avg"),
        "is float64",
        False,
        False,
    ),
    "optimizer step not a count": (
        lambda r, o, ck: _wrong_dtype(ck, "optim.safetensors", ".step"),
        "step is float64",
        False,
        False,
    ),
    "state.json config differs": (
        lambda r, o, ck: _edit_json(ck / "state.json", lambda s: s["config"]["model"].update(norm_eps=1e-5)),
        "different config",
        True,
        False,
    ),
    "run config.json differs": (
        lambda r, o, ck: _edit_json(r / "config.json", lambda c: c["model"].update(gamma=0.5)),
        "different config",
        True,
        False,
    ),
    "state.json of another run": (
        lambda r, o, ck: shutil.copy(o / "checkpoints" / ck.name / "state.json", ck),
        "checksum",
        True,
        True,
    ),
    "state.json of another step": (
        lambda r, o, ck: shutil.copy(ck.parent / "step_0000002" / "state.json", ck),
        "records step 2",
        True,
        True,
    ),
    "state.json not JSON": (
        lambda r, o, ck: (ck / "state.json").write_text('{"step": 4,'),
        "not valid JSON",
        True,
        True,
    ),
    "state.json step is text": (_set_state(step="4"), "not a step number", True, True),
    "state.json aliases garbage": (_set_state(aliases=[1]), "aliases", True, True),
    "state.json skipped negative": (_set_state(skipped=-3), "not a count", True, True),
    "state.json missing": (lambda r, o, ck: (ck / "state.json").unlink(), "no state.json", True, True),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_tampered_checkpoint_is_refused_and_folder_untouched(name, runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    how, words, load_refuses, names_fallback = TAMPERS[name]
    how(run, runs / "other", run / "checkpoints" / "step_0000004")
    before = snapshot(run)

    assert main(["train", "--out", str(run), "--resume"]) == 2
    err = one_line(capsys.readouterr().err)
    assert words in err, err
    if names_fallback:  # the newest checkpoint is damaged: refused, not skipped, and the way back is named
        assert "step_0000004" in err and "step_0000002, the newest intact one" in err, err
    if load_refuses:
        with pytest.raises(SmallinitError) as e:
            load_model(run)
        assert "\n" not in str(e.value) and words in str(e.value), str(e.value)
    else:
        load_model(run)  # the model file is intact; only resuming needs the optimizer state
    assert snapshot(run) == before


def test_damaged_newest_moved_aside_resumes_from_older_bit_exact(runs, tmp_path):
    """The documented way out of a refusal: move the damaged checkpoint away; nothing else is lost."""
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    _truncate(run / "checkpoints" / "step_0000004", "optim.safetensors", False)
    with pytest.raises(SmallinitError, match="move step_0000004 out of"):
        Trainer(Config.from_json_file(run / "config.json"), run, resume=True, callbacks=[])
    (run / "checkpoints" / "step_0000004").rename(tmp_path / "damaged-step_0000004")
    Trainer(Config.from_json_file(run / "config.json"), run, resume=True, callbacks=[]).fit()
    assert_same_tensors(run / "checkpoints" / "step_0000004", runs / "run" / "checkpoints" / "step_0000004")
    assert records(run) == records(runs / "run")


def test_damaged_older_checkpoint_does_not_block(runs, tmp_path):
    """A kill while pruning can leave an older checkpoint half-deleted; the newest one is what counts."""
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    (run / "checkpoints" / "step_0000002" / "optim.safetensors").unlink()
    assert ckpt.newest_checkpoint(run).step == 4
    assert main(["train", "--out", str(run), "--resume"]) == 0
    load_model(run)


# -- failing writes: disk full, read-only folders --------------------------------------------------------

FAULT_ARGS = (
    "train.steps=6",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=3",
    "train.eval_every=3",
    "train.log_every=1",
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run = tmp_path_factory.mktemp("fault-reference") / "run"
    Trainer(tiny(*FAULT_ARGS), run, callbacks=[]).fit()
    return run


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """A real write failure (EFBIG) for any file this process grows past ``nbytes``, Rust writers included."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@contextlib.contextmanager
def failing_writes(root: Path, code: int, name: str | None = None):
    """Opening for writing (and mkdir) below ``root`` fails with ``code``; only files called ``name`` if given."""
    real_open, real_mkdir = builtins.open, os.mkdir

    def hit(path) -> bool:
        p = Path(os.fsdecode(path)).absolute()
        return (p == root or root in p.parents) and (
            name is None or p.name == name or f".{name}.tmp" in p.name
        )

    def fake_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+") and hit(file):
            raise OSError(code, os.strerror(code), os.fsdecode(file))
        return real_open(file, mode, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if hit(path) and name is None:
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real_mkdir(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builtins, "open", fake_open)
        mp.setattr(io, "open", fake_open)
        mp.setattr(os, "mkdir", fake_mkdir)
        yield


class FaultFrom(Callback):
    """Enters a fault once step ``step`` is done (after the checkpoint of step 2 was written)."""

    def __init__(self, step: int, fault):
        self.step, self.fault, self.stack = step, fault, contextlib.ExitStack()

    def on_step_end(self, trainer, record):
        if trainer.step == self.step:
            self.stack.enter_context(self.fault(trainer.run_dir))


FAULTS = {  # name: (fault factory, when, expected words)
    "tensor file over the size limit (real EFBIG)": (
        lambda run: file_size_limit(64 << 10),
        3,
        "File too large",
    ),
    "disk full on metrics.jsonl": (
        lambda run: failing_writes(run, errno.ENOSPC, "metrics.jsonl"),
        3,
        "metrics.jsonl (No space left on device)",
    ),
    "disk full on state.json": (
        lambda run: failing_writes(run, errno.ENOSPC, "state.json"),
        3,
        "state.json (No space left on device)",
    ),
    "run folder turns read-only": (lambda run: failing_writes(run, errno.EROFS), 3, "Read-only file system"),
    "disk full on summary.json": (
        lambda run: failing_writes(run, errno.ENOSPC, "summary.json"),
        5,
        "summary.json (No space left on device)",
    ),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_failing_write_keeps_last_checkpoint_and_resumes(name, reference, tmp_path):
    fault, when, words = FAULTS[name]
    run = tmp_path / "run"
    cb = FaultFrom(when, fault)
    trainer = Trainer(tiny(*FAULT_ARGS), run, callbacks=[cb])
    with cb.stack, pytest.raises(StorageError) as e:
        trainer.fit()
    msg = str(e.value)
    assert "\n" not in msg and words in msg and "free disk space" in msg, msg
    last = ckpt.newest_checkpoint(run)  # the newest checkpoint verifies and is the last one written
    assert last is not None and f"{last.path} is intact" in msg, msg
    assert _temp_folders(run) == []
    saved = snapshot(last.path)
    assert_same_tensors(last.path, reference / "checkpoints" / last.path.name)
    # once there is space again, resume loses nothing
    Trainer(Config.from_json_file(run / "config.json"), run, resume=True, callbacks=[]).fit()
    assert snapshot(last.path) == saved
    assert_same_tensors(run / "checkpoints" / "step_0000006", reference / "checkpoints" / "step_0000006")
    assert records(run) == records(reference)


def test_cli_unwritable_out_is_one_line_and_writes_nothing(tmp_path, capsys):
    sets = [a for s in (*TINY, "train.steps=2") for a in ("--set", s)]
    with failing_writes(tmp_path, errno.EROFS):
        assert main(["train", "--out", str(tmp_path / "run"), *sets]) == 2
    assert "Read-only file system" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
    (tmp_path / "empty").mkdir()
    with failing_writes(tmp_path / "empty", errno.ENOSPC):
        assert main(["train", "--out", str(tmp_path / "empty"), *sets]) == 2
    assert "config.json (No space left on device)" in one_line(capsys.readouterr().err)
    assert list((tmp_path / "empty").iterdir()) == []
    (tmp_path / "file").write_text("x")
    assert main(["train", "--out", str(tmp_path / "file"), *sets]) == 2
    assert "is a file" in one_line(capsys.readouterr().err)
    assert main(["train", "--out", str(tmp_path / "file" / "run"), *sets]) == 2
    assert "Not a directory" in one_line(capsys.readouterr().err)
    assert (tmp_path / "file").read_text() == "x"


def test_cli_tokenizer_and_cache_unwritable(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text to tokenise " * 50)
    with failing_writes(tmp_path / "ro", errno.EROFS):
        assert (
            main(
                [
                    "tokenizer",
                    "train",
                    str(corpus),
                    "--vocab-size",
                    "300",
                    "--out",
                    str(tmp_path / "ro" / "tok"),
                ]
            )
            == 2
        )
    assert "Read-only file system" in one_line(capsys.readouterr().err)
    monkeypatch.setenv("SMALLINIT_CACHE", str(corpus))  # the cache "folder" is a file
    sets = [a for s in (*TINY, f"data.corpus={corpus}") for a in ("--set", s)]
    assert main(["train", "--out", str(tmp_path / "run"), *sets]) == 2
    assert "SMALLINIT_CACHE" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_report_and_export_cut_short_mid_write_leave_no_partial_files(reference, tmp_path, capsys):
    """A real EFBIG after some bytes are written: one line each, no temporary file or folder left behind."""
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = snapshot(run)
    with file_size_limit(16 << 10):  # the report (base64 figures) and the exported weights are larger
        assert main(["report", str(run)]) == 2
        assert "File too large" in one_line(capsys.readouterr().err)
        assert main(["export-hf", str(run), "--out", str(tmp_path / "hf")]) == 2
        assert "File too large" in one_line(capsys.readouterr().err)
    assert snapshot(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_cli_report_on_full_disk_is_one_line_and_changes_nothing(reference, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = snapshot(run)
    with failing_writes(run, errno.ENOSPC):
        assert main(["report", str(run)]) == 2
    assert "No space left on device" in one_line(capsys.readouterr().err)
    assert snapshot(run) == before
    assert main(["report", str(run)]) == 0  # with space again it works
