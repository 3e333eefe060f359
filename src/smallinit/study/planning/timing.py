"""A plan's wall time measured on this machine: each kind of cell trains for a few steps before pricing.

A run's time is its fixed cost (the process, imports, the model, the data, the final evaluation and checkpoint)
plus its steps, each with the evaluations and analysis its schedule spreads over them. Both are measured: every
kind of cell (one model shape, batch, schedule and layout; γ, ε, lr and seed change no cost) is trained twice
with the very command a sweep runs, for K and 2K steps of its own intervals, side by side as the sweep packs
them, so that

    run time = start + per_step × steps,   start = 2·t(K) − t(2K),   per_step = (t(2K) − t(K)) / K.

FLOPs at an assumed MFU priced the demo 3–6× short (docs/findings-cpu.md), because they leave out all of this.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from smallinit.config import Config
from smallinit.errors import ExperimentError
from smallinit.study.running.packing import available_cores, compile_choices, default_jobs
from smallinit.study.running.spec import Cell

MIN_STEPS = 8  # K is at least this, and at least each of the cell's evaluation and analysis intervals


@dataclass(frozen=True)
class CellTime:
    """One kind of cell on this machine: its fixed cost and its cost per step (seconds of wall time, packed)."""

    start_s: float
    step_s: float
    steps: int  # K: timed at K and 2K steps

    def seconds(self, steps: int) -> float:
        return self.start_s + self.step_s * steps


@dataclass(frozen=True)
class Timing:
    """The measured price of a set of sweeps: each sweep's wall time with its cells packed ``jobs`` at a time."""

    jobs: int
    cells: dict[str, float]  # "sweep/cell id" → that run's seconds
    sweeps: dict[str, float]  # sweep → wall seconds, its cells packed
    kinds: int  # kinds of cell timed
    timing_s: float  # what timing them cost

    @property
    def wall_s(self) -> float:
        return sum(self.sweeps.values())

    def packed(self, seconds: list[float]) -> float:
        """The wall time of runs of these seconds, ``jobs`` at a time."""
        return max(max(seconds, default=0.0), sum(seconds) / max(1, min(self.jobs, len(seconds))))

    def describe(self) -> str:
        return (
            f"timed on this machine: {self.kinds} kind(s) of cell trained for a few steps, {self.jobs} side by side "
            f"as the sweep packs them ({self.timing_s:.0f} s); start-up, evaluations and analysis included, the "
            "findings step after the runs not"
        )


def kind(cfg: Config) -> str:
    """What a cell's cost depends on: everything but γ, ε, the learning rate, the seed and the run's length."""
    model = dataclasses.replace(cfg.model, gamma=1.0, norm_eps=1e-12, norm_eps_width=0)
    train = dataclasses.replace(cfg.train, seed=0, lr=0.0, steps=0, warmup_steps=0)
    return repr((model, cfg.data, train, cfg.analysis))


def time_sweeps(
    sweeps: dict[str, list[tuple[Cell, Config]]], jobs: int | None = None, python: str = sys.executable
) -> Timing:
    """Time every kind of cell of ``sweeps`` (sweep name → its cells with their resolved configs) and price each
    sweep: its cells' times packed ``jobs`` at a time (the runner's default packing when None)."""
    t0 = time.monotonic()
    everything = [cc for cells in sweeps.values() for cc in cells]
    jobs = jobs or default_jobs([cfg for _, cfg in everything])
    compiled = compile_choices([c for c, _ in everything], {c.id: cfg for c, cfg in everything}, jobs)
    times: dict[str, CellTime] = {}
    for cell, cfg in everything:
        if kind(cfg) not in times:
            times[kind(cfg)] = _time_kind(cell, cfg, compiled.get(cell.id), jobs, python)
    each = {
        f"{name}/{cell.id}": times[kind(cfg)].seconds(cfg.train.steps)
        for name, cells in sweeps.items()
        for cell, cfg in cells
    }
    timing = Timing(jobs, each, {}, len(times), time.monotonic() - t0)
    for name, cells in sweeps.items():  # the sweeps run one after another
        timing.sweeps[name] = timing.packed([each[f"{name}/{cell.id}"] for cell, _ in cells])
    return timing


def _time_kind(cell: Cell, cfg: Config, compile_: bool | None, jobs: int, python: str) -> CellTime:
    """Train ``cell`` for K and 2K steps with its own command (side by side when the sweep packs ≥ 2 cells)."""
    k = max(MIN_STEPS, cfg.train.eval_every or 0, cfg.analysis.every or 0, cfg.analysis.norm_every or 0)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if jobs > 1 and not cfg.train.threads:  # as the runner sets it for cells packed side by side
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, available_cores() // jobs))
    with tempfile.TemporaryDirectory(prefix="smallinit-timing-") as tmp:
        commands = []
        for steps in (k, 2 * k):
            cmd = [python, "-m", "smallinit", "train", "--out", str(Path(tmp) / str(steps))]
            for item in cell.set_args():
                cmd += ["--set", item]
            warmup = min(cfg.train.warmup_steps, steps - 1)
            cmd += ["--set", f"train.steps={steps}", "--set", f"train.warmup_steps={warmup}"]
            if compile_ is not None:
                cmd += ["--set", f"train.compile={'true' if compile_ else 'false'}"]
            commands.append(cmd)
        seconds = (
            _run_together(commands, env) if jobs > 1 else [_run_together([cmd], env)[0] for cmd in commands]
        )
    short, long = seconds
    step = max(0.0, (long - short) / k)
    return CellTime(max(0.0, short - step * k), step, k)


def _run_together(commands: list[list[str]], env: dict[str, str]) -> list[float]:
    """Each command's wall seconds, all started at once; one clear line if one fails."""
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        for cmd in commands
    ]
    seconds = [math.nan] * len(procs)
    outputs = []
    for i, proc in enumerate(procs):
        out, _ = proc.communicate()
        seconds[i] = time.monotonic() - t0
        outputs.append(out.decode(errors="replace"))
    for proc, out in zip(procs, outputs):
        if proc.returncode != 0:
            last = (out.strip().splitlines() or ["(no output)"])[-1]
            raise ExperimentError(f"timing a cell for the plan failed (exit {proc.returncode}): {last}")
    return seconds
