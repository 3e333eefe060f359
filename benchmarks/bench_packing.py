"""Packing: two 1-thread training processes side by side vs one 2-thread process, total tokens/s per size.

This is the fact behind the sweep runner's packing rule. Three worker processes per model size stay alive
for the whole measurement (started once, warmed up), and the two layouts alternate round by round:
  packed  both 1-thread workers train at the same time for ``--seconds``; their tokens/s add up
  single  the 2-thread worker trains alone for ``--seconds``
Idle workers wait on a pipe and use no CPU. A worker trains whole steps (forward, backward, AdamW) of
batch 16 × 128 until the time is up and reports tokens and seconds.

    python benchmarks/bench_packing.py [--sizes cpu-1m cpu-5m cpu-20m] [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import Row, Stat, main


class Worker:
    """A training process driven over its stdin/stdout, one JSON line per request."""

    def __init__(self, preset: str, threads: int, batch: int, seq: int):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                preset,
                str(threads),
                str(batch),
                str(seq),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def send(self, seconds: float) -> None:
        self.proc.stdin.write(f"{seconds}\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"packing worker exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def worker_main(preset: str, threads: int, batch: int, seq: int) -> None:
    import torch
    from bench_train import ours_loss, train_step

    from smallinit import ModelConfig, Transformer

    torch.set_num_threads(threads)
    model = Transformer(ModelConfig.preset(preset), seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq + 1), generator=gen)
    step = train_step(model, ours_loss, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    step()
    step()
    print(json.dumps({"ready": True, "params": model.num_params()}), flush=True)
    for line in sys.stdin:  # CLOCK_MONOTONIC is one clock for all processes, so the parent can align them
        seconds, start, ends = float(line), time.monotonic(), []
        while not ends or ends[-1] - start < seconds:
            step()
            ends.append(time.monotonic())
        print(json.dumps({"tokens_per_step": batch * seq, "start": start, "ends": ends}), flush=True)


def rate(report: dict, cutoff: float = float("inf")) -> float:
    """Tokens/s over the steps that ended by ``cutoff`` (at least one)."""
    ends = [t for t in report["ends"] if t <= cutoff] or report["ends"][:1]
    return report["tokens_per_step"] * len(ends) / (ends[-1] - report["start"])


def bench_size(preset: str, *, rounds: int, seconds: float, batch: int, seq: int) -> list[Row]:
    workers = [Worker(preset, 1, batch, seq), Worker(preset, 1, batch, seq), Worker(preset, 2, batch, seq)]
    try:
        params = [w.read() for w in workers][0]["params"]
        packed, single = [], []
        for _ in range(rounds):
            for w in workers[:2]:
                w.send(seconds)
            results = [w.read() for w in workers[:2]]
            # count only steps that ran while the other worker was still busy: alone, one runs faster
            cutoff = min(r["ends"][-1] for r in results)
            packed.append(sum(rate(r, cutoff) for r in results))
            workers[2].send(seconds)
            single.append(rate(workers[2].read()))
    finally:
        for w in workers:
            w.close()
    ratio = Stat.of([p / s for p, s in zip(packed, single)])
    where = f"{preset} ({params / 1e6:.1f}M params)"
    return [
        Row("packing", f"{where}: 2 × 1-thread processes tokens/s", Stat.of(packed), "tokens/s"),
        Row("packing", f"{where}: 1 × 2-thread process tokens/s", Stat.of(single), "tokens/s"),
        Row(
            "packing",
            f"{where}: packed / single",
            ratio,
            "×",
            note="> 1: pack one 1-thread cell per core",
            extra={"params": params},
        ),
    ]


def run(args: argparse.Namespace) -> list[Row]:
    rows = []
    for preset in args.sizes:
        rows += bench_size(preset, rounds=args.rounds, seconds=args.seconds, batch=args.batch, seq=args.seq)
    return rows


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--sizes", nargs="+", default=["cpu-1m", "cpu-5m", "cpu-20m"])
    ap.add_argument("--rounds", type=int, default=2 if quick else 3)
    ap.add_argument(
        "--seconds", type=float, default=3.0 if quick else 4.0, help="seconds per layout per round"
    )
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        sys.exit(0)
    main(__doc__, add_args, run)
