"""The plan of a recipe scale, before anything runs: what it costs and which claims it can decide.

Cost. Every cell is resolved exactly as ``smallinit recipe`` resolves it (the recipe's budget in tokens per
non-embedding parameter, the configured tokenizer's vocabulary, ``--presets`` and ``--set``), then

    tokens per run   = train.steps × train.batch_size × data.seq_len
    FLOPs per run    = tokens × (6·N_matmul + 6·L·T·d_attn)       (smallinit.train.flops: causal attention)
    wall time        = Σ FLOPs / (devices × peak × MFU)           (or Σ tokens / tokens-per-second)
    device-hours     = wall time × devices
    memory per device: smallinit.train.memory.estimate_memory for the cell's layout.

Decidability. The claims code itself decides: every planned cell becomes a run holding what the design fixes
(its config, size, tokens per parameter, and the evaluation and analysis steps its config's schedule rules give)
with every outcome unknown (``PlannedRun``). The recipe's claims, from the one registry
(smallinit.study.judging.claims.registry), are judged on these runs: whatever is "not testable here" fails by
design — seeds, tokens per parameter, evaluations, the sink sample, ε's saturation by the formula, sizes — and
will fail whatever the runs show. The preconditions that depend on outcomes are skipped on planned runs and
named, per claim, as decided by the runs. No outcome is invented.

Power. For each claim, the minimum detectable effect at 80 % power of its paired t-test over the planned
seeds (smallinit.study.judging.power), at the level its table judges it (Holm over the primaries the design decides:
α/k for k of them, 0.05 for a recipe that decides one), in the claim's own unit (nats for a loss gap, the flow
exponent, the stable rank, Δ_sym, an accuracy) from a seed sd of that quantity: ``--seed-sd CLAIM=X``, else for a
loss gap ``--seed-sd X`` or the recipe's pilot (``recipe.seed_sd``), else the CPU study's measured sd of it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from smallinit.config import Config, flatten
from smallinit.errors import ExperimentError, SmallinitError
from smallinit.model import Transformer
from smallinit.monitor.records import AnalysisRecord, EvalRecord, NormFactorRecord
from smallinit.study.judging.claims import (
    CLAIMS,
    NOT_RUN,
    PAPER,
    ClaimResult,
    Comparison,
    Runs,
    judge,
    registered,
)
from smallinit.study.judging.findings import flow_design, token_gap_pairs
from smallinit.study.judging.power import (
    ALPHA,
    MIN_SEEDS,
    POWER,
    minimum_detectable_by,
    minimum_detectable_effect,
)
from smallinit.study.judging.verdicts import seeds_problem
from smallinit.study.planning.recipes import Recipe, Scale, apply_budget, customise, load_recipe
from smallinit.study.running import Sweep, resolve_config
from smallinit.study.running.runs import Run, model_shape
from smallinit.study.running.sbatch import SlurmOptions
from smallinit.train.flops import train_flops_per_token
from smallinit.train.memory import GIB, device_memory, estimate_memory

# Dense bf16 peak per GPU (FLOP/s, without sparsity) and memory (GiB), from the vendors' data sheets.
GPUS: dict[str, tuple[float, float]] = {
    "h100": (989e12, 80),
    "h200": (989e12, 141),
    "h800": (989e12, 80),
    "a100": (312e12, 80),
    "a100-40gb": (312e12, 40),
    "l40s": (362e12, 48),
    "b200": (2250e12, 180),
    "mi300x": (1307e12, 192),
}
# No GPU has run benchmarks/gpu.py for this project yet; 40 % is a common MFU for dense models of these sizes
# under FSDP/DDP with torch.compile, and the plan says that it is assumed. Measure yours and pass --mfu.
GPU_MFU = 0.40
# The CPU: one thread's fp32 matmul rate and the share of it a training step reaches at the demo's shapes
# (d = 16-32, head_dim 8), both measured in benchmarks/README.md ("Tiny widths": 106 GFLOP/s; 0.14-0.20).
# Wider models reach more (0.37-0.69 at d = 32-128, head_dim 16), so CPU times above d = 32 err long.
CPU_CORE_FLOPS = 106e9
CPU_MFU = 0.20
# The seed sd of a paired final-loss gap, when neither --seed-sd nor the recipe gives one: the median sd over
# 3 seeds of the 15 paired loss gaps of the CPU study's earlier run (docs/findings-cpu.md, its verdict table), in nats.
CPU_STUDY_SEED_SD = 0.017


@dataclass(frozen=True)
class Hardware:
    """Where a plan runs: ``devices`` GPUs of one kind, or CPU cores (kind "cpu")."""

    kind: str
    devices: int
    peak_flops: float  # per device: dense bf16 (GPU), fp32 matmul of one thread (CPU core)
    mfu: float
    source: str  # where the MFU (or tokens/s) comes from
    memory_gib: float  # per device (GPU) or the whole machine (CPU)
    tokens_per_s: float | None = None  # all devices together; replaces the MFU when given

    @staticmethod
    def make(
        kind: str | None = None,
        devices: int | None = None,
        *,
        mfu: float | None = None,
        tokens_per_s: float | None = None,
    ) -> Hardware:
        """``kind`` GPUs (default h100) or "cpu"; ``devices`` of them (default 8 GPUs, or this machine's cores)."""
        kind = (kind or "h100").lower()
        if devices is None:
            devices = (os.cpu_count() or 1) if kind == "cpu" else 8
        if devices < 1:
            raise ExperimentError(f"--num-devices must be ≥ 1, got {devices}")
        if mfu is not None and not 0 < mfu <= 1:
            raise ExperimentError(f"--mfu must be in (0, 1], got {mfu}")
        if tokens_per_s is not None and not tokens_per_s > 0:
            raise ExperimentError(f"--tokens-per-s must be > 0, got {tokens_per_s}")
        given = ("--tokens-per-s" if tokens_per_s else "--mfu") if (mfu or tokens_per_s) else ""
        if kind == "cpu":
            return Hardware(
                "cpu",
                devices,
                CPU_CORE_FLOPS,
                mfu or CPU_MFU,
                given or "measured at the demo's shapes (benchmarks/README.md)",
                device_memory(torch.device("cpu")) / GIB,
                tokens_per_s,
            )
        if kind not in GPUS:
            raise ExperimentError(
                f"unknown GPU {kind!r}; choose one of {', '.join(GPUS)} or cpu, or pass --mfu with "
                "the closest one"
            )
        peak, mem = GPUS[kind]
        return Hardware(
            kind,
            devices,
            peak,
            mfu or GPU_MFU,
            given or "assumed: no GPU measurement yet (benchmarks/gpu.py measures it)",
            mem,
            tokens_per_s,
        )

    def seconds(self, flops: float, tokens: float) -> float:
        if self.tokens_per_s:
            return tokens / self.tokens_per_s
        return flops / (self.devices * self.peak_flops * self.mfu)

    def describe(self) -> str:
        what = f"{self.devices} CPU cores" if self.kind == "cpu" else f"{self.devices} × {self.kind.upper()}"
        rate = (
            f"{self.tokens_per_s:,.0f} tokens/s"
            if self.tokens_per_s
            else f"MFU {self.mfu:.0%} of {self.peak_flops / 1e12:g} TFLOP/s"
        )
        return f"{what}, {rate} ({self.source})"


@dataclass
class CellPlan:
    sweep: str
    cell: str
    size: str
    params: int
    params_nonembed: int
    steps: int
    tokens: float
    tokens_per_param: float
    evaluations: int
    analysis_records: int
    flops: float
    ranks: int
    memory_gib: float  # per device, the estimate for the cell's layout


@dataclass
class ClaimPlan:
    """What the design lets a claim's analysis judge. The verdict is its primary comparison's, so the claim is
    decided when the primary passes every design-level precondition."""

    claim: str
    statement: str
    primary: str  # the primary comparison's label
    decides: bool  # the primary passes the design-level preconditions
    seeds: int  # the primary's paired seeds …
    mde: float  # … and its minimum detectable effect at 80 % power, in ``unit`` (inf: none, or no seed sd)
    unit: str = "nats"
    alpha: float = (
        ALPHA  # the level its table judges its primary at (Holm's first step over the decided primaries)
    )
    mde_sds: float = math.inf  # the MDE in seed sds, which needs no seed sd
    seed_sd: float | None = None  # in ``unit``; None where nothing measured it
    seed_sd_source: str = ""
    fewest_seeds: int = 0  # over every testable comparison, primary and secondary
    most_seeds: int = 0
    failing: dict[str, str] = field(default_factory=dict)  # comparison → why it cannot be judged, by design
    testable: list[str] = field(default_factory=list)
    not_run: str = ""  # why the design does not run the claim at all (the recipe scale's options.dropped)
    rule: str = ""  # the primary's rule where it is more than a paired t-test (its MDE is then that rule's)
    # secondaries judged by a rule of their own (a resampling test): label → seeds, alpha, mde_sds, mde, rule
    secondaries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def partly(self) -> bool:
        """Some comparisons can be judged, not all."""
        return bool(self.testable) and bool(self.failing)


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

    @property
    def flops(self) -> float:
        return sum(c.flops for c in self.cells)

    @property
    def wall_s(self) -> float:
        return self.hardware.seconds(self.flops, sum(c.tokens for c in self.cells))

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
        return f"plan on {where}: {_hours(self.wall_s)} wall, {self.device_hours:,.1f} {unit}-hours; {said}"

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
            "cells": [asdict(c) for c in self.cells],
            "claims": [
                {**asdict(c), "mde": _finite(c.mde), "mde_sds": _finite(c.mde_sds)} for c in self.claims
            ],
            "notes": self.notes,
            "slurm": self.slurm and self.slurm.to_dict(),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _hours(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:,.1f} h"


# -- cost --------------------------------------------------------------------------------------------------------


def _ranks(launcher: str, hardware: Hardware) -> int:
    """Processes per cell: a torchrun launcher spreads each cell over every device."""
    return hardware.devices if hardware.kind != "cpu" and "torchrun" in launcher else 1


class _Shapes:
    """What the plan needs of each model shape, computed once: the many cells of a recipe share a few shapes (γ and
    ε change no count), and each count builds a meta model."""

    def __init__(self) -> None:
        self.numbers: dict[tuple[str, int], tuple[int, int, float]] = {}
        self.memory: dict[tuple, float] = {}

    @staticmethod
    def key(cfg: Config) -> str:
        return repr(dataclasses.replace(cfg.model, gamma=1.0, norm_eps=1e-12, norm_eps_width=0))

    def counts(self, cfg: Config) -> tuple[int, int, float]:
        """(parameters, non-embedding parameters, training FLOPs per token)."""
        key = (self.key(cfg), cfg.data.seq_len)
        if key not in self.numbers:
            with torch.device("meta"):
                model = Transformer(cfg.model, init=False)
            self.numbers[key] = (
                model.num_params(),
                model.num_params(embeddings=False),
                train_flops_per_token(model, cfg.data.seq_len),
            )
        return self.numbers[key]

    def memory_gib(self, cfg: Config, **layout: Any) -> float:
        key = (self.key(cfg), tuple(sorted(layout.items())))
        if key not in self.memory:
            self.memory[key] = estimate_memory(cfg.model, **layout).total / GIB
        return self.memory[key]


def plan_cell(
    sweep: str, cell_id: str, size: str, cfg: Config, ranks: int, hardware: Hardware, shapes: _Shapes
) -> CellPlan:
    tc, seq = cfg.train, cfg.data.seq_len
    total, nonembed, flops_per_token = shapes.counts(cfg)
    tokens = float(tc.steps * tc.batch_size * seq)
    mem = shapes.memory_gib(
        cfg,
        micro_batch=max(1, tc.batch_size // (ranks * tc.grad_accum)),
        seq_len=seq,
        world_size=ranks,
        parallel=tc.parallel if ranks > 1 else "none",
        precision="fp32" if hardware.kind == "cpu" or tc.precision == "fp32" else "bf16",
        activation_checkpointing=tc.activation_checkpointing,
    )
    return CellPlan(
        sweep,
        cell_id,
        size,
        total,
        nonembed,
        tc.steps,
        tokens,
        tokens / max(1, nonembed),
        len(tc.eval_steps()),
        len(cfg.analysis.steps(tc.steps)),
        tokens * flops_per_token,
        ranks,
        mem,
    )


# -- decidability: the planned runs, judged by the recipe's own analysis -------------------------------------------


UNKNOWN = math.nan  # an outcome the plan cannot know


class PlannedRun(Run):
    """A cell as its design fixes it, read like a finished run: its config, size, tokens per parameter and schedule
    (the evaluations and analysis steps the config's own rules give), with every outcome unknown (NaN). The claims
    check their design preconditions on it and skip their outcome preconditions (``Run.planned``)."""

    planned = True

    def __init__(self, sweep: str, cell_id: str, cfg: Config, nonembed: int):
        flat = flatten(cfg.to_dict())
        flat.setdefault("model.norm_eps_width", 0)
        super().__init__(
            Path(sweep) / cell_id, cell_id, flat, {"step": cfg.train.steps, "params_nonembed": nonembed}
        )
        self.planned_cfg = cfg

    @property
    def cfg(self) -> Config:
        return self.planned_cfg

    @property
    def evals(self) -> list[EvalRecord]:
        return [EvalRecord(s, UNKNOWN) for s in self.planned_cfg.train.eval_steps()]

    @property
    def val_curve(self) -> list[tuple[int, float]]:
        return [(e.step, e.val_loss) for e in self.evals]

    @property
    def analysis(self) -> list[AnalysisRecord]:  # every measurement unknown (one stable rank stands for all)
        cfg = self.planned_cfg
        return [
            AnalysisRecord(
                s, sink=(UNKNOWN,) * cfg.model.n_layers, sink_mean=UNKNOWN, stable_rank={"unknown": UNKNOWN}
            )
            for s in cfg.analysis.steps(cfg.train.steps)
        ]

    @property
    def norm_records(self) -> list[NormFactorRecord]:
        cfg = self.planned_cfg
        return [NormFactorRecord(s, {}) for s in cfg.analysis.norm_steps(cfg.train.steps)]

    @property
    def lost(self) -> bool:
        return False

    @property
    def val_loss(self) -> float:
        return UNKNOWN


def _planned_measurements(runs: Runs, claims: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """What the analysis will measure beside the runs for these claims, as the findings would choose it (which γ,
    widths and seeds; which model pairs), every value unknown."""
    needs = {need for key in claims for need in registered(key).needs}
    out: dict[str, Any] = {}
    if "anchor" in needs:
        out["anchor"] = {
            r.path: {"heldout_reasoning": UNKNOWN, "heldout_memorising": UNKNOWN}
            for r in runs
            if str(r.config.get("data.corpus", "")).startswith("builtin:anchor")
        }
    gammas, widths, seeds = flow_design(options)
    if "flow" in needs and len(widths) >= 2:  # one fitted exponent per γ and seed
        out["flow"] = {
            "gammas": gammas,
            "seeds": seeds,
            "seed_slopes": [[UNKNOWN] * len(seeds) for _ in gammas],
            "planned": True,
        }
    if "gaps" in needs:  # one token comparison per seed pair; its profile unknown
        pairs, _ = token_gap_pairs(runs)
        out["gaps"] = dict.fromkeys(pairs) or None
    return out


def _claim_plans(
    results: list[ClaimResult], loss_sd: tuple[float, str], claim_sd: dict[str, float]
) -> list[ClaimPlan]:
    """Each claim's plan at the level its table judges it: Holm over the k primaries the design decides gives the
    first of them α/k (a recipe that decides one claim judges it at α), in the claim's unit from its seed sd."""
    plans, powers = [], []
    for res in results:
        problems = {c.label: _design_problem(res, c) for c in res.comparisons}
        failing = {label: why for label, why in problems.items() if why}
        testable = [c for c in res.comparisons if not problems[c.label]]
        counts = [_seeds(c) for c in testable if _seeds(c)] or [0]
        primary = res.primary
        n = 0 if problems[primary.label] else _seeds(primary)
        key = res.claim.split()[0]
        claim = registered(key)
        unit = claim.unit
        sd, source = (
            (claim_sd[key], f"--seed-sd {key}={claim_sd[key]:g}")
            if key in claim_sd
            else loss_sd
            if unit == "nats"
            else claim.seed_sd or (None, "")
        )
        dropped = res.untestable.removeprefix(f"{NOT_RUN}: ") if res.untestable.startswith(NOT_RUN) else ""
        plans.append(
            ClaimPlan(
                res.claim,
                res.statement,
                primary.label,
                not problems[primary.label],
                n,
                math.inf,
                unit=unit,
                seed_sd=sd,
                seed_sd_source=source,
                fewest_seeds=min(counts),
                most_seeds=max(counts),
                failing={} if dropped else failing,
                testable=[c.label for c in testable],
                not_run=dropped,
                rule=primary.power_why,
            )
        )
        powers.append(primary.power)
        for c in testable:
            if c.power is not None and c is not primary:  # a secondary: judged at α, uncorrected
                mde_sds = minimum_detectable_by(functools.partial(c.power, alpha=ALPHA))
                plans[-1].secondaries[c.label] = {
                    "seeds": _seeds(c),
                    "alpha": ALPHA,
                    "mde_sds": _finite(mde_sds),
                    "mde": _finite(mde_sds * sd) if sd is not None else None,
                    "rule": c.power_why,
                }
    alpha = ALPHA / max(1, sum(c.decides for c in plans))
    for c, power in zip(plans, powers):
        c.alpha = alpha
        c.mde_sds = (
            _mde(1.0, c.seeds, alpha)
            if power is None or not c.decides
            else minimum_detectable_by(functools.partial(power, alpha=alpha))
        )
        c.mde = c.mde_sds * c.seed_sd if c.seed_sd is not None else math.inf
    return plans


def _design_problem(res: ClaimResult, c: Comparison) -> str:
    """Why the design cannot judge ``c`` ("" if it can): a failed precondition, or too few paired seeds for a
    t-test (its planned values are unknown, so counted, not tested)."""
    return res.untestable or c.untestable or ("" if c.estimate is not None else seeds_problem(_seeds(c)))


def _seeds(c: Comparison) -> int:
    """The seeds a comparison of planned runs pairs (their values are all unknown)."""
    return len(c.samples) + len(c.unknown)


def _mde(seed_sd: float, seeds: int, alpha: float) -> float:
    return minimum_detectable_effect(seed_sd, seeds, alpha, POWER) if seeds >= MIN_SEEDS else math.inf


# -- the plan ------------------------------------------------------------------------------------------------------


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
) -> Plan:
    """The plan of a sweep file: its cost, and which of C1–C7 its runs could decide (judged as the demo judges);
    ``slurm`` (the SLURM flags, see plan_recipe) over the file's [slurm] table."""
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
    return plan_recipe(recipe, "sweep", hardware, seed_sd=seed_sd, claim_sd=claim_sd, slurm=opts)


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
) -> Plan:
    """The cost and decidability of ``recipe --scale scale`` on ``hardware``; trains nothing. ``seed_sd``: the loss
    gaps' seed sd (nats); ``claim_sd``: a claim's own (C6: a stable rank), over the CPU study's. ``slurm``: each
    cell a SLURM job of these options (or flags over the defaults), on all of one job's devices (``hardware``:
    one job's, by default its GPUs as H100s, or its CPU cores)."""
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
    cells, runs, shapes = [], [], _Shapes()
    for name, sw in sc.sweeps.items():
        ranks = _ranks("torchrun" if slurm is not None and slurm.gpus else sw.launcher or "", hardware)
        for cell in sw.cells():
            cfg = resolve_config(cell, vocab)
            shape = model_shape(flatten(cfg.to_dict()))
            size = cell.size or f"d{shape[0]}×{shape[1]}"
            cells.append(plan_cell(name, cell.id, size, cfg, ranks, hardware, shapes))
            runs.append(PlannedRun(name, cell.id, cfg, cells[-1].params_nonembed))
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
        _planned_measurements(all_runs, recipe.claims, sc.options),
        {**sc.options, "n_boot": 20},
    )
    claims = _claim_plans(judged, (sd, source), claim_sd or {})
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
    return Plan(recipe.name, sc.name, hardware, sd, source, cells, claims, notes, slurm)


def scale_headline(recipe: Recipe, scale: str) -> str:
    """The plan's headline on the scale's default hardware, or why there is none (a file the scale needs is missing)."""
    try:
        plan = plan_recipe(recipe, scale)
    except SmallinitError as e:
        return f"plan: not available ({e})"
    return plan.headline()


# -- what a user sees ------------------------------------------------------------------------------------------


def format_plan(plan: Plan) -> str:
    hw = plan.hardware
    lines = [f"plan: recipe {plan.recipe} --scale {plan.scale} on {hw.describe()}"]
    head = (
        f"  {'sweep':<12} {'size':<10} {'runs':>5} {'params':>9} {'non-emb':>9} {'tokens/run':>11} {'tok/param':>9} "
        f"{'evals':>5} {'FLOPs/run':>10} {'GiB/dev':>8} {'wall':>9}"
    )
    lines += [head, "  " + "-" * (len(head) - 2)]
    groups: dict[tuple[str, str], list[CellPlan]] = {}
    for c in plan.cells:
        groups.setdefault((c.sweep, c.size), []).append(c)
    for (sweep, size), cs in groups.items():
        c = max(cs, key=lambda x: x.flops)
        wall = hw.seconds(sum(x.flops for x in cs), sum(x.tokens for x in cs))
        lines.append(
            f"  {sweep:<12} {size:<10} {len(cs):>5} {_si(c.params):>9} {_si(c.params_nonembed):>9} "
            f"{_si(c.tokens):>11} {min(x.tokens_per_param for x in cs):>9.1f} {c.evaluations:>5} "
            f"{c.flops:>10.2e} {c.memory_gib:>8.2f} {_hours(wall):>9}"
        )
    unit = "CPU-core" if hw.kind == "cpu" else "GPU"
    lines.append(
        f"  total: {len(plan.cells)} runs, {plan.flops:.3g} FLOPs, {_hours(plan.wall_s)} wall, "
        f"{plan.device_hours:,.1f} {unit}-hours"
    )
    decided = sum(c.decides for c in plan.claims)
    alpha = plan.claims[0].alpha if plan.claims else ALPHA
    lines.append(
        f"claims (minimum detectable effect of each primary at {POWER:.0%} power, two-sided, at the level its "
        f"table judges it: α = {alpha:.3g}, Holm's first step over the {decided} primar"
        f"{'y' if decided == 1 else 'ies'} this design decides; in the claim's own unit):"
    )
    for c in plan.claims:
        if c.decides:
            at = (
                f"{c.mde:.3g} {c.unit} at seed sd {c.seed_sd:g}"
                if c.seed_sd is not None
                else f"no seed sd of {c.unit} measured: pass --seed-sd {c.claim.split()[0]}=X"
            )
            lines.append(
                f"  {c.claim:<12} decides: primary {c.primary} on {c.seeds} seeds, MDE {c.mde_sds:.2f} seed sds "
                f"({at}{'; ' + c.rule if c.rule else ''}); {len(c.testable)} of "
                f"{len(c.testable) + len(c.failing)} comparisons testable, {c.fewest_seeds}–{c.most_seeds} seeds"
            )
            for label, s in c.secondaries.items():
                at = f" = {s['mde']:.3g} {c.unit}" if s["mde"] is not None else ""
                lines.append(
                    f"      · {label}: {s['seeds']} seeds, MDE {s['mde_sds'] or math.inf:.2f} seed sds{at} at "
                    f"α = {s['alpha']:g} ({s['rule']})"
                )
        elif c.not_run:
            lines.append(f"  {c.claim:<12} {NOT_RUN}: {c.not_run}")
        else:
            lines.append(
                f"  {c.claim:<12} cannot decide: its primary ({c.primary}) fails a precondition by design"
                + (f"; {len(c.testable)} secondary comparison(s) testable" if c.testable else "")
            )
        for reason in _distinct(c.failing):
            lines.append(f"      ↳ {reason}")
    outcome = [
        k for k in (c.claim.split()[0] for c in plan.claims if c.decides) if CLAIMS[k].decided_by_the_runs
    ]
    if outcome:
        lines.append(
            "still decided by the runs themselves (the plan cannot know them): "
            + "; ".join(f"{k} {CLAIMS[k].decided_by_the_runs}" for k in outcome)
        )
    sources = {
        f"{c.seed_sd:g} {c.unit}: {c.seed_sd_source}"
        for c in plan.claims
        if c.decides and c.seed_sd is not None
    }
    lines += [f"seed sd {s}" for s in sorted(sources)]
    lines += [f"note: {n}" for n in plan.notes]
    lines += _slurm_lines(plan, plan.slurm) if plan.slurm is not None else []
    return "\n".join(lines)


def _slurm_lines(plan: Plan, opts: SlurmOptions) -> list[str]:
    """How the plan's cells run as SLURM jobs: how many, of what size, for how long."""
    hw, sweeps = plan.hardware, len({c.sweep for c in plan.cells})
    secs = sorted(hw.seconds(c.flops, c.tokens) for c in plan.cells)
    usable = opts.limit_s - opts.signal_s
    at_once = min(opts.max_running or len(secs), len(secs))
    size = (
        f"{opts.nodes} node(s) × {opts.gpus_per_node} GPUs, {opts.cpus_per_task} CPUs per node"
        if opts.gpus
        else f"one process on {opts.cpus_per_task} CPU core(s)"
    )
    where = "".join(f", {k} {v}" for k, v in (("partition", opts.partition), ("account", opts.account)) if v)
    throttle = f"at most {opts.max_running}" if opts.max_running else "as many as SLURM allows"
    lines = [
        f"slurm: {len(secs)} jobs in {sweeps} job array(s), {throttle} at a time; each {size}, time limit "
        f"{opts.time}{where}",
        f"  training per job: {_hours(secs[0])} to {_hours(secs[-1])} (median {_hours(secs[len(secs) // 2])})",
    ]
    longer = [s for s in secs if s > usable]
    if longer:
        lines.append(
            f"  {len(longer)} job(s) need more than the {_hours(usable)} before the stop signal: each checkpoints, "
            f"is requeued and resumes, in up to {max(math.ceil(s / usable) for s in longer)} parts"
        )
    else:
        lines.append(f"  every job fits its time limit ({_hours(usable)} before the stop signal)")
    unit = "GPU" if opts.gpus else "CPU-core"
    lines.append(
        f"  all jobs: ≈ {_hours(max(secs[-1], sum(secs) / at_once))} wall with {at_once} running at a time, "
        f"{sum(secs) * hw.devices / 3600:,.1f} {unit}-hours"
    )
    return lines


def _distinct(failing: dict[str, str], limit: int = 6) -> list[str]:
    """Each reason once (comparisons of several sizes often share one), at most ``limit`` of them."""
    seen: dict[str, str] = {}
    for label, reason in failing.items():
        seen.setdefault(reason, f"{label}: {reason}")
    out = list(seen.values())
    return out[:limit] + ([f"… and {len(out) - limit} more"] if len(out) > limit else [])


def _si(x: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.0f}"
