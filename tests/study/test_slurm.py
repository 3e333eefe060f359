"""A sweep on a real SLURM cluster: slurmctld, slurmd and munge from Debian, one node on localhost
(scripts/slurm-localhost.sh, started and stopped here). Marker ``slurm``: .ci/run installs them and runs these.

One sweep of 4 tiny CPU cells as one job array, 2 at a time, through everything a cluster does to it: the
submitting process killed before it could record its jobs, an ``scontrol requeue`` mid-run, an ``scancel``, the
time limit's signal; then continued by a second ``sweep`` call, and compared with the same cells run here."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smallinit.cli import main
from smallinit.io import lock_exclusive

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).parents[2]
SWEEP = """
[sweep]
name = "array"
[base]
model = {{preset = "cpu-1m", d_model = 16, n_layers = 1, n_heads = 2, n_kv_heads = 2, d_ff = 32, max_seq_len = 32}}
data = {{corpus = "{corpus}", tokenizer = "bytes", seq_len = 16, val_fraction = 0.1}}
train = {{steps = 2000, batch_size = 4, eval_every = 500, eval_batches = 1, log_every = 50, checkpoint_every = 50}}
[grid]
"model.gamma" = [0.5, 1.0]
"train.seed" = [0, 1]
[slurm]
time = "10:00"
signal_s = 30
max_running = 2
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    where = tmp_path_factory.mktemp("slurm")
    script = str(ROOT / "scripts" / "slurm-localhost.sh")
    subprocess.run([script, "start", str(where)], check=True, capture_output=True, text=True)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", str(where / "slurm.conf"))
            mp.setenv(
                "OMP_NUM_THREADS", "1"
            )  # the same in the jobs (sbatch passes it on) and in the local run
            yield where
    finally:
        subprocess.run(
            ["scancel", "--full", "--user", "root"],
            env={**os.environ, "SLURM_CONF": str(where / "slurm.conf")},
        )
        subprocess.run([script, "stop", str(where)], check=True)


def squeue() -> dict[str, str]:
    """Every array task on the (private) cluster: job id → state."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i|%T"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("|") for line in out.split())


def wait_for(what: str, cond, timeout: float = 600.0, every: float = 0.1):
    deadline = time.monotonic() + timeout  # a failsafe only: a loaded machine is slow
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
    return got


def checkpointed(run: Path) -> bool:
    return bool(list((run / "checkpoints").glob("step_*")))


def losses(run: Path) -> list[tuple]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("grad_norm")) for r in records if "step" in r]


def table(capsys, folder: Path) -> dict[str, str]:
    assert main(["status", str(folder)]) == 0
    return dict(re.findall(r"^(gamma-\S+)\s+(\w+)", capsys.readouterr().out, re.M))


def test_a_sweep_as_a_job_array_survives_requeue_cancel_time_limit_and_a_killed_submitter(
    cluster, tmp_path, capsys
):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))
    )
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(corpus=corpus))
    out = tmp_path / "out"
    cells = ["gamma-0.5_seed-0", "gamma-0.5_seed-1", "gamma-1.0_seed-0", "gamma-1.0_seed-1"]
    run = {c: out / "cells" / c for c in cells}

    # 1. The submitter dies after sbatch, before it could record the jobs (its sbatch hangs after submitting).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = subprocess.run(["which", "sbatch"], capture_output=True, text=True, check=True).stdout.strip()
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\n{real} "$@"\nsleep 600\n')
    (bin_dir / "sbatch").chmod(0o755)
    submitter = subprocess.Popen(
        [sys.executable, "-m", "smallinit", "sweep", str(path), "--out", str(out), "--scheduler", "slurm"],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    jobs = wait_for("the array in squeue", lambda: len(squeue()) == 4 and squeue())
    os.killpg(submitter.pid, signal.SIGKILL)
    submitter.wait()
    array = next(iter(jobs)).split("_")[0]
    assert sorted(jobs) == [f"{array}_{i}" for i in range(4)]
    assert not any(s.get("job") for s in json.loads((out / "status.json").read_text())["cells"].values())
    states = table(capsys, out)  # squeue finds the folder's jobs by their name
    assert list(states) == cells and set(states.values()) <= {"queued", "running"}

    # 2. Submitted from two places: a local run, or a second submission while the first holds the folder.
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "queued or running on SLURM" in err and len(err.splitlines()) == 1
    fd = lock_exclusive(out / ".lock")
    assert main(["sweep", str(path), "--out", str(out), "--scheduler", "slurm"]) == 2
    os.close(fd)
    err = capsys.readouterr().err.strip()
    assert "is being run by another process" in err and len(err.splitlines()) == 1
    assert main(["sweep", str(path), "--out", str(out), "--scheduler", "slurm"]) == 0
    assert "0 submitted now" in capsys.readouterr().err  # the unrecorded jobs were found, not submitted again
    assert len(squeue()) == 4
    recorded = json.loads((out / "status.json").read_text())["cells"]
    assert [recorded[c]["job"] for c in cells] == [f"{array}_{i}" for i in range(4)]

    # 3. Mid-run: cell 1 cancelled, cell 0 sent the time limit's signal, cell 2 requeued by the cluster.
    def mid_run(i: int) -> bool:
        return checkpointed(run[cells[i]]) and squeue().get(f"{array}_{i}") == "RUNNING"

    wait_for("cells 0 and 1 mid-run", lambda: mid_run(0) and mid_run(1))
    subprocess.run(["scancel", f"{array}_1"], check=True)
    wait_for(  # what --signal sends; slurmctld may say "try again later" while the array's tasks change state
        "the USR1 accepted",
        lambda: subprocess.run(["scancel", "--batch", "--signal=USR1", f"{array}_0"]).returncode == 0,
        every=1.0,
    )
    wait_for("cell 2 mid-run", lambda: mid_run(2))
    subprocess.run(["scontrol", "requeue", f"{array}_2"], check=True)
    wait_for("the array to end", lambda: not squeue(), timeout=900, every=0.5)
    assert table(capsys, out) == dict(zip(cells, ["done", "interrupted", "done", "done"]))
    ends = [json.loads(line)["rc"] for line in (run[cells[0]] / "slurm.jsonl").read_text().splitlines()]
    assert ends == [75, 0]  # stopped with a checkpoint, requeued by its own script, resumed to the end
    for i in (0, 2):
        assert "restart 1: smallinit train --resume" in (run[cells[i]] / "train.log").read_text()

    # 4. A second sweep call submits what is missing, and only that.
    assert main(["sweep", str(path), "--out", str(out), "--scheduler", "slurm"]) == 0
    assert "1 submitted now" in capsys.readouterr().err
    [again] = squeue()  # one new array of one task: cell 1
    assert again.endswith("_1") and again.split("_")[0] != array
    wait_for("the second array to end", lambda: not squeue(), timeout=900, every=0.5)
    assert set(table(capsys, out).values()) == {"done"}
    assert (
        main(["sweep", str(path), "--out", str(out), "--scheduler", "slurm"]) == 0
    )  # nothing left to submit
    assert "0 submitted now" in capsys.readouterr().err and not squeue()

    # 5. A partition SLURM refuses: one line, nothing submitted. A cell that fails for real: failed, its error line.
    bad = tmp_path / "bad"
    assert main(["sweep", str(path), "--out", str(bad), "--scheduler", "slurm", "--partition", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("smallinit: error: sbatch refused:") and "nosuch" in err and len(err.splitlines()) == 1
    )
    assert not squeue() and not any(
        s.get("job") for s in json.loads((bad / "status.json").read_text())["cells"].values()
    )
    broken = tmp_path / "broken.toml"
    broken.write_text(
        SWEEP.format(corpus=tmp_path / "missing.txt").replace("[0.5, 1.0]", "[0.5]").replace("[0, 1]", "[0]")
    )
    assert main(["sweep", str(broken), "--out", str(tmp_path / "broken"), "--scheduler", "slurm"]) == 0
    wait_for("the broken cell to end", lambda: not squeue(), every=0.5)
    assert main(["status", str(tmp_path / "broken")]) == 0
    assert re.search(r"gamma-0.5_seed-0\s+failed\s.*missing.txt", capsys.readouterr().out)

    # 6. Every cell equals the same cell run here, bit for bit: no step lost or done twice.
    assert main(["sweep", str(path), "--out", str(tmp_path / "local"), "--jobs", "2"]) == 0
    for c in cells:
        mine, here = losses(run[c]), losses(tmp_path / "local" / "cells" / c)
        steps = [s[0] for s in mine if s[1] is not None]
        assert steps == sorted(set(steps)) and steps[-1] == 2000
        assert mine == here, c
