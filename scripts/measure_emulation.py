#!/usr/bin/env python3
"""Measure how long the demo's emulated-ε baseline stays saturated, beside the paper-scale formula.

Trains the first part of runs of the `demo` recipe's `scaling` sweep, arm `baseline` (ε emulated for
d = 2048 with model.norm_eps_width), with the recipe's own settings and schedule for the chosen scale,
measuring the RMSNorm factors every --norm-every steps, for --prefix of the run's steps (default: all;
after a shorter prefix every norm is taken to stay as its last measurement says, which the printed
`min factor after half the prefix` lets one check). Prints, per width, γ and seed, the share of training with the factor
below 0.5 (mean over the norms, and the norm that reads the embedding), the formula's steps at Adam
growth rate 1, the run's own rate, and the paper-scale share (smallinit.study.judging.emulation).

    nice -n 10 python scripts/measure_emulation.py --scale cpu-long --out /tmp/emulation
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from smallinit.analysis import AnalysisCallback
from smallinit.analysis.saturation import SATURATED, steps_to_unsaturate
from smallinit.monitor.runs import Run
from smallinit.study.judging.emulation import emulation, paper_scale_config, paper_scale_share
from smallinit.study.planning.recipes import apply_budget, load_recipe
from smallinit.study.running import resolve_config
from smallinit.train import Trainer


def measure(cell, out: Path, prefix: float, norm_every: int) -> dict:
    cfg = resolve_config(cell, {})
    cfg.analysis.every, cfg.analysis.norm_every = 0, norm_every
    cfg.train.compile, cfg.train.threads = False, 1
    stop = min(cfg.train.steps, math.ceil(prefix * cfg.train.steps))
    run_dir = out / cell.id
    t0 = time.perf_counter()
    if not (run_dir / "done").is_file():
        cb = AnalysisCallback(cfg.analysis)
        trainer = Trainer(cfg, run_dir, callbacks=[cb])
        cb.on_train_start(trainer)
        while trainer.step < stop:
            cb.on_step_end(trainer, trainer.train_step())
        (run_dir / "done").write_text(str(stop))
    records = Run.load(run_dir).records("norm_factor")
    e = emulation(cfg, records)
    late = [min(r["norm_factor"].values()) for r in records if r["step"] >= stop // 2]
    return {
        "cell": cell.id,
        "d": cfg.model.d_model,
        "gamma": cfg.model.gamma,
        "seed": cfg.train.seed,
        "eps": cfg.model.effective_norm_eps,
        "steps": cfg.train.steps,
        "warmup": cfg.train.warmup_steps,
        "trained": stop,
        "wall_s": time.perf_counter() - t0,
        "mean": e.measured.to_dict(),
        "first": e.first.to_dict(),
        "rate": e.rate,
        "paper": e.paper,
        "far": e.far,
        "formula_steps": steps_to_unsaturate(cfg),
        "min_factor_after_half": min(late),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="cpu-long")
    ap.add_argument("--sizes", nargs="+", default=["d16", "d24", "d32"])
    ap.add_argument("--gammas", nargs="+", type=float, default=[0.5, 1.0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--prefix", type=float, default=1.0, help="share of each run's steps to train")
    ap.add_argument("--norm-every", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    scale = apply_budget(load_recipe("demo").scale(args.scale), {})
    cells = [
        c
        for c in scale.sweeps["scaling"].cells()
        if c.arm == "baseline"
        and c.size in args.sizes
        and c.values["model.gamma"] in args.gammas
        and c.values["train.seed"] in args.seeds
    ]
    paper = paper_scale_config()
    print(
        f"paper scale (paper-fig1 gpu): d {paper.model.d_model}, γ 1, ε 1e-5, lr {paper.train.lr:g}, "
        f"{paper.train.steps} steps, warmup {paper.train.warmup_steps}: the embedding's norm leaves saturation "
        f"(factor {SATURATED}) after {steps_to_unsaturate(paper):.0f} steps at Adam growth rate 1 "
        f"({100 * paper_scale_share(1.0):.2f} % of training)",
        flush=True,
    )
    table = args.out / "emulation.json"
    rows = {
        r["cell"]: r for r in (json.loads(table.read_text()) if table.is_file() else [])
    }  # earlier calls' too
    for cell in cells:
        row = measure(cell, args.out, args.prefix, args.norm_every)
        rows[row["cell"]] = row
        print(
            f"{row['cell']}: T {row['steps']}, trained {row['trained']} in {row['wall_s']:.0f} s; saturated share "
            f"mean [{100 * row['mean']['lo']:.2f}, {100 * row['mean']['hi']:.2f}] %, first norm "
            f"[{100 * row['first']['lo']:.2f}, {100 * row['first']['hi']:.2f}] %; formula (rate 1) "
            f"{row['formula_steps']:.1f} steps; rate {row['rate']}; paper scale {[round(100 * p, 3) for p in row['paper']]} %;"
            f" far {row['far']}; min factor after half the prefix {row['min_factor_after_half']:.3f}",
            flush=True,
        )
        table.write_text(json.dumps(list(rows.values()), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
