"""Memory: peak RSS of training each CPU preset, and what activation checkpointing saves and costs.

Peak RSS needs a fresh process per measurement (a peak never goes down): each one builds the model,
runs a few full training steps (batch 16 × 128) and reports its peak, and its RSS right after importing
torch and smallinit (the interpreter's share, reported separately). Checkpointing is applied the way the
trainer applies it (``train.activation_checkpointing=true`` through ``parallelize``: per block). Its step
time cost is measured in one process, interleaved with the plain model.

    python benchmarks/bench_memory.py [--sizes cpu-1m cpu-5m cpu-20m]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch
from bench_train import ours_loss, train_step
from common import Row, Stat, add_common_args, interleaved, main, paired

MB = 1024  # both are in KiB on Linux


def peak_rss_kib() -> int:
    """This process's peak resident set size.

    ``ru_maxrss`` is wrong in a child of a large process: Linux carries the parent's high-water mark into
    the child at fork and keeps it through exec. VmHWM belongs to the memory of this program image alone.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def with_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    from smallinit.config import TrainConfig
    from smallinit.train.distributed import Runtime, parallelize

    return parallelize(model, Runtime.local("cpu"), TrainConfig(activation_checkpointing=True))


def make(preset: str, ckpt: bool, batch: int, seq: int):
    from smallinit import ModelConfig, Transformer

    model = Transformer(ModelConfig.preset(preset), seed=0)
    if ckpt:
        with_checkpointing(model)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq + 1), generator=gen)
    return train_step(model, ours_loss, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def worker(preset: str, ckpt: bool, batch: int, seq: int, steps: int) -> None:
    import smallinit  # noqa: F401 - counted in the baseline

    base = peak_rss_kib()
    step = make(preset, ckpt, batch, seq)
    for _ in range(steps):
        step()
    peak = peak_rss_kib()
    print(json.dumps({"base_mb": base / MB, "peak_mb": peak / MB}))


def measure(preset: str, ckpt: bool, batch: int, seq: int, steps: int) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        preset,
        str(int(ckpt)),
        str(batch),
        str(seq),
        str(steps),
    ]
    return json.loads(
        subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    )


def run(args: argparse.Namespace) -> list[Row]:
    rows = []
    for preset in args.sizes:
        for ckpt in (False, True) if preset == args.ckpt_size else (False,):
            r = measure(preset, ckpt, args.batch, args.seq, args.steps)
            label = " with activation checkpointing" if ckpt else ""
            rows.append(
                Row(
                    "memory",
                    f"{preset}{label}: peak RSS training, batch {args.batch}×{args.seq}",
                    Stat.of([r["peak_mb"]]),
                    "MiB",
                    note=f"{r['peak_mb'] - r['base_mb']:.0f} MiB above the imports' {r['base_mb']:.0f}",
                    extra={"base_mb": r["base_mb"], "checkpointing": ckpt},
                )
            )
    plain, ckpt = (r for r in rows if args.ckpt_size in r.name)
    saved = (plain.stat.median - ckpt.stat.median) / (plain.stat.median - plain.extra["base_mb"])
    rows.append(
        Row(
            "memory",
            f"{args.ckpt_size}: activation checkpointing saves (of the training RSS)",
            Stat.of([saved]),
            "frac",
        )
    )
    steps = {
        "plain": make(args.ckpt_size, False, args.batch, args.seq),
        "ckpt": make(args.ckpt_size, True, args.batch, args.seq),
    }
    t = interleaved(steps, rounds=args.rounds, warmup=1, clock=args.clock)
    rows.append(
        Row(
            "memory",
            f"{args.ckpt_size}: activation checkpointing step time vs plain",
            paired(t["ckpt"], t["plain"], lambda a, b: a / b - 1),
            "+frac",
            note="recomputes each block's forward in backward",
        )
    )
    return rows


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--sizes", nargs="+", default=["cpu-1m", "cpu-5m", "cpu-20m"])
    ap.add_argument(
        "--ckpt-size", default="cpu-20m", help="the preset measured with and without checkpointing"
    )
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3, help="training steps per memory measurement")
    ap.add_argument(
        "--rounds", type=int, default=2 if quick else 3, help="rounds of the step time comparison"
    )
    add_common_args(ap)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], bool(int(sys.argv[3])), *map(int, sys.argv[4:7]))
        sys.exit(0)
    main(__doc__, add_args, run)
