"""Shared tools of the benchmarks: interleaved timing, robust summaries, FLOPs, the fp32 matmul rate.

Every benchmark compares contestants measured in the same process run, interleaved round by round
(round r runs each contestant once, the order rotating), so drifting machine load hits all of them alike.
A ratio is computed within each round (paired) and summarised by its median, with the min and max over
rounds as the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from smallinit.train.flops import train_flops_per_token  # noqa: F401  (the benchmarks measure MFU against it)

ROOT = Path(__file__).resolve().parent.parent


def process_setup(threads: int = 0) -> None:
    """What ``smallinit`` CLI processes get: huge-page-backed large tensors (read by PyTorch at its first
    allocation of >= 2 MB, so call this before any) and, if given, the torch thread count."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if threads:
        torch.set_num_threads(threads)


@dataclass
class Stat:
    """Median of per-round values, with their min and max as the spread."""

    median: float
    lo: float
    hi: float
    n: int

    @staticmethod
    def of(values: list[float]) -> Stat:
        return Stat(statistics.median(values), min(values), max(values), len(values))


@dataclass
class Row:
    """One line of the results table; ``ok`` is None where no target applies."""

    bench: str
    name: str
    stat: Stat
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "name": self.name,
            "median": self.stat.median,
            "min": self.stat.lo,
            "max": self.stat.hi,
            "n": self.stat.n,
            "unit": self.unit,
            "target": self.target,
            "ok": self.ok,
            "note": self.note,
            **self.extra,
        }


def check(stat: Stat, at_least: float | None = None, at_most: float | None = None) -> tuple[str, bool]:
    """(target text, whether the median meets it)."""
    if at_least is not None:
        return f"≥ {at_least:g}", stat.median >= at_least
    assert at_most is not None
    return f"≤ {at_most:g}", stat.median <= at_most


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved(
    cases: dict[str, Callable[[], Any]], *, rounds: int, warmup: int = 1, inner: int = 1, clock: str = "wall"
) -> dict[str, list[float]]:
    """Seconds per call of each case: ``rounds`` samples each, a sample being the mean of ``inner`` calls.

    Every case is first called ``warmup`` times (allocator, optimizer state, lazy initialisation). Round r
    starts at case r mod n, so no case always runs right after the same neighbour. ``clock="cpu"`` counts
    this process's CPU seconds (all threads, kernel time included) instead of wall time: on a crowded
    machine a single-threaded comparison then ignores the time spent waiting for a core.
    """
    now = CLOCKS[clock]
    names = list(cases)
    for name in names:
        for _ in range(warmup):
            cases[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = now()
            for _ in range(inner):
                cases[name]()
            samples[name].append((now() - t0) / inner)
    return samples


def paired(a: list[float], b: list[float], fn: Callable[[float, float], float] = lambda x, y: x / y) -> Stat:
    """``fn(a[r], b[r])`` per round, summarised."""
    return Stat.of([fn(x, y) for x, y in zip(a, b, strict=True)])


def matmul_case(n: int = 2048) -> tuple[Callable[[], None], float]:
    """A call that multiplies two n×n fp32 matrices into a preallocated output, and its FLOPs (2n³).

    Timed as one more contestant, it gives the machine's fp32 matmul rate under the same load.
    """
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    out = torch.empty(n, n)

    def call() -> None:
        torch.mm(a, b, out=out)

    return call, 2.0 * n**3


def machine() -> dict[str, Any]:
    import platform

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def format_table(rows: list[Row]) -> str:
    lines = [f"{'benchmark':<9} {'measurement':<72} {'median':>10} {'[min, max]':>21} {'n':>2}  target"]
    for r in rows:
        s = r.stat
        mark = "" if r.ok is None else ("ok" if r.ok else "MISSED")
        spread = f"[{s.lo:.3g}, {s.hi:.3g}]" if s.n > 1 else ""
        lines.append(
            f"{r.bench:<9} {r.name[:72]:<72} {s.median:>10.4g} {spread:>21} {s.n:>2}  "
            f"{r.target} {mark}".rstrip()
            + (f"   ({r.note})" if r.note else "")
        )
    return "\n".join(lines)


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall (default) or cpu: CPU seconds of this process, for single-threaded comparisons "
        "on a crowded machine (in-process timings only)",
    )


def main(doc: str, add_args: Callable, run: Callable) -> None:
    """A benchmark script's command line: its arguments, ``--threads`` and ``--json``; prints the table."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_args(ap)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", help="write the rows and the machine description here")
    args = ap.parse_args()
    process_setup(args.threads)
    rows = run(args)
    print(format_table(rows))
    if args.json:
        write_rows(args.json, rows)


def write_rows(path: str, rows: list[Row]) -> None:
    """The rows and the machine that measured them, as JSON (a benchmark's ``--json``)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"machine": machine(), "rows": [r.to_dict() for r in rows]}, f, indent=1)
