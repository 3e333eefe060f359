"""Overhead of the Monitor (through smallinit's AnalysisCallback) on training time, at a given cadence.

Contestants, timed interleaved in one process (a sample = ``Trainer.fit()`` of one fresh short run, from
the same seed, data and config; model building and data loading are outside the timing):
  plain     no callbacks
  analysis  the AnalysisCallback, i.e. the Monitor (sink, residual flow, norm factors, loss, stable rank +
            mean |cos| of the default matrices every ``--every`` steps and once at step 0; heatmap
            snapshots as configured)
The overhead is analysis / plain − 1 per round, summarised by its median. Also reported: the cost of one
measurement in units of training steps (so the overhead at any cadence N is about that / N).

    python benchmarks/bench_callbacks.py [--preset cpu-1m] [--steps 60] [--every 20] [--rounds 5] [--json out.json]
    python benchmarks/bench_callbacks.py --preset cpu-5m --every 100 --steps 200   # the Monitor's default every
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import Row, Stat, check, paired, write_rows

from smallinit.config import Config
from smallinit.train import AnalysisCallback, Trainer

TARGET = 0.05  # the overhead the callback must stay under at the recipes' cadence


def make_config(args: argparse.Namespace) -> Config:
    return Config.load(
        preset=args.preset,
        overrides=[
            f"data.corpus={args.corpus}",
            f"data.tokenizer={args.tokenizer}",
            f"data.seq_len={args.seq_len}",
            f"train.batch_size={args.batch_size}",
            f"train.steps={args.steps}",
            "train.eval_every=0",
            "train.checkpoint_every=0",
            "train.keep_checkpoints=1",
            f"train.log_every={args.every}",
            f"analysis.every={args.every}",
            f"analysis.snapshots={args.snapshots}",
        ],
    )


def timed_fit(cfg: Config, root: Path, name: str, analysis: bool) -> tuple[float, Trainer]:
    off = dataclasses.replace(cfg, analysis=dataclasses.replace(cfg.analysis, every=0, norm_every=0))
    trainer = Trainer(cfg if analysis else off, root / name, callbacks=[])  # the Trainer attaches the monitor
    t0 = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - t0, trainer


def measure_cost(trainer: Trainer, repeats: int = 5) -> tuple[float, float]:
    """Seconds of one measurement (no snapshot) and of one training step, interleaved, medians."""
    monitor = next(c for c in trainer.callbacks if isinstance(c, AnalysisCallback)).monitor
    monitor.snapshot_steps = set()
    monitor._log = lambda record: None  # keep metrics.jsonl as the run wrote it
    m, s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        monitor.measure(trainer.step)
        m.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer.train_step()
        s.append(time.perf_counter() - t0)
    return statistics.median(m), statistics.median(s)


def run(args: argparse.Namespace) -> list[Row]:
    cfg = make_config(args)
    plain, with_cb = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        timed_fit(cfg, root, "warmup", True)  # token cache, allocator, lazy imports
        last = None
        for r in range(args.rounds):
            order = [("plain", False), ("analysis", True)]
            for name, on in order if r % 2 == 0 else order[::-1]:
                sec, trainer = timed_fit(cfg, root, f"{name}{r}", on)
                (with_cb if on else plain).append(sec)
                if on:
                    last = trainer
        per_measure, per_step = measure_cost(last)
    overhead = paired(with_cb, plain, lambda a, b: a / b - 1)
    target, ok = check(overhead, at_most=TARGET)
    shape = (
        f"{args.preset}, {args.batch_size}×{args.seq_len} tokens/step, {args.steps} steps, every {args.every}"
    )
    return [
        Row("callbacks", f"analysis callback overhead on fit() ({shape})", overhead, "fraction", target, ok),
        Row(
            "callbacks",
            "one measurement, in training steps",
            Stat.of([per_measure / per_step]),
            "steps",
            note=f"{per_measure * 1e3:.1f} ms vs {per_step * 1e3:.1f} ms per step; overhead ≈ this / every",
        ),
        Row("callbacks", "plain fit() seconds", Stat.of(plain), "s"),
    ]


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--preset", default="cpu-1m")
    ap.add_argument("--corpus", default="shakespeare")
    ap.add_argument("--tokenizer", default="default")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40 if quick else 60)
    ap.add_argument("--every", type=int, default=20, help="cadence, as in the recipes (default 20)")
    ap.add_argument("--snapshots", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(ap)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args)
    for r in rows:
        s = r.stat
        print(
            f"{r.name:<80} {s.median:>9.4g} [{s.lo:.3g}, {s.hi:.3g}] {r.unit} {r.target} "
            f"{'' if r.ok is None else ('ok' if r.ok else 'MISSED')} {r.note}"
        )
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
