"""What a recipe scale costs, before anything runs: the hardware it runs on and each cell's size, tokens, FLOPs,
wall time and memory.

Every cell is resolved exactly as ``smallinit recipe`` resolves it (the recipe's budget in tokens per
non-embedding parameter, the configured tokenizer's vocabulary, ``--presets`` and ``--set``), then

    tokens per run   = train.steps × train.batch_size × data.seq_len
    FLOPs per run    = tokens × (6·N_matmul + 6·L·T·d_attn)       (smallinit.train.flops: causal attention)
    wall time        = Σ FLOPs / (devices × peak × MFU)           (or Σ tokens / tokens-per-second)
    device-hours     = wall time × devices
    memory per device: smallinit.train.memory.estimate_memory for the cell's layout.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from smallinit.config import Config
from smallinit.errors import ExperimentError
from smallinit.model import Transformer
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

    @property
    def rate(self) -> str:
        """The rate the wall time is priced at."""
        if self.tokens_per_s:
            return f"{self.tokens_per_s:,.0f} tokens/s"
        return f"MFU {self.mfu:.0%} of {self.peak_flops / 1e12:g} TFLOP/s"

    def describe(self) -> str:
        what = f"{self.devices} CPU cores" if self.kind == "cpu" else f"{self.devices} × {self.kind.upper()}"
        return f"{what}, {self.rate} ({self.source})"


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


def hours(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:,.1f} h"


def ranks_per_cell(launcher: str, hardware: Hardware) -> int:
    """Processes per cell: a torchrun launcher spreads each cell over every device."""
    return hardware.devices if hardware.kind != "cpu" and "torchrun" in launcher else 1


class Shapes:
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
        key = (self.key(cfg), cfg.train.optimizer, tuple(sorted(layout.items())))
        if key not in self.memory:
            self.memory[key] = estimate_memory(cfg.model, optimizer=cfg.train.optimizer, **layout).total / GIB
        return self.memory[key]


def plan_cell(
    sweep: str, cell_id: str, size: str, cfg: Config, ranks: int, hardware: Hardware, shapes: Shapes
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
