"""The plan of a recipe scale, before anything runs: what it costs (:mod:`.cost`) and which claims it can decide
(:mod:`.decidability`), in one :class:`Plan` that :mod:`.printing` shows."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from smallinit.config import flatten
from smallinit.errors import ExperimentError, SmallinitError
from smallinit.monitor.runs import model_shape
from smallinit.study.judging.claims import PAPER, Runs, judge
from smallinit.study.planning.cost import CellPlan, Hardware, Shapes, hours, plan_cell, ranks_per_cell
from smallinit.study.planning.decidability import (
    CPU_STUDY_SEED_SD,
    ClaimPlan,
    PlannedRun,
    claim_plans,
    finite,
    planned_measurements,
)
from smallinit.study.planning.recipes import Recipe, Scale, apply_budget, customise, load_recipe
from smallinit.study.planning.timing import Timing, time_sweeps
from smallinit.study.running import Sweep, resolve_config
from smallinit.study.running.packing import available_cores
from smallinit.study.running.sbatch import SlurmOptions


@dataclass
class Plan:
    recipe: str
    scale: str
    hardware: Hardware
    seed_sd: float  # of a paired final-loss gap (nats): the loss claims'
    seed_sd_source: str
    cells: list[CellPlan]
    claims: list[ClaimPlan]
    notes: list[str] = field(default_factory=list)
    slurm: SlurmOptions | None = None  # run as SLURM jobs of these options; the hardware is one job's
    timing: Timing | None = None  # the cells timed on this machine: the wall time is theirs, not the FLOPs'

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.cells)

    @property
    def wall_s(self) -> float:
        if self.timing is not None:
            return self.timing.wall_s
        return self.hardware.seconds(self.flops, sum(c.tokens for c in self.cells))

    def group_wall_s(self, cells: list[CellPlan]) -> float:
        """The wall time of some of its cells (one sweep's, of one size)."""
        if self.timing is not None:
            return self.timing.packed([self.timing.cells[f"{c.sweep}/{c.cell}"] for c in cells])
        return self.hardware.seconds(sum(c.flops for c in cells), sum(c.tokens for c in cells))

    @property
    def device_hours(self) -> float:
        return self.wall_s * self.hardware.devices / 3600

    def headline(self) -> str:
        """One line: the wall time and device-hours, and which claims it decides (its primary can be judged)."""
        decided = [
            c.claim
            + (f" ({len(c.testable)} of {len(c.testable) + len(c.failing)} comparisons)" if c.partly else "")
            for c in self.claims
            if c.decides
        ]
        undecided = [c.claim for c in self.claims if not c.decides and not c.not_run]
        dropped = [c.claim for c in self.claims if c.not_run]
        unit = "core" if self.hardware.kind == "cpu" else "GPU"
        where = (
            f"{self.hardware.devices} CPU cores"
            if unit == "core"
            else f"{self.hardware.devices} × {self.hardware.kind.upper()}"
        )
        said = "; ".join(
            f"{k} {', '.join(v)}"
            for k, v in (("decides", decided), ("not", undecided), ("not run by design", dropped))
            if v
        )
        if not decided:
            said += ": an illustration, its design decides no claim (smallinit plan shows why)"
        wall = f"{hours(self.wall_s)} wall"
        if unit == "core" and self.timing is None:  # the FLOPs' price, which priced the demo 5–6× short
            wall += f" (untimed, at {self.hardware.rate}: smallinit plan times it on this machine)"
        return f"plan on {where}: {wall}, {self.device_hours:,.1f} {unit}-hours; {said}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "scale": self.scale,
            "hardware": asdict(self.hardware),
            "seed_sd": self.seed_sd,
            "seed_sd_source": self.seed_sd_source,
            "flops": self.flops,
            "wall_s": self.wall_s,
            "device_hours": self.device_hours,
            "timing": self.timing and asdict(self.timing),
            "cells": [asdict(c) for c in self.cells],
            "claims": [
                {**asdict(c), "mde": finite(c.mde), "mde_sds": finite(c.mde_sds)} for c in self.claims
            ],
            "notes": self.notes,
            "slurm": self.slurm and self.slurm.to_dict(),
        }


def default_hardware(recipe: Recipe, scale: str) -> Hardware:
    """8 × H100 for a scale whose cells run under torchrun, else this machine's CPU cores."""
    launchers = [sw.launcher or "" for sw in recipe.scale(scale).sweeps.values()]
    if any("torchrun" in launcher for launcher in launchers) or scale.startswith("gpu"):
        return Hardware.make()
    return Hardware.make("cpu")


def plan_sweep(
    path: str | os.PathLike,
    hardware: Hardware | None = None,
    *,
    seed_sd: float | None = None,
    claim_sd: dict[str, float] | None = None,
    slurm: dict[str, Any] | None = None,
    timed: bool = False,
) -> Plan:
    """The plan of a sweep file: its cost, and which of C1–C7 its runs could decide (judged as the demo judges);
    ``slurm`` (the SLURM flags, see plan_recipe) over the file's [slurm] table; ``timed`` as plan_recipe's."""
    sweep = Sweep.load(path)
    recipe = Recipe(
        Path(path).stem,
        sweep.name or Path(path).stem,
        list(PAPER),
        "claims",
        {"sweep": Scale("sweep", sweep.description, {"sweep": sweep})},
        Path(path),
    )
    opts = None if slurm is None else sweep.slurm.merged(slurm)
    return plan_recipe(recipe, "sweep", hardware, seed_sd=seed_sd, claim_sd=claim_sd, slurm=opts, timed=timed)


def plan_recipe(
    recipe: Recipe | str,
    scale: str,
    hardware: Hardware | None = None,
    *,
    presets: list[str] | None = None,
    overrides: list[str] = (),
    seed_sd: float | None = None,
    claim_sd: dict[str, float] | None = None,
    slurm: SlurmOptions | dict[str, Any] | None = None,
    timed: bool = False,
) -> Plan:
    """The cost and decidability of ``recipe --scale scale`` on ``hardware``; trains nothing unless ``timed``.
    ``seed_sd``: the loss gaps' seed sd (nats); ``claim_sd``: a claim's own (C6: a stable rank), over the CPU
    study's. ``slurm``: each cell a SLURM job of these options (or flags over the defaults), on all of one job's
    devices (``hardware``: one job's, by default its GPUs as H100s, or its CPU cores). ``timed``: on this machine's
    CPU, each kind of cell is trained for a few steps first and the wall time is theirs (:mod:`.timing`)."""
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    recipe.scale(scale)  # an unknown scale: one clear line
    if isinstance(slurm, dict):
        slurm = SlurmOptions().merged(slurm)
    if slurm is not None and hardware is None:
        hardware = (
            Hardware.make("h100", slurm.gpus) if slurm.gpus else Hardware.make("cpu", slurm.cpus_per_task)
        )
    hardware = hardware or default_hardware(recipe, scale)
    if seed_sd is not None and not seed_sd > 0:
        raise ExperimentError(f"--seed-sd must be > 0, got {seed_sd}")
    vocab: dict[str, int] = {}
    sc = apply_budget(customise(recipe.scale(scale), presets=presets, overrides=list(overrides)), vocab)
    cells, runs, shapes = [], [], Shapes()
    to_time: dict[str, list] = {}
    for name, sw in sc.sweeps.items():
        ranks = ranks_per_cell(
            "torchrun" if slurm is not None and slurm.gpus else sw.launcher or "", hardware
        )
        for cell in sw.cells():
            cfg = resolve_config(cell, vocab)
            shape = model_shape(flatten(cfg.to_dict()))
            size = cell.size or f"d{shape[0]}×{shape[1]}"
            cells.append(plan_cell(name, cell.id, size, cfg, ranks, hardware, shapes))
            runs.append(PlannedRun(name, cell.id, cfg, cells[-1].params_nonembed))
            to_time.setdefault(name, []).append((cell, cfg))
    all_runs = Runs(runs)
    sd, source = (
        (seed_sd, "--seed-sd")
        if seed_sd
        else recipe.seed_sd
        or (
            CPU_STUDY_SEED_SD,
            "the CPU study's median paired loss-gap sd (docs/findings-cpu.md); pass --seed-sd from a pilot",
        )
    )
    judged = judge(
        recipe.claims,
        all_runs,
        planned_measurements(all_runs, recipe.claims, sc.options),
        {**sc.options, "n_boot": 20},
    )
    claims = claim_plans(judged, (sd, source), claim_sd or {}, recipe.design_effect)
    unjudged = sorted(set(claim_sd or {}) - {c.claim.split()[0] for c in claims if not c.not_run})
    if unjudged:
        raise ExperimentError(
            f"--seed-sd {unjudged[0]}=…: recipe {recipe.name} --scale {sc.name} does not judge {unjudged[0]}"
        )
    notes = []
    if hardware.kind != "cpu":
        too_big = [c for c in cells if c.memory_gib > hardware.memory_gib]
        if too_big:
            notes.append(
                f"{len(too_big)} cell(s) need ≈ {max(c.memory_gib for c in too_big):.0f} GiB per GPU (estimate) "
                f"> {hardware.memory_gib:g} GiB: set train.parallel=fsdp, raise train.grad_accum or set "
                "train.activation_checkpointing=true"
            )
    timing = None
    if timed and hardware.kind == "cpu" and slurm is None:
        if hardware.devices == available_cores():
            timing = time_sweeps(to_time)
        else:  # the cells would run packed on other cores than these
            notes.append(
                f"priced by FLOPs: planning for {hardware.devices} cores, this machine has {available_cores()}"
            )
    return Plan(recipe.name, sc.name, hardware, sd, source, cells, claims, notes, slurm, timing)


def scale_headline(recipe: Recipe, scale: str) -> str:
    """The plan's headline on the scale's default hardware, or why there is none (a file the scale needs is missing)."""
    try:
        plan = plan_recipe(recipe, scale)
    except SmallinitError as e:
        return f"plan: not available ({e})"
    return plan.headline()
