"""Running a sweep: one process per cell, supervised.

Each cell runs as ``python -m smallinit train --out SWEEP/cells/<cell-id> --set ...`` (or ``<launcher> -m
smallinit train ...`` when [sweep] sets ``launcher``, e.g. ``"torchrun --standalone --nproc_per_node=gpu"``:
in a file only torchrun with launch options, any other command only from the command line), so a crash or a
NaN in one cell cannot stop the others. The sweep folder
holds ``sweep.json`` (the cells), ``status.json`` (pending / running / done / failed / interrupted per cell,
with the error line; rewritten atomically after every change), ``results.csv`` and ``results.json`` (one
row per cell) and ``cells/<cell-id>/`` (a run folder plus ``train.log``). Running the sweep again skips
cells that finished, resumes interrupted ones from their newest checkpoint (``--resume``) and leaves failed
ones alone unless asked to retry them. A lock on the folder keeps two runners apart. With SLURM options the
runner submits the cells that need to run as one job array instead and returns (smallinit.study.running.slurm);
a runner stopped by a signal records its cells interrupted, whatever launcher ran them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from smallinit.config.files import toml_literal
from smallinit.errors import ExperimentError, Preempted
from smallinit.io import lock_exclusive, read_json, write_json_atomic
from smallinit.model import Transformer
from smallinit.monitor.metrics import read_metrics
from smallinit.signals import stop_requests, term_on_parent_death
from smallinit.study.running.packing import (
    available_cores,
    compile_cache_env,
    compile_choices,
    default_jobs,
)
from smallinit.study.running.progress import SweepProgress, cell_work
from smallinit.study.running.results import cell_row, error_line, write_results
from smallinit.study.running.sbatch import SCRIPT, SlurmOptions
from smallinit.study.running.slurm import (
    ACTIVE,
    check_same_cluster,
    queued_jobs,
    refresh_states,
    require,
    submission_record,
    submit_cells,
)
from smallinit.study.running.spec import Cell, Sweep, cell_dir, launcher_argv, resolve_config
from smallinit.train.trainer import CONTINUE_ENV

_POLL_S = 0.2
_ORPHAN_WAIT_S = 120.0  # how long a re-run waits for a cell process left over from a killed runner


@dataclass
class SweepOutcome:
    sweep_dir: Path
    rows: list[dict[str, Any]]
    interrupted: bool = False

    def count(self, status: str) -> int:
        return sum(r["status"] == status for r in self.rows)

    @property
    def in_slurm(self) -> int:
        """Cells queued or running on SLURM."""
        return sum(self.count(s) for s in ACTIVE)

    @property
    def exit_code(self) -> int:
        """0 all done; 1 some cell failed; 75 stopped by a signal (run again to continue)."""
        if self.interrupted:
            return Preempted.exit_code
        return 1 if self.count("failed") else 0


@contextlib.contextmanager
def _folder_lock(sweep_dir: Path) -> Iterator[None]:
    fd = lock_exclusive(sweep_dir / ".lock")
    if fd is None:
        raise ExperimentError(
            f"sweep folder {sweep_dir} is being run by another process; wait for it or choose another --out"
        )
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


def _alive_cell_process(pid: int | None, run_dir: Path) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():  # the pid may have been reused by an unrelated process
        try:
            return str(run_dir) in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
    return True


@dataclass
class _Running:
    cell: Cell
    index: int
    proc: subprocess.Popen
    log: TextIO
    log_path: Path
    started: float
    offset: int = 0
    partial: str = ""
    cpu_s: float | None = None  # user + system CPU seconds of the cell process, once it has ended


def _poll(r: _Running) -> int | None:
    """The cell's exit code, or None while it runs; reaps it with wait4 to learn its CPU time."""
    if not hasattr(os, "wait4"):
        return r.proc.poll()
    try:
        pid, status, usage = os.wait4(r.proc.pid, os.WNOHANG)
    except ChildProcessError:
        return r.proc.poll()
    if pid == 0:
        return None
    r.proc.returncode = os.waitstatus_to_exitcode(status)
    r.cpu_s = usage.ru_utime + usage.ru_stime
    return r.proc.returncode


class SweepRunner:
    """Runs a sweep's cells into ``sweep_dir``; see the module docstring."""

    def __init__(
        self,
        sweep: Sweep,
        sweep_dir: str | os.PathLike,
        *,
        jobs: int | None = None,
        retry_failed: bool = False,
        echo: TextIO | None = None,
        python: str = sys.executable,
        progress: SweepProgress | None = None,
        slurm: SlurmOptions | None = None,
    ):
        self.sweep, self.dir = sweep, Path(sweep_dir)
        self.cells = sweep.cells()
        vocab_sizes: dict[str, int] = {}
        # all checked before any runs
        self.configs = {c.id: resolve_config(c, vocab_sizes) for c in self.cells}
        if slurm is not None:
            require("sbatch")  # before anything is written
        if jobs is not None and jobs < 1:
            raise ExperimentError(f"--jobs {jobs} must be ≥ 1")
        self.jobs = jobs or default_jobs(list(self.configs.values()))
        self.threads = max(1, available_cores() // self.jobs)
        self.retry_failed, self.echo, self.python = retry_failed, echo, python
        self.compile = compile_choices(self.cells, self.configs, self.jobs)
        self.overall = progress  # a recipe's progress over all its sweeps, told of each cell that ends
        self.states: dict[str, dict[str, Any]] = {}
        self.stop: list[str] = []  # stop requests of the session that runs (smallinit.signals)
        self.slurm = slurm  # None: run the cells here; else submit them to SLURM as a job array
        self.submissions: dict[str, Any] = {}  # status.json's "slurm": the arrays submitted, where from
        self.cluster = ""  # the SLURM cluster submitted to

    # -- bookkeeping --

    def _say(self, text: str) -> None:
        if self.echo is not None:
            print(text, file=self.echo, flush=True)

    def _save_status(self) -> None:
        write_json_atomic(
            self.dir / "status.json",
            {
                "sweep": self.sweep.name,
                "updated": time.time(),
                "jobs": self.jobs,
                "cells": {c.id: self.states[c.id] for c in self.cells},
                **({"slurm": self.submissions} if self.submissions else {}),
            },
        )

    def _check_folder(self) -> None:
        """Refuse a folder that holds another sweep whose cells would collide with ours."""
        old = read_json(self.dir / "sweep.json")
        if old is None:
            if (self.dir / "cells").exists():
                raise ExperimentError(f"{self.dir} holds cells but no sweep.json; choose another --out")
            return
        before = {c["id"]: c.get("overrides") for c in old.get("cells", [])}
        for cell in self.cells:
            if cell.id in before and before[cell.id] != cell.overrides:
                raise ExperimentError(
                    f"sweep folder {self.dir} already has cell {cell.id} with other settings (the sweep file "
                    "changed); choose another --out or delete that cell's folder and its entry"
                )

    def _initial_states(self) -> None:
        status = read_json(self.dir / "status.json") or {}
        old, self.submissions = status.get("cells", {}), status.get("slurm") or {}
        for cell in self.cells:
            state = dict(old.get(cell.id) or {})
            total, nonembed = Transformer.count_params(self.configs[cell.id].model)
            state.update(params=total, params_nonembed=nonembed)
            state.setdefault("attempts", 0)
            state.setdefault("wall_s", 0.0)
            self.states[cell.id] = state
        in_slurm = any(s.get("job") and s.get("status") in ACTIVE for s in self.states.values())
        if self.slurm is not None:
            self.cluster = check_same_cluster(self.dir, self.submissions, self.states)
        if in_slurm and self.slurm is None and shutil.which("squeue") is None:
            raise ExperimentError(
                f"cells of {self.dir} were submitted to SLURM and squeue is not on PATH to ask how they stand; "
                f"run this where SLURM's commands are (smallinit status {self.dir} shows them as last recorded)"
            )
        # SLURM ran cells here (or may run some whose submission was never recorded): ask it and their files
        if self.slurm is not None or in_slurm or ((self.dir / SCRIPT).is_file() and shutil.which("squeue")):
            refresh_states(self.dir, self.cells, self.states, queued_jobs(self.dir))
        for cell in self.cells:
            state, run = self.states[cell.id], cell_dir(self.dir, cell.id)
            if state.get("job") and state.get("status") in ACTIVE:
                continue  # in SLURM's hands
            if state.get("status") == "running" and _alive_cell_process(state.get("pid"), run):
                self._wait_orphan(cell, state["pid"])
            if (run / "summary.json").is_file():
                state.update(status="done", error=None)
            elif state.get("status") not in ("failed",) or self.retry_failed:
                was = state.get("status")
                state["status"] = "interrupted" if was in ("running", "interrupted") else "pending"

    def _wait_orphan(self, cell: Cell, pid: int) -> None:
        """A cell process outlived a killed runner: let it checkpoint and exit before we resume the cell."""
        run = cell_dir(self.dir, cell.id)
        self._say(f"[sweep] cell {cell.id}: waiting for its old process {pid} to stop")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + _ORPHAN_WAIT_S
        while _alive_cell_process(pid, run) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if _alive_cell_process(pid, run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_S)

    # -- processes --

    def _launch(self, cell: Cell, index: int) -> _Running:
        run = cell_dir(self.dir, cell.id)
        run.mkdir(parents=True, exist_ok=True)
        resume = (run / "config.json").is_file()
        start = launcher_argv(self.sweep.launcher) if self.sweep.launcher else [self.python]
        cmd = [*start, "-m", "smallinit", "train", "--out", str(run)]
        for item in cell.set_args():
            cmd += ["--set", item]
        if resume:
            cmd.append("--resume")  # with the same --set: the trainer refuses a run of another config
        elif cell.id in self.compile:  # a resumed cell keeps the choice its config.json recorded
            cmd += ["--set", f"train.compile={toml_literal(self.compile[cell.id])}"]
        env = dict(os.environ)
        env.setdefault(CONTINUE_ENV, f"run the same smallinit command again (it continues {self.dir})")
        if self.jobs > 1 and not self.configs[cell.id].train.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(compile_cache_env(env))
        log_path = run / "train.log"
        log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed when the process ends
        offset = log.tell()
        state = self.states[cell.id]
        log.write(
            f"=== attempt {state['attempts'] + 1}{' (resume)' if resume else ''}: {' '.join(cmd[1:])}\n"
        )
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=term_on_parent_death if sys.platform.startswith("linux") else None,
        )
        state.update(
            status="running", pid=proc.pid, attempts=state["attempts"] + 1, error=None, started=time.time()
        )
        self._save_status()
        self._say(f"[{index}/{len(self.cells)}] {cell.id}: {'resumed' if resume else 'started'}")
        return _Running(cell, index, proc, log, log_path, time.monotonic(), offset)

    def _echo_output(self, r: _Running) -> None:
        if self.echo is None:
            return
        try:
            with open(r.log_path, encoding="utf-8", errors="replace") as f:
                f.seek(r.offset)
                text = f.read()
                r.offset = f.tell()
        except OSError:
            return
        *lines, r.partial = (r.partial + text).split("\n")
        for line in lines:
            if line.strip() and not line.startswith("=== attempt"):
                self._say(f"  [{r.index}/{len(self.cells)}] {line.rstrip()}")

    def _finish(self, r: _Running, rc: int) -> dict[str, Any]:
        """Record how the cell ended; returns its results row."""
        self._echo_output(r)
        r.log.close()
        state = self.states[r.cell.id]
        state["wall_s"] = float(state.get("wall_s") or 0.0) + time.monotonic() - r.started
        if r.cpu_s is not None:
            state["cpu_s"] = float(state.get("cpu_s") or 0.0) + r.cpu_s
        state["returncode"] = rc
        state["finished"] = time.time()
        state.pop("pid", None)
        run = cell_dir(self.dir, r.cell.id)
        if (
            run / "summary.json"
        ).is_file():  # written last, atomically: the run finished (a signal may follow)
            state.update(status="done", error=None)
        elif rc == Preempted.exit_code or self.stop:  # a launcher (srun) may end otherwise when stopped
            state.update(status="interrupted", error=error_line(r.log_path))
        else:
            why = error_line(r.log_path) if rc >= 0 else f"killed by {signal.Signals(-rc).name}"
            state.update(status="failed", error=why)
        row = cell_row(self.dir, r.cell, state)
        val = f", val loss {row['val_loss']:.4f}" if isinstance(row["val_loss"], (int, float)) else ""
        err = f": {state['error']}" if state["status"] != "done" else ""
        self._say(
            f"[{r.index}/{len(self.cells)}] {r.cell.id}: {state['status']} in {time.monotonic() - r.started:.0f} s"
            f"{val}{err}"
        )
        self._save_status()
        write_results(self.dir, self.rows())
        return row

    def rows(self) -> list[dict[str, Any]]:
        return [cell_row(self.dir, c, self.states[c.id]) for c in self.cells]

    # -- the loop --

    def run(self) -> SweepOutcome:
        self.dir.mkdir(parents=True, exist_ok=True)
        with _folder_lock(self.dir):
            self._check_folder()
            write_json_atomic(
                self.dir / "sweep.json", {**self.sweep.to_dict(), "cells": [c.to_dict() for c in self.cells]}
            )
            self._initial_states()
            if self.slurm is not None:
                return self._submit()
            active = [s["job"] for s in self.states.values() if s.get("status") in ACTIVE]
            if active:
                raise ExperimentError(
                    f"{len(active)} cell(s) of {self.dir} are queued or running on SLURM (job {active[0]}); "
                    f"wait for them (smallinit status {self.dir}) or scancel them, or continue with --scheduler slurm"
                )
            self._save_status()
            todo = [
                (i, c)
                for i, c in enumerate(self.cells, 1)
                if self.states[c.id]["status"] in ("pending", "interrupted")
            ]
            skipped = len(self.cells) - len(todo)
            to_run = {c.id for _, c in todo}
            for cell in self.cells:  # finished or failed before: not part of this session's work
                if self.overall is not None and cell.id not in to_run:
                    self.overall.drop(self._key(cell))
            self._say(
                f"[sweep] {self.sweep.name}: {len(self.cells)} cells, {len(todo)} to run"
                f"{f' ({skipped} finished or failed before)' if skipped else ''}; {self.jobs} at a time, "
                f"{self.threads} thread(s) each; folder {self.dir}"
            )
            with stop_requests() as self.stop:
                self._loop(todo)
            rows = self.rows()
            write_results(self.dir, rows)
        return SweepOutcome(self.dir, rows, interrupted=bool(self.stop))

    def _submit(self) -> SweepOutcome:
        """Submit the cells that still need to run as one job array; the jobs run without this process."""
        todo = [
            i for i, c in enumerate(self.cells) if self.states[c.id]["status"] in ("pending", "interrupted")
        ]
        before = {
            s: sum(st["status"] == s for st in self.states.values()) for s in ("done", "failed", *ACTIVE)
        }
        self._save_status()  # the states SLURM and the files gave, before sbatch may refuse
        if todo:
            array_id = submit_cells(
                self.dir,
                self.sweep.launcher,
                self.cells,
                self.configs,
                self.states,
                todo,
                self.slurm,
                python=self.python,
                echo=self.echo,
            )
            self.submissions = submission_record(self.submissions, array_id, self.cluster)
            self._save_status()
        self._say(
            f"[sweep] {self.sweep.name}: {len(self.cells)} cells on SLURM: {len(todo)} submitted now, "
            + ", ".join(f"{n} {s}" for s, n in before.items())
            + f"; folder {self.dir} (smallinit status {self.dir})"
        )
        rows = self.rows()
        write_results(self.dir, rows)
        return SweepOutcome(self.dir, rows)

    def _key(self, cell: Cell) -> str:
        return str(cell_dir(self.dir, cell.id))

    def _steps_done(self, r: _Running) -> float:
        """The fraction of its steps a running cell has logged."""
        # every line, typed or not: a resumed cell's "steps" event is at its checkpoint, which need not be logged
        step = max((rec.get("step", 0) for rec in read_metrics(cell_dir(self.dir, r.cell.id))), default=0)
        return min(1.0, step / self.configs[r.cell.id].train.steps)

    def _train_s(self, r: _Running, row: dict[str, Any]) -> float | None:
        """Seconds a finished cell spent in training steps: its tokens at its median logged speed."""
        speed = row["tokens_per_s"]
        tc = self.configs[r.cell.id].train
        return tc.steps * tc.batch_size * self.configs[r.cell.id].data.seq_len / speed if speed else None

    def _loop(self, todo: list[tuple[int, Cell]]) -> None:
        running: list[_Running] = []
        signalled = False
        progress = SweepProgress("sweep", {self._key(c): cell_work(self.configs[c.id]) for _, c in todo})
        try:
            while todo or running:
                while todo and len(running) < self.jobs and not self.stop:
                    index, cell = todo.pop(0)
                    running.append(self._launch(cell, index))
                if self.stop and not signalled:  # pass the stop on: each cell checkpoints and exits 75
                    signalled = True
                    for r in running:
                        with contextlib.suppress(ProcessLookupError):
                            r.proc.send_signal(signal.SIGTERM)
                    todo.clear()
                time.sleep(_POLL_S)
                for r in list(running):
                    rc = _poll(r)
                    if rc is None:
                        self._echo_output(r)
                        continue
                    running.remove(r)
                    row = self._finish(r, rc)
                    if self.stop:
                        continue
                    in_flight = {self._key(x.cell): self._steps_done(x) for x in running}
                    train_s = self._train_s(r, row)
                    for p in (progress, self.overall):
                        if p is not None:
                            p.finish(self._key(r.cell), time.monotonic() - r.started, train_s)
                            self._say(p.line(in_flight))
        finally:
            for r in running:  # only reached on an unexpected error in the runner itself
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(signal.SIGTERM)
                r.proc.wait()
                self._finish(r, r.proc.returncode)


def run_sweep(
    sweep: Sweep | str | os.PathLike,
    sweep_dir: str | os.PathLike,
    *,
    jobs: int | None = None,
    retry_failed: bool = False,
    echo: TextIO | None = None,
    launcher: str | None = None,
    progress: SweepProgress | None = None,
    slurm: dict[str, Any] | None = None,
) -> SweepOutcome:
    """Run (or continue) a sweep into ``sweep_dir``; ``echo`` receives progress lines.

    ``launcher`` (from the command line, so any command) replaces the sweep file's [sweep] launcher.
    ``progress`` (a recipe's, over all its sweeps) is told of every cell that ends and printed after the sweep's.
    ``slurm``: submit the cells to SLURM as one job array instead of running them here, with the file's [slurm]
    options and these (SlurmOptions' keys; None: not given) over them; the rows are then the cells' states.
    """
    if not isinstance(sweep, Sweep):
        sweep = Sweep.load(sweep)
    if launcher is not None:
        launcher_argv(launcher)
        sweep = dataclasses.replace(sweep, launcher=launcher)
    options = None if slurm is None else sweep.slurm.merged(slurm)
    return SweepRunner(
        sweep, sweep_dir, jobs=jobs, retry_failed=retry_failed, echo=echo, progress=progress, slurm=options
    ).run()
