"""GPU throughput and MFU of the paper-size presets: bf16 autocast, SDPA, torch.compile, one GPU.

Not part of ``benchmarks/run.py`` (no GPU in CI). Per preset: a full training step (forward, loss, backward,
gradient clipping, fused AdamW) on random tokens, fp32 master weights under bf16 autocast, each block
compiled as the trainer compiles it; tokens/s over ``--steps`` timed steps after warm-up, and
MFU = model FLOPs per token (benchmarks/common.py: 6·N_matmul + causal attention) × tokens/s ÷ peak.
Peak: the dense bf16 rate from the table below for known GPUs, else (and always reported) a measured
8192³ bf16 matmul rate. Targets on an H100/H200: MFU ≥ 45 % at 0.1b, ≥ 50 % at 1.5b.

    python benchmarks/gpu.py [--presets 0.1b 1.5b] [--no-compile] [--json gpu.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from common import train_flops_per_token

from smallinit import ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.train.distributed import Runtime, parallelize
from smallinit.train.optim import build_optimizer

PEAK_BF16_DENSE = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12}
TARGETS = {"0.1b": 0.45, "1.5b": 0.50}
BATCH = {"0.1b": (16, 2048), "1.5b": (8, 2048)}  # sequences × tokens per step


def table_peak(name: str) -> float | None:
    return next((v for k, v in PEAK_BF16_DENSE.items() if k in name), None)


def measured_peak(n: int = 8192, reps: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def bench(preset: str, *, compile: bool, warmup: int, steps: int) -> dict:
    batch, seq = BATCH[preset]
    cfg = ModelConfig.preset(preset)
    model = Transformer(cfg, seed=0).cuda()  # drawn on the CPU from the seed, as the trainer does
    tc = TrainConfig(compile=compile)
    parallelize(model, Runtime.local("cuda"), tc, torch.bfloat16)
    opt = build_optimizer(model, tc)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device="cuda")
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / steps
    fpt = train_flops_per_token(model, seq)
    return {"preset": preset, "compile": compile, "batch": batch, "seq": seq, "params": model.num_params(),
            "tokens_per_s": batch * seq / step_s, "step_s": step_s, "flops_per_token": fpt,
            "model_tflops": fpt * batch * seq / step_s / 1e12, "warmup_s": warm_s,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["0.1b", "1.5b"])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU")
    name = torch.cuda.get_device_name()
    measured = measured_peak()
    peak = table_peak(name) or measured
    print(f"{name}: peak bf16 {peak / 1e12:.0f} TFLOP/s ({'table' if table_peak(name) else 'measured'}); "
          f"measured 8192³ matmul {measured / 1e12:.0f} TFLOP/s")
    results = []
    for preset in args.presets:
        r = bench(preset, compile=not args.no_compile, warmup=args.warmup, steps=args.steps)
        r["mfu"] = r["model_tflops"] * 1e12 / peak
        r["target"] = TARGETS.get(preset)
        results.append(r)
        verdict = "" if r["target"] is None else ("meets" if r["mfu"] >= r["target"] else "misses") + \
            f" the {r['target']:.0%} target"
        print(f"{preset}: {r['tokens_per_s']:,.0f} tokens/s, {r['model_tflops']:.0f} TFLOP/s, MFU {r['mfu']:.1%} "
              f"{verdict}; warm-up {r['warmup_s']:.0f} s; peak memory {r['peak_mem_gib']:.1f} GiB")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": name, "peak_flops": peak, "measured_peak_flops": measured, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
