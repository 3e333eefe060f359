"""Sweep throughput: finished cells per hour, sequential (``jobs=1``) vs packed (``jobs=cores``), same results.

The sweep (default: a small demo-like grid, cpu-1m, γ ∈ {0.5, 1} × 2 seeds; or ``--sweep FILE``) runs
through smallinit's sweep runner, once per layout per round, alternating, each time in a fresh folder with
a shared, pre-built token cache. Results must agree bit for bit between the layouts: every cell's final
model weights are hashed and compared.

    python benchmarks/bench_sweep.py [--rounds 2] [--steps 60] [--sweep FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Row, Stat, main


def demo_like_sweep(steps: int) -> dict[str, Any]:
    return {
        "sweep": {"name": "bench"},
        "base": {
            "model.preset": "cpu-1m",
            "train.steps": steps,
            "train.warmup_steps": min(10, steps),
            "train.eval_every": steps,
            "train.checkpoint_every": steps,
            "train.log_every": 10,
        },
        "grid": {"model.gamma": [0.5, 1.0], "train.seed": [0, 1]},
    }


def weight_hashes(sweep_dir: Path) -> dict[str, str]:
    """sha256 of every model.safetensors under each cell's folder, by relative path."""
    return {
        str(p.relative_to(sweep_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((sweep_dir / "cells").rglob("model.safetensors"))
    }


def run(args: argparse.Namespace) -> list[Row]:
    from smallinit.data import load_token_data, load_tokenizer
    from smallinit.study.running import Sweep, available_cores, default_jobs, resolve_config, run_sweep

    sweep = Sweep.load(args.sweep) if args.sweep else Sweep.from_dict(demo_like_sweep(args.steps))
    cells = sweep.cells()
    configs = [resolve_config(c) for c in cells]
    for name in {(c.data.corpus, c.data.tokenizer, c.data.val_fraction, c.data.text_field) for c in configs}:
        load_token_data(
            name[0], load_tokenizer(name[1]), val_fraction=name[2], text_field=name[3]
        )  # build once
    packed_jobs = min(available_cores(), len(cells))
    layouts = {"sequential": 1, "packed": packed_jobs}
    wall: dict[str, list[float]] = {k: [] for k in layouts}
    hashes: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="smallinit-bench-sweep-") as tmp:
        for r in range(args.rounds):
            for layout, jobs in layouts.items():
                out = Path(tmp) / f"{layout}-{r}"
                t0 = time.perf_counter()
                outcome = run_sweep(sweep, out, jobs=jobs, echo=None)
                wall[layout].append(time.perf_counter() - t0)
                if outcome.exit_code:
                    raise RuntimeError(f"sweep {layout} failed (exit {outcome.exit_code}); see {out}")
                hashes.setdefault(layout, weight_hashes(out))
    same = bool(hashes["sequential"]) and hashes["sequential"] == hashes["packed"]
    n = len(cells)
    per_hour = {k: Stat.of([n * 3600 / w for w in v]) for k, v in wall.items()}
    ratio = Stat.of([s / p for s, p in zip(wall["sequential"], wall["packed"])])
    auto = default_jobs(configs)
    where = f"{sweep.name}: {n} cells"
    return [
        Row("sweep", f"{where}, sequential cells/hour", per_hour["sequential"], "cells/h"),
        Row("sweep", f"{where}, packed ({packed_jobs} jobs) cells/hour", per_hour["packed"], "cells/h"),
        Row(
            "sweep",
            f"{where}: packed / sequential",
            ratio,
            "×",
            "≥ 1.25",
            ratio.median >= 1.25,
            note=f"runner's default jobs here: {auto}",
        ),
        Row(
            "sweep",
            f"{where}: same weights bit for bit",
            Stat.of([float(same)]),
            "bool",
            "= 1",
            same,
            note=f"{len(hashes['sequential'])} checkpoints compared",
        ),
    ]


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--rounds", type=int, default=1 if quick else 2)
    ap.add_argument("--steps", type=int, default=20 if quick else 30, help="training steps per cell")
    ap.add_argument("--sweep", help="a sweep TOML file instead of the built-in demo-like sweep")


if __name__ == "__main__":
    main(__doc__, add_args, run)
