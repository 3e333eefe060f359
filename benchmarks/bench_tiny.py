"""Tiny widths (d = 32, 64, 128; 4 layers, byte tokenizer, batch 16 × 128; and the demo recipe's shape, head_dim 8,
batch 8 × 256, at d = 16 and 32): eager vs the default (compiled).

Rows, all from one run:
  step      tokens/s of a full training step, eager vs ``train.compile`` as "auto" resolves it for a study-length
            run (per block, through ``smallinit.train.distributed.parallelize``), interleaved rounds; each arm's
            model FLOPs rate as a fraction of one 512² fp32 ``torch.mm`` timed as one more contestant; the whole
            model compiled as one graph, for reference (not the default: longer to compile, and not deterministic
            with more than one thread)
  ceiling   the share of an eager step's CPU time spent in the matmul and attention kernels (torch.profiler),
            which no fusion of the rest changes: 1 / share bounds what compiling (or any fusion) can gain
  compile   seconds to compile, in a fresh process as a sweep cell pays them: with an empty Inductor cache
            (cold), then again on that cache (warm); = the first two compiled steps minus two steady ones
  sweep     cells per hour of a small sweep at 20 tokens per non-embedding parameter through the sweep runner,
            end to end (start-up, compiling, evaluation, checkpoints), packing on in every arm: eager
            (``train.compile=false``), the default on an empty compile cache, the default on a warm one

    python benchmarks/bench_tiny.py --threads 1 --clock cpu [--widths 32 64 128] [--demo-widths 16 32] [--sweep-width 64]

"auto" compiles where the rule in ``smallinit.train.compiling`` says it pays; the step rows compare eager with
the compiled step it then runs, and say what "auto" picks for one study-length cell.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_train import train_step
from common import (
    CLOCKS,
    Row,
    Stat,
    add_common_args,
    check,
    interleaved,
    main,
    matmul_case,
    paired,
    train_flops_per_token,
)

from smallinit import Config, Transformer
from smallinit.config import TrainConfig
from smallinit.data.tokenizer import bytes_tokenizer
from smallinit.train import compiling
from smallinit.train.distributed import Runtime, parallelize

VOCAB_BYTES = bytes_tokenizer().vocab_size


def shape(d: int, demo: bool = False) -> dict[str, object]:
    """4 layers of width d, d_ff = 3d, byte tokenizer: head_dim 16 and 16 × 128 tokens per step, or with ``demo``
    the demo recipe's head_dim 8 and 8 × 256 (its scales train d = 16, 24, 32)."""
    head_dim, seq, batch = (8, 256, 8) if demo else (16, 128, 16)
    return {
        "model.d_model": d,
        "model.n_layers": 4,
        "model.n_heads": d // head_dim,
        "model.n_kv_heads": d // head_dim,
        "model.d_ff": 3 * d,
        "data.tokenizer": "bytes",
        "data.seq_len": seq,
        "train.batch_size": batch,
    }


def tiny(d: int, demo: bool = False, **train: object) -> Config:
    keys = {**shape(d, demo), **{f"train.{k}": v for k, v in train.items()}}
    cfg = Config.load(overrides=[f"{k}={json.dumps(v)}" for k, v in keys.items()])
    cfg.model.vocab_size = VOCAB_BYTES
    return cfg.validate()


def steps_for(d: int, demo: bool = False, tokens_per_param: float = 20.0) -> int:
    cfg = tiny(d, demo)
    nonembed = Transformer.count_params(cfg.model)[1]
    return math.ceil(
        tokens_per_param * nonembed / (cfg.train.batch_size * cfg.data.seq_len)
    )  # as recipes' budgets


def step_case(cfg: Config, compiled: bool | str):
    """``compiled``: False (eager), True (per block, as the trainer compiles) or "whole" (one graph)."""
    model = Transformer(cfg.model, seed=0)
    if compiled is True:
        parallelize(model, Runtime.local("cpu"), TrainConfig(compile=True))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB_BYTES, (cfg.train.batch_size, cfg.data.seq_len + 1), generator=gen)
    runs = torch.compile(model) if compiled == "whole" else model
    step = train_step(
        model, lambda _, x, y: runs(x, y).loss, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    )
    return model, step


KERNELS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::_scaled_dot_product_flash_attention")


def kernel_share(call, steps: int = 5) -> float:
    """The fraction of ``steps`` eager steps' self CPU time spent in matmul and attention kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            call()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return sum(e.self_cpu_time_total for e in events if e.key.startswith(KERNELS)) / total


def step_rows(args: argparse.Namespace) -> list[Row]:
    mm, mm_flops = matmul_case(512)
    shapes = [(f"d={d}", d, False) for d in args.widths] + [
        (f"demo d={d}", d, True) for d in args.demo_widths
    ]
    cases, flops = {"matmul": mm}, {}
    for name, d, demo in shapes:
        cfg = tiny(d, demo)
        for arm, compiled in (("eager", False), ("compiled", True), ("whole", "whole")):
            model, call = step_case(cfg, compiled)
            call()
            call()  # compiles (once per shape: the cache of an earlier run makes this fast)
            cases[f"{name} {arm}"] = call
            flops[f"{name} {arm}"] = (
                train_flops_per_token(model, cfg.data.seq_len) * cfg.train.batch_size * cfg.data.seq_len
            )
    t = interleaved(cases, rounds=args.rounds, warmup=1, inner=args.inner, clock=args.clock)
    rate = [mm_flops / s for s in t["matmul"]]
    rows = [
        Row(
            "tiny",
            "one thread's fp32 matmul rate (512² torch.mm)",
            Stat.of([r / 1e9 for r in rate]),
            "GFLOP/s",
        )
    ]
    for name, d, demo in shapes:
        e, c, w = t[f"{name} eager"], t[f"{name} compiled"], t[f"{name} whole"]
        share = kernel_share(cases[f"{name} eager"])
        cell = tiny(d, demo, steps=steps_for(d, demo))
        auto = {warm: compiling.compile_pays([cell], warm=warm) for warm in (False, True)}
        speedup, ceiling = paired(e, c), Stat.of([1 / share])
        per_step = cell.train.batch_size * cell.data.seq_len
        goal = d in (32, 64)  # the widths the ≥ 1.4× goal names
        rows += [
            Row("tiny", f"{name}: eager tokens/s", Stat.of([per_step / s for s in e]), "tokens/s"),
            Row(
                "tiny",
                f"{name}: compiled / eager tokens/s",
                speedup,
                "×",
                *(check(speedup, at_least=1.4) if goal else ("", None)),
                note=f'"auto" compiles one {cell.train.steps}-step cell: cold {auto[False]}, warm {auto[True]}',
            ),
            Row(
                "tiny",
                f"{name}: eager, share of the matmul rate",
                Stat.of([flops[f"{name} eager"] / s / r for s, r in zip(e, rate)]),
                "",
            ),
            Row(
                "tiny",
                f"{name}: compiled, share of the matmul rate",
                Stat.of([flops[f"{name} compiled"] / s / r for s, r in zip(c, rate)]),
                "",
            ),
            Row("tiny", f"{name}: whole model compiled / eager tokens/s (reference)", paired(e, w), "×"),
            Row("tiny", f"{name}: eager step's CPU time in matmul + attention kernels", Stat.of([share]), ""),
            Row(
                "tiny",
                f"{name}: ceiling of any fusion = 1 / that share",
                ceiling,
                "×",
                *(check(ceiling, at_least=1.4) if goal else ("", None)),
                note="no compile or fusion of the other work can pass it",
            ),
        ]
    return rows


def compile_worker(d: int) -> None:
    """In a fresh process: seconds the first two compiled steps take beyond two steady ones."""
    cfg = tiny(d)
    _, call = step_case(cfg, True)
    now = CLOCKS["wall"]
    t0 = now()
    call()
    call()
    first = now() - t0
    steady = []
    for _ in range(3):
        t0 = now()
        call()
        steady.append(now() - t0)
    print(json.dumps({"compile_s": first - 2 * sorted(steady)[1]}))


def compile_rows(args: argparse.Namespace) -> list[Row]:
    rows = []
    for d in args.widths:
        with tempfile.TemporaryDirectory(prefix="smallinit-bench-inductor-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
            got = []
            for _ in ("cold", "warm"):
                out = subprocess.run(
                    [sys.executable, __file__, "--compile-worker", str(d)],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=env,
                )
                got.append(json.loads(out.stdout.strip().splitlines()[-1])["compile_s"])
        rows += [
            Row("tiny", f"d={d}: compile time, empty cache (cold)", Stat.of([got[0]]), "s"),
            Row("tiny", f"d={d}: compile time, warm cache", Stat.of([got[1]]), "s"),
        ]
    return rows


def sweep_rows(args: argparse.Namespace) -> list[Row]:
    from smallinit.study.running import Sweep, run_sweep

    d = args.sweep_width
    steps = steps_for(d)
    base = {
        **shape(d),
        "train.steps": steps,
        "train.warmup_steps": steps // 10,
        "train.eval_every": steps // 4,
        "train.checkpoint_every": steps,
        "train.log_every": 50,
    }
    grid = {"model.gamma": [0.5, 1.0], "train.seed": list(range(args.sweep_seeds))}
    arms = {"eager": False, "default-cold": "auto", "default-warm": "auto"}
    wall: dict[str, float] = {}

    with tempfile.TemporaryDirectory(prefix="smallinit-bench-tiny-") as tmp:
        cache = Path(tmp) / "inductor"
        old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # the runner passes it to its cells
        try:
            for arm, choice in arms.items():
                sweep = Sweep.from_dict(
                    {
                        "sweep": {"name": f"tiny-{arm}"},
                        "base": {**base, "train.compile": choice},
                        "grid": grid,
                    }
                )
                t0 = time.perf_counter()
                outcome = run_sweep(sweep, Path(tmp) / arm, echo=None)
                wall[arm] = time.perf_counter() - t0
                if outcome.exit_code:
                    raise RuntimeError(f"sweep {arm} failed (exit {outcome.exit_code})")
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    n = len(grid["model.gamma"]) * len(grid["train.seed"])
    where = f"sweep of {n} cells, d={d}, {steps} steps (20 tokens/non-embedding param)"
    rows = [
        Row("tiny", f"{where}: {arm} cells/hour", Stat.of([n * 3600 / w]), "cells/h")
        for arm, w in wall.items()
    ]
    for arm in ("default-cold", "default-warm"):
        ratio = wall["eager"] / wall[arm]
        rows.append(
            Row(
                "tiny",
                f"{where}: {arm} / eager cells/hour",
                Stat.of([ratio]),
                "×",
                *check(Stat.of([ratio]), at_least=1.25),
            )
        )
    return rows


def run(args: argparse.Namespace) -> list[Row]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # how packed sweep cells run
    try:
        return step_rows(args) + compile_rows(args) + ([] if args.no_sweep else sweep_rows(args))
    finally:
        torch.set_num_threads(threads)


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--widths", nargs="+", type=int, default=[32, 64] if quick else [32, 64, 128])
    ap.add_argument(
        "--demo-widths",
        nargs="*",
        type=int,
        default=[] if quick else [16, 32],
        help="widths measured at the demo recipe's shape too (head_dim 8, 8 × 256)",
    )
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)
    ap.add_argument("--inner", type=int, default=3, help="steps per sample")
    ap.add_argument("--sweep-width", type=int, default=32 if quick else 64)
    ap.add_argument("--sweep-seeds", type=int, default=2)
    ap.add_argument("--no-sweep", action="store_true", help="skip the sweep rows")
    add_common_args(ap)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--compile-worker":
        torch.set_num_threads(1)
        compile_worker(int(sys.argv[2]))
        sys.exit(0)
    main(__doc__, add_args, run)
