"""torch.compile on this CPU: speedup of a training step and the time spent compiling.

Two copies of the same model (same seed), one compiled the way the trainer compiles it (per block,
``train.compile=true`` through ``smallinit.train.distributed.parallelize``), timed interleaved after
warm-up. Compile time = the first compiled steps' time minus as many steady compiled steps.

    python benchmarks/bench_compile.py [--size cpu-5m] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_train import ours_loss, train_step
from common import Row, Stat, check, interleaved, paired

from smallinit import ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.train.distributed import Runtime, parallelize


def run(args: argparse.Namespace) -> list[Row]:
    cfg = ModelConfig.preset(args.size)
    eager, compiled = Transformer(cfg, seed=0), Transformer(cfg, seed=0)
    parallelize(compiled, Runtime.local("cpu"), TrainConfig(compile=True), None)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    cases = {"eager": train_step(eager, ours_loss, x, y), "compiled": train_step(compiled, ours_loss, x, y)}

    t0 = time.perf_counter()
    cases["compiled"]()  # traces and compiles forward and backward
    cases["compiled"]()  # recompiles once if the first call saw different grad modes / shapes
    first_two = time.perf_counter() - t0
    t = interleaved(cases, rounds=args.rounds, warmup=1)
    compile_s = first_two - 2 * Stat.of(t["compiled"]).median
    speedup = paired(t["eager"], t["compiled"])
    target, ok = check(speedup, at_least=1.0)
    where = f"{args.size}, batch {args.batch}×{args.seq}"
    return [
        Row("compile", f"{where}: compiled / eager tokens/s", speedup, "×", target, ok,
            note="below 1: keep train.compile=false on CPU (the default)"),
        Row("compile", f"{where}: compile time", Stat.of([compile_s]), "s"),
    ]


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--size", default="cpu-5m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(ap)
    for r in run(ap.parse_args()):
        print(f"{r.name:<55} {r.stat.median:>8.3f} [{r.stat.lo:.3f}, {r.stat.hi:.3f}] n={r.stat.n} {r.target}")
