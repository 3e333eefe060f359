"""Sweeps for SLURM, what needs no cluster: the [slurm] table and flags, the job array's script, how a cell's end is
read from its files, the plan's job count, bad input; and the local runner's rule that a stopped cell is
interrupted whatever launcher ran it. The cluster itself: tests/study/test_slurm.py (marker slurm)."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smallinit.cli import main
from smallinit.errors import ExperimentError
from smallinit.study import Sweep
from smallinit.study.running.sbatch import SlurmOptions, array_spec, batch_script
from smallinit.study.running.slurm import refresh_states

ROOT = Path(__file__).parents[2]
TINY = """
[sweep]
name = "tiny"
[base]
model = {{preset = "cpu-1m", d_model = 16, n_layers = 1, n_heads = 2, n_kv_heads = 2, d_ff = 32, max_seq_len = 32}}
data = {{corpus = "{corpus}", tokenizer = "bytes", seq_len = 16, val_fraction = 0.1}}
train = {{steps = {steps}, batch_size = 4, eval_every = 0, eval_batches = 1, log_every = 5, checkpoint_every = 5}}
[grid]
"train.seed" = [0, 1]
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    return path


def tiny(tmp_path: Path, corpus: Path, steps: int = 20, slurm: str = "") -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(TINY.format(corpus=corpus, steps=steps) + slurm, encoding="utf-8")
    return path


def test_options_from_the_file_and_flags_and_the_script(tmp_path, corpus):
    path = tiny(
        tmp_path, corpus, slurm='[slurm]\npartition = "gpu"\ntime = "2:00:00"\nextra = ["--qos=high"]\n'
    )
    sweep = Sweep.load(path)
    assert sweep.slurm.partition == "gpu" and sweep.slurm.limit_s == 7200
    opts = sweep.slurm.merged({"account": "proj", "time": None, "gpus_per_node": 4, "extra": ["--exclusive"]})
    assert (opts.partition, opts.account, opts.time, opts.gpus) == ("gpu", "proj", "2:00:00", 4)
    assert opts.extra == ("--qos=high", "--exclusive")  # the flags' lines add to the file's
    cells = [
        (c.id, [f"--set={s}" for s in c.set_args()], ["--set=train.compile=false"]) for c in sweep.cells()
    ]
    script = batch_script(
        tmp_path / "out", cells, opts, python="/venv/bin/python", launcher=None, env={"A": "b c"}
    )
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for want in (
        "--requeue",
        "--signal=B:USR1@300",
        "--time=2:00:00",
        "--partition=gpu",
        "--account=proj",
        "--gpus-per-node=4",
        "--qos=high",
        "--exclusive",
        f"--output={(tmp_path / 'out').resolve()}/slurm/%A_%a.out",
    ):
        assert f"#SBATCH {want}" in sbatch
    assert not any("--array" in line for line in sbatch)  # given at each submission: only what is missing
    # task i runs cell i; its GPUs under one torchrun per node, meeting on the first node
    assert re.search(
        r"^    1\) cell=seed-1; args=\(.*--set=train.seed=1\); first=\(--set=train.compile=false\)",
        script,
        re.M,
    )
    assert (
        "srun --kill-on-bad-exit=1 /venv/bin/python -m torch.distributed.run --nnodes $SLURM_NNODES" in script
    )
    assert "--nproc-per-node 4" in script and "export A='b c'" in script
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    cpu = batch_script(
        tmp_path / "out", cells, SlurmOptions(), python="/venv/bin/python", launcher=None, env={}
    )
    assert "srun --kill-on-bad-exit=1 /venv/bin/python -m smallinit train" in cpu  # a CPU cell: one process


def test_array_spec():
    assert array_spec([7, 0, 1, 2, 5, 8], 3) == "0-2,5,7-8%3"
    assert array_spec([4], 0) == "4"


@pytest.mark.parametrize(
    "table, expect",
    [
        ("nodez = 2", "unknown key nodez"),
        ('time = "two hours"', "is not a SLURM time limit"),
        ('time = "5:00"\nsignal_s = 300', "must be longer than signal_s"),
        ("gpus_per_node = 1.5", "gpus_per_node must be a whole number"),
        ('extra = ["--array=0-99"]', "sets what smallinit sets itself"),
        ("extra = [\"--comment='x; rm -rf /'\"]", "is not one --option"),
        ('partition = "gpu; rm"', "is not a SLURM name"),
    ],
)
def test_bad_slurm_tables_are_one_line(tmp_path, corpus, capsys, table, expect):
    path = tiny(tmp_path, corpus, slurm=f"[slurm]\n{table}\n")
    with pytest.raises(ExperimentError, match=re.escape(expect)):
        Sweep.load(path)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--scheduler", "slurm"]) == 2
    err = capsys.readouterr().err
    assert expect in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_no_sbatch_on_path_is_one_line_and_writes_nothing(tmp_path, corpus, capsys, monkeypatch):
    path = tiny(tmp_path, corpus)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--scheduler", "slurm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smallinit: error: no sbatch on PATH") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _cell(run: Path, attempts: list[dict], log: str) -> None:
    run.mkdir(parents=True)
    (run / "slurm.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
    (run / "train.log").write_text(log)


def test_how_a_cell_that_left_the_queue_ended_is_read_from_its_files(tmp_path, corpus):
    """75 (a stop: checkpointed) is interrupted; another code is failed with smallinit's error line; no record
    (cancelled before the script could write one, or a node failure) is interrupted; squeue's own states win."""
    sweep = Sweep.from_dict({"base": {"model.preset": "cpu-1m"}, "grid": {"train.seed": [0, 1, 2, 3, 4, 5]}})
    cells, out = sweep.cells(), tmp_path / "out"
    _cell(
        out / "cells/seed-0",
        [{"job": "7_0", "start": 1, "end": 11, "rc": 75}],
        "stopped by SIGTERM at step 5\n",
    )
    _cell(
        out / "cells/seed-1",
        [{"job": "7_1", "start": 1, "end": 4, "rc": 75}, {"job": "7_1", "start": 5, "end": 9, "rc": 2}],
        "smallinit: error: data.corpus: no such file x\n",
    )
    _cell(out / "cells/seed-2", [{"job": "3_2", "start": 1, "end": 2, "rc": 1}], "an older job's failure\n")
    _cell(out / "cells/seed-3", [], "")
    _cell(out / "cells/seed-4", [], "")
    _cell(out / "cells/seed-5", [], "")
    (out / "cells/seed-5/summary.json").write_text("{}")
    states = {f"seed-{i}": {"status": "running", "job": f"7_{i}"} for i in range(6)}
    refresh_states(out, cells, states, {3: ("7_3", "PENDING"), 4: ("7_4", "RUNNING")})
    got = {cid: (s["status"], s.get("error")) for cid, s in states.items()}
    assert got["seed-0"] == ("interrupted", "stopped by SIGTERM at step 5")
    assert got["seed-1"] == ("failed", "data.corpus: no such file x")
    assert got["seed-2"][0] == "interrupted" and "left the queue without an exit code" in got["seed-2"][1]
    assert [got[f"seed-{i}"][0] for i in (3, 4, 5)] == ["queued", "running", "done"]
    assert states["seed-1"]["wall_s"] == 7.0  # both attempts


def test_plan_counts_the_jobs_of_the_example_cluster_sweep(capsys):
    """examples/slurm-sweep.toml, as docs/distributed.md shows it: one job per cell, the throttle, the requeues."""
    path = ROOT / "examples" / "slurm-sweep.toml"
    cells = Sweep.load(path).cells()
    assert main(["plan", str(path), "--scheduler", "slurm", "--time", "100:00:00"]) == 0
    text = capsys.readouterr().out
    assert f"slurm: {len(cells)} jobs in 1 job array(s), at most 4 at a time; each 1 node(s) × 8 GPUs" in text
    assert (
        "every job fits its time limit" in text
        and "plan: recipe slurm-sweep --scale sweep on 8 × H100" in text
    )
    assert main(["plan", str(path), "--scheduler", "slurm"]) == 0  # the file's 6-hour limit
    text = capsys.readouterr().out
    rows = re.findall(r"^  sweep +\S+ +(\d+) .* ([\d.]+) h$", text, re.M)  # runs and wall of each size
    longest = float(re.search(r"training per job: .* to ([\d.]+) h", text).group(1))
    assert longest == pytest.approx(max(float(h) / int(n) for n, h in rows), abs=0.1)  # one cell on one job
    assert "6 job(s) need more than the 5.9 h before the stop signal" in text and "in up to 2 parts" in text


def test_a_stopped_local_runner_records_interrupted_whatever_the_launcher(tmp_path, corpus):
    """A launcher that ends with its own code when stopped (as srun does, not 75) leaves the cell interrupted: it
    resumes on the next run instead of waiting for --retry-failed."""
    wrapper = tmp_path / "launch.sh"
    wrapper.write_text('trap \'kill -TERM "$pid"; wait "$pid"; exit 1\' TERM\n"$@" & pid=$!\nwait "$pid"\n')
    path = tiny(tmp_path, corpus, steps=100_000)
    out = tmp_path / "out"
    runner = subprocess.Popen(
        [sys.executable, "-m", "smallinit", "sweep", str(path), "--out", str(out), "--jobs", "1"]
        + ["--launcher", f"bash {wrapper} {sys.executable}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300  # a failsafe only: a loaded machine is slow
    while not list((out / "cells" / "seed-0" / "checkpoints").glob("step_*")):
        assert runner.poll() is None and time.monotonic() < deadline, "the sweep ended before it was stopped"
        time.sleep(0.05)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=120) == 75
    state = json.loads((out / "status.json").read_text())["cells"]["seed-0"]
    assert state["status"] == "interrupted" and state["returncode"] == 1
