"""A sweep on a SLURM cluster: its cells submitted as one job array, their states read back from SLURM.

``submit_sweep`` writes the sweep folder as the local runner does (sweep.json, status.json, results), the
array's script (smallinit.study.running.sbatch) and submits the cells that still need to run as ONE throttled
job array, then returns: the jobs run without it. Each cell's state in status.json gains ``job`` (its array
task, ``ARRAYID_TASKID``), with ``queued`` for a task SLURM has not started yet. ``refresh_states`` reads the
states back from ``squeue`` (no accounting database needed) and the cells' own files: summary.json (done),
slurm.jsonl (how each attempt ended: 75 is a stop, any other non-zero code a failure with the log's error
line). Submitting again submits only the cells that are neither finished, failed, queued nor running; the
folder's lock and the array's job name (squeue finds the folder's jobs by it, also ones whose submission was
never recorded) keep a cell from being submitted twice.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from smallinit.errors import ExperimentError
from smallinit.io import write_text_atomic
from smallinit.study.running.packing import compile_cache_env, compile_choices
from smallinit.study.running.results import cell_row, cell_states, error_line, load_cells
from smallinit.study.running.sbatch import (
    ATTEMPTS_FILE,
    SCRIPT,
    SlurmOptions,
    array_spec,
    batch_script,
    job_name,
)
from smallinit.study.running.spec import Cell, cell_dir, launcher_argv
from smallinit.train.trainer import CONTINUE_ENV

# squeue's states of a job that has not started (again), and of one that holds its node
_WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
_ON_NODE = {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
ACTIVE = ("queued", "running")  # a cell in SLURM's hands


def require(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ExperimentError(
            f"no {name} on PATH: --scheduler slurm needs SLURM's commands; run it on a login node of the "
            "cluster, or leave --scheduler out to run the cells here"
        )
    return path


def _slurm(argv: list[str]) -> str:
    """Run a SLURM command; its stdout, or one line with what it said."""
    try:
        done = subprocess.run(
            [require(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired:
        raise ExperimentError(f"{argv[0]} did not answer in 120 s; is slurmctld up? (try: sinfo)") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
        raise ExperimentError(f"{argv[0]} refused: {said}")
    return done.stdout


def queued_jobs(sweep_dir: Path) -> dict[int, tuple[str, str]]:
    """The folder's array tasks that SLURM knows now: array index → (job id ARRAY_TASK, squeue state)."""
    out = _slurm(["squeue", "--noheader", "--array", "--name", job_name(sweep_dir), "--format", "%i|%T"])
    jobs = {}
    for line in out.split():
        job, _, state = line.partition("|")
        array_id, _, task = job.partition("_")
        if task.isdigit():
            jobs[int(task)] = (job, state)
    return jobs


def _attempts(run: Path) -> list[dict[str, Any]]:
    try:
        text = (run / ATTEMPTS_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill
    return lines


def refresh_states(
    sweep_dir: Path, cells: list[Cell], states: dict[str, dict[str, Any]], jobs: dict[int, tuple[str, str]]
) -> None:
    """Bring the states of the cells SLURM ran up to date from ``jobs`` (queued_jobs) and their files."""
    for index, cell in enumerate(cells):
        state, run = states.setdefault(cell.id, {}), cell_dir(sweep_dir, cell.id)
        if index in jobs:  # also a task whose submission was never recorded
            state["job"] = jobs[index][0]
        if "job" not in state:
            continue
        attempts = _attempts(run)
        state["wall_s"] = sum(float(a.get("end", 0)) - float(a.get("start", 0)) for a in attempts)
        if (run / "summary.json").is_file():
            state.update(status="done", error=None)
        elif index in jobs:
            squeue_state = jobs[index][1]
            state["status"] = "queued" if squeue_state in _WAITING else "running"
            state["slurm_state"] = squeue_state
        elif state.get("status") in ACTIVE:  # it left the queue without finishing: how did it end?
            mine = [a for a in attempts if a.get("job") == state["job"]]
            rc = mine[-1].get("rc") if mine else None
            if rc in (None, 75, 0) or (isinstance(rc, int) and rc > 128):
                why = (
                    error_line(run / "train.log")
                    if rc == 75
                    else (
                        f"job {state['job']} left the queue without an exit code (cancelled, or its node failed)"
                    )
                )
                state.update(status="interrupted", error=why)
            else:
                state.update(status="failed", error=error_line(run / "train.log"), returncode=rc)
            state.pop("slurm_state", None)


def submit_cells(
    sweep_dir: Path,
    sweep_launcher: str,
    cells: list[Cell],
    configs: dict[str, Any],
    states: dict[str, dict[str, Any]],
    todo: list[int],
    opts: SlurmOptions,
    *,
    python: str = sys.executable,
    echo: TextIO | None = None,
) -> str:
    """Write the array's script and submit array tasks ``todo`` (indices into ``cells``); the array's job id."""
    launcher = launcher_argv(sweep_launcher) if sweep_launcher else None
    compile_first = compile_choices(cells, configs, max(1, opts.max_running or len(todo)))
    script_cells = [
        (
            c.id,
            [f"--set={item}" for item in c.set_args()],
            [f"--set=train.compile={json.dumps(compile_first[c.id])}"] if c.id in compile_first else [],
        )
        for c in cells
    ]
    env = {
        CONTINUE_ENV: f"nothing: SLURM requeues the cell, or run the same smallinit command again (it continues "
        f"{sweep_dir.resolve()})",
        "PYTHONUNBUFFERED": "1",
        **compile_cache_env(),
    }
    script = sweep_dir / SCRIPT
    script.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        script, batch_script(sweep_dir, script_cells, opts, python=python, launcher=launcher, env=env)
    )
    spec = array_spec(todo, opts.max_running)
    out = _slurm(
        ["sbatch", "--parsable", f"--array={spec}", f"--job-name={job_name(sweep_dir)}", str(script)]
    )
    array_id = out.strip().split(";")[0]
    now = time.time()
    for i in todo:
        state = states[cells[i].id]
        state.update(
            status="queued", job=f"{array_id}_{i}", attempts=int(state.get("attempts") or 0) + 1, error=None
        )
        state["submitted"] = now
    if echo is not None:
        print(
            f"[slurm] submitted {len(todo)} cell(s) as job array {array_id} (--array={spec})",
            file=echo,
            flush=True,
        )
    return array_id


def cluster_name() -> str:
    """The cluster sbatch submits to (its slurm.conf's ClusterName)."""
    for line in _slurm(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return ""


def check_same_cluster(sweep_dir: Path, record: dict[str, Any], states: dict[str, dict[str, Any]]) -> str:
    """This cluster's name; refuses a folder whose queued or running cells were submitted to another cluster,
    whose squeue this one cannot ask (their cells would look ended here, and be submitted twice)."""
    here = cluster_name()
    there = record.get("cluster")
    active = [s["job"] for s in states.values() if s.get("job") and s.get("status") in ACTIVE]
    if there and there != here and active:
        raise ExperimentError(
            f"sweep folder {sweep_dir} has cells queued or running on SLURM cluster {there} (job {active[0]}), "
            f"not on {here}; continue it from {there}, or scancel its jobs there first"
        )
    return here


def submission_record(record: dict[str, Any], array_id: str, cluster: str) -> dict[str, Any]:
    """status.json's "slurm" after a submission: the arrays submitted, and where from."""
    return {
        **record,
        "arrays": [*record.get("arrays", []), array_id],
        "cluster": cluster,
        "host": socket.gethostname(),
    }


def sweep_status(sweep_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], str]:
    """A sweep folder's rows as they stand now, its cells on SLURM asked of squeue; and a note, where squeue
    could not be asked (the states are then those last recorded)."""
    sweep_dir = Path(sweep_dir)
    cells, states = load_cells(sweep_dir), cell_states(sweep_dir)
    note = ""
    if (sweep_dir / SCRIPT).is_file():  # submitted once: SLURM may know cells no submission recorded
        try:
            refresh_states(sweep_dir, cells, states, queued_jobs(sweep_dir))
        except ExperimentError as e:
            note = f"the SLURM cells' states as last recorded: {e}"
    return [cell_row(sweep_dir, c, states.get(c.id, {})) for c in cells], note
