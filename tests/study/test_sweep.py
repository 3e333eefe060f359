"""Sweeps: cells from a grid, one process per cell, failures contained, kill-and-rerun, packing, bad files."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smallinit.cli import main
from smallinit.config import parse_override
from smallinit.errors import ExperimentError
from smallinit.study import Sweep, format_table, run_sweep, sweep_rows

BASE = """
[sweep]
name = "tiny"
[base]
model = {{preset = "cpu-1m", d_model = 16, n_layers = 1, n_heads = 2, n_kv_heads = 2, d_ff = 32, max_seq_len = 32}}
data = {{corpus = "{corpus}", tokenizer = "bytes", seq_len = 16, val_fraction = 0.1}}
train = {{steps = {steps}, batch_size = 4, warmup_steps = 2, eval_every = 0, eval_batches = 1, log_every = 5, checkpoint_every = 10}}
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    return path


def sweep_file(tmp_path: Path, corpus: Path, grid: str, steps: int = 20) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(BASE.format(corpus=corpus, steps=steps) + grid, encoding="utf-8")
    return path


def losses(run: Path) -> list[tuple]:
    """The numbers a run computed (not its timings), for bit-for-bit comparison."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("grad_norm")) for r in records]


def test_cells_ids_and_overrides():
    sweep = Sweep.from_dict(
        {
            "base": {"model": {"preset": "cpu-1m", "gamma": 0.5}, "train.steps": 10},
            "grid": {"model.gamma": [0.5, 1.0], "train": {"seed": [0, 1]}},
            "arms": {
                "base": {"model.norm_eps": 1e-5},
                "fixed": {"model": {"norm_eps": 1e-12, "gate": "elementwise"}},
            },
        }
    )
    cells = sweep.cells()
    assert [c.id for c in cells[:4]] == [
        "base_gamma-0.5_seed-0",
        "base_gamma-0.5_seed-1",
        "base_gamma-1.0_seed-0",
        "base_gamma-1.0_seed-1",
    ]
    assert len(cells) == 8 and len({c.id for c in cells}) == 8
    last = cells[-1]
    assert last.arm == "fixed" and last.values == {"model.gamma": 1.0, "train.seed": 1}
    # grid beats arm beats base; every --set literal reads back as the same value
    assert last.overrides == {
        "model.preset": "cpu-1m",
        "model.gamma": 1.0,
        "train.steps": 10,
        "model.norm_eps": 1e-12,
        "model.gate": "elementwise",
        "train.seed": 1,
    }
    assert dict(parse_override(item) for item in last.set_args()) == last.overrides


def test_same_folder_name_is_refused():
    with pytest.raises(ExperimentError, match="same folder name"):
        Sweep.from_dict({"grid": {"data.corpus": ["a/b", "ab"]}})


@pytest.mark.parametrize(
    "text, expect",
    [
        (None, "not found"),
        ("[grid\n", "not valid TOML"),
        ('[grid]\n"model.gamma" = 0.5\n', "non-empty list"),
        ('[grid]\n"model.gamma" = []\n', "non-empty list"),
        ('[grids]\n"model.gamma" = [1]\n', "unknown section [grids]"),
        (
            "[model]\ngamma = 1.0\n[train]\nsteps = 5\n",
            "is a training config ([model], [train]), not a sweep",
        ),
        ('[sweep]\nnmae = "x"\n', "unknown key sweep.nmae"),
        ('[grid]\n"model.gamam" = [1.0]\n', "unknown config key model.gamam"),
        ('[grid]\n"model.gamma" = [1.0, -1.0]\n', "model.gamma must be > 0"),
        ('[base]\n"model.preset" = "huge"\n', "unknown preset"),
        ('[sweep]\nlauncher = "sh -c id"\n', "not program 'sh'"),
        ('[sweep]\nlauncher = "torchrun --no-python"\n', "not option '--no-python'"),
        ('[sweep]\nlauncher = "torchrun --nproc_per_node=$(id)"\n', "not option '--nproc_per_node=$(id)'"),
        ('[sweep]\nlauncher = "torchrun \'--standalone"\n', "not a command line"),
    ],
)
def test_bad_sweep_files_exit_2_with_one_line(tmp_path, capsys, text, expect):
    path = tmp_path / "bad.toml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["sweep", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("smallinit: error:") and expect in err, err
    assert not out.exists()  # nothing written for a sweep that cannot start


def test_a_file_cannot_choose_the_program_but_the_command_line_can(tmp_path, corpus, capsys):
    marker = tmp_path / "ran"
    text = sweep_file(tmp_path, corpus, '[grid]\n"model.gamma" = [1.0]\n').read_text()
    hostile = tmp_path / "hostile.toml"
    hostile.write_text(text.replace('name = "tiny"', f'name = "tiny"\nlauncher = "touch {marker}"'))
    assert main(["sweep", str(hostile), "--out", str(tmp_path / "refused")]) == 2
    assert (
        "only torchrun" in capsys.readouterr().err
        and not marker.exists()
        and not (tmp_path / "refused").exists()
    )
    assert Sweep.from_dict(
        {"sweep": {"launcher": "torchrun --standalone --nproc_per_node=gpu --nnodes=1"}}
    ).launcher

    # the person at the command line may pick any launcher; each cell's train.log names it
    launcher = f"env SMALLINIT_SITE=1 {sys.executable}"
    out = run_sweep(tmp_path / "sweep.toml", tmp_path / "launched", jobs=1, launcher=launcher)
    assert [r["status"] for r in out.rows] == ["done"]
    log = (tmp_path / "launched" / out.rows[0]["dir"] / "train.log").read_text()
    assert f"SMALLINIT_SITE=1 {sys.executable} -m smallinit train" in log.splitlines()[0]
    assert json.loads((tmp_path / "launched" / "sweep.json").read_text())["launcher"] == launcher


def test_bad_jobs_and_status_of_a_non_sweep(tmp_path, capsys, corpus):
    path = sweep_file(tmp_path, corpus, '[grid]\n"model.gamma" = [1.0]\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--jobs", "0"]) == 2
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "--jobs 0" in err[0] and "not a sweep folder" in err[1]


def test_failed_cell_is_contained_and_packing_is_bit_identical(tmp_path, corpus):
    """lr = 1e30 diverges: that cell fails with its error line, the other finishes; 2 jobs == 1 job."""
    path = sweep_file(tmp_path, corpus, '[grid]\n"train.lr" = [3e-3, 1e30]\n')
    packed = run_sweep(path, tmp_path / "packed", jobs=2)
    assert packed.exit_code == 1
    good, bad = packed.rows
    assert (good["status"], bad["status"]) == ("done", "failed")
    assert "non-finite" in bad["error"] and "\n" not in bad["error"]
    assert good["step"] == 20 and isinstance(good["val_loss"], float) and bad["val_loss"] is None
    status = json.loads((tmp_path / "packed" / "status.json").read_text())
    assert status["jobs"] == 2 and status["cells"][bad["cell"]]["status"] == "failed"
    csv_lines = (tmp_path / "packed" / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and csv_lines[0].startswith("cell,status,train.lr,val_loss")

    sequential = run_sweep(path, tmp_path / "sequential", jobs=1)
    assert [r["status"] for r in sequential.rows] == ["done", "failed"]
    assert losses(tmp_path / "packed" / good["dir"]) == losses(tmp_path / "sequential" / good["dir"])

    # a re-run leaves both alone: the done cell is finished, the failed one waits for --retry-failed
    again = run_sweep(path, tmp_path / "packed", jobs=2)
    assert [r["status"] for r in again.rows] == ["done", "failed"]
    assert (
        json.loads((tmp_path / "packed" / "status.json").read_text())["cells"][good["cell"]]["attempts"] == 1
    )

    # the same folder with a changed sweep file is refused, and nothing in it changes
    before = _mtimes(tmp_path / "packed")
    changed = sweep_file(tmp_path, corpus, '[grid]\n"train.lr" = [3e-3, 1e30]\n', steps=21)
    with pytest.raises(ExperimentError, match="other settings"):
        run_sweep(changed, tmp_path / "packed", jobs=2)
    assert _mtimes(tmp_path / "packed") == before


def _mtimes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_kill_mid_cell_then_rerun_finishes_without_redoing(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # cells inherit it: tiny models run faster on one thread
    path = sweep_file(tmp_path, corpus, '[grid]\n"train.seed" = [0, 1]\n', steps=60)
    out = tmp_path / "out"
    runner = subprocess.Popen(
        [sys.executable, "-m", "smallinit", "sweep", str(path), "--out", str(out), "--jobs", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    second = out / "cells" / "seed-1"
    deadline = time.monotonic() + 600  # a failsafe only: a loaded machine is slow
    try:
        while not list((second / "checkpoints").glob("step_*")):  # the second cell is mid-run
            assert runner.poll() is None and time.monotonic() < deadline, (
                "the sweep ended before it could be killed"
            )
            time.sleep(0.05)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    status = json.loads((out / "status.json").read_text())["cells"]
    assert [status[c]["status"] for c in ("seed-0", "seed-1")] == ["done", "running"]
    first = _mtimes(out / "cells" / "seed-0")

    assert main(["status", str(out)]) == 0
    table = capsys.readouterr().out
    assert "seed-1" in table and "running" in table and "1 done, 1 running" in table

    outcome = run_sweep(path, out, jobs=1)
    assert outcome.exit_code == 0 and [r["status"] for r in outcome.rows] == ["done"] * 2
    assert [r["step"] for r in outcome.rows] == [60] * 2
    assert _mtimes(out / "cells" / "seed-0") == first  # the finished cell was not touched
    status = json.loads((out / "status.json").read_text())["cells"]
    assert [status[c]["attempts"] for c in ("seed-0", "seed-1")] == [1, 2]
    log = (second / "train.log").read_text()
    assert "=== attempt 2 (resume)" in log
    steps = [r[0] for r in losses(second) if r[1] is not None]
    assert steps == sorted(set(steps)) and steps[-1] == 60  # one uninterrupted-looking log
    rows = sweep_rows(out)
    assert [r["cell"] for r in rows] == ["seed-0", "seed-1"] and all(r["params"] > 0 for r in rows)
    assert not any(_process_alive(status[c].get("pid")) for c in status)


def _process_alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_example_sweep_runs_into_a_folder_named_after_it(tmp_path, monkeypatch, capsys):
    """examples/gamma-eps.toml, its model and budget shrunk to seconds, as a user runs it: into runs/gamma-eps."""
    text = (Path(__file__).parents[2] / "examples" / "gamma-eps.toml").read_text(encoding="utf-8")
    tiny = {
        '"model.preset" = "cpu-1m"': '"model.preset" = "cpu-1m"\n"model.d_model" = 16\n"model.n_layers" = 1\n'
        '"model.n_heads" = 2\n"model.n_kv_heads" = 2\n"model.d_ff" = 32\n'
        '"data.tokenizer" = "bytes"\n"data.seq_len" = 16\n"train.batch_size" = 4\n'
        '"train.warmup_steps" = 1\n"train.eval_batches" = 1',
        '"train.steps" = 300': '"train.steps" = 3',
        '"train.eval_every" = 50': '"train.eval_every" = 0',
        '"train.seed" = [0, 1]': '"train.seed" = [0]',
        '"model.gamma" = [0.5, 1.0]': '"model.gamma" = [1.0]',
    }
    for old, new in tiny.items():
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "tiny-copy.toml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "tiny-copy.toml", "--jobs", "2"]) == 0
    rows = sweep_rows(tmp_path / "runs" / "gamma-eps")  # the sweep's name, not the file's
    assert len(rows) == 2 and all(r["status"] == "done" and r["step"] == 3 for r in rows)
    assert "results: runs/gamma-eps/results.csv" in capsys.readouterr().out


def test_the_status_table_keeps_the_file_name_of_a_long_error():
    """A failed cell's error line is cut for the table, but never so that the missing file's name is lost."""
    deep = "/tmp/" + "/".join(f"level-{i}-of-a-deep-folder" for i in range(6)) + "/missing.txt"
    error = (
        f"corpus '{deep}' not found: not a builtin (tiny, fineweb) and no such file or folder; check the path"
    )
    line = format_table([{"cell": "gamma-0.5_seed-0", "status": "failed", "error": error}]).splitlines()[1]
    assert "…/level-5-of-a-deep-folder/missing.txt'" in line and len(line.split("  ")[-1].strip()) <= 100
    assert line.endswith("…")
