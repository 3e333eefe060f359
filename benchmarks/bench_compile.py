"""torch.compile on this CPU: speedup of a training step and the time spent compiling.

Two copies of the same model (same seed), one compiled the way the trainer compiles it (per block,
``train.compile=true`` through ``smallinit.train.distributed.parallelize``), timed interleaved after
warm-up. Compile time = the first compiled steps' time minus as many steady compiled steps, with empty
Inductor caches (a first run; later runs of the same shapes reuse the disk cache and compile faster).

    python benchmarks/bench_compile.py [--size cpu-5m] [--rounds 5]
"""

from __future__ import annotations

import argparse

import torch
from bench_train import ours_loss, train_step
from common import CLOCKS, Row, Stat, add_common_args, interleaved, main, paired

from smallinit import ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.train.distributed import Runtime, parallelize


def run(args: argparse.Namespace) -> list[Row]:
    from torch._inductor.utils import fresh_cache

    with (
        fresh_cache()
    ):  # a cold compile, as a first run sees it: Inductor's disk caches would hide most of it
        return measure(args)


def measure(args: argparse.Namespace) -> list[Row]:
    cfg = ModelConfig.preset(args.size)
    eager, compiled = Transformer(cfg, seed=0), Transformer(cfg, seed=0)
    parallelize(compiled, Runtime.local("cpu"), TrainConfig(compile=True))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    cases = {"eager": train_step(eager, ours_loss, x, y), "compiled": train_step(compiled, ours_loss, x, y)}

    now = CLOCKS[args.clock]
    t0 = now()
    cases["compiled"]()  # traces and compiles forward and backward
    cases["compiled"]()  # recompiles once if the first call saw different grad modes / shapes
    first_two = now() - t0
    t = interleaved(cases, rounds=args.rounds, warmup=1, clock=args.clock)
    compile_s = first_two - 2 * Stat.of(t["compiled"]).median
    speedup = paired(t["eager"], t["compiled"])
    saved = Stat.of(t["eager"]).median - Stat.of(t["compiled"]).median
    pays = f"pays back after ~{compile_s / saved:.0f} steps" if saved > 0 else "never pays back"
    where = f"{args.size}, batch {args.batch}×{args.seq}"
    return [
        Row(
            "compile",
            f"{where}: compiled / eager tokens/s",
            speedup,
            "×",
            note=f'{pays}; "auto" compiles only widths ≤ 128 (bench_tiny.py)',
        ),
        Row("compile", f"{where}: compile time (empty Inductor cache)", Stat.of([compile_s]), "s"),
    ]


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--size", default="cpu-5m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)
    add_common_args(ap)


if __name__ == "__main__":
    main(__doc__, add_args, run)
