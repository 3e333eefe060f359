"""The GPU check, one prepared script for a lent GPU machine (under 10 minutes on 8 × H100/H200):

1. MFU on one GPU at 0.1b and 1.5b: a full training step (forward, loss, backward, gradient clipping, fused
   AdamW) on random tokens, fp32 master weights under bf16 autocast, each block compiled as the trainer compiles
   it, and 0.1b eager beside it (what compiling buys); tokens/s over ``--steps`` timed steps after warm-up, and
   MFU = model FLOPs per token (smallinit.train.flops: 6·N_matmul + causal attention) × tokens/s ÷ peak. Peak:
   the dense bf16 rate of known GPUs (smallinit.study.planning.plan.GPUS), else (and always reported) a measured
   8192³ bf16 matmul rate. Targets on an H100/H200: MFU ≥ 45 % at 0.1b, ≥ 50 % at 1.5b.
2. bf16 against fp32: the same small model trained 20 steps by the Trainer in each precision on one GPU; the
   largest differences of the training and validation losses.
3. 1 → N GPUs (N ≥ 2 visible): ``torchrun`` of benchmarks/gpu_parity.py — DDP and FSDP2 against one GPU in fp32
   (losses and final weights), then bf16 throughput and peak memory against the estimate.

Everything goes to OUT/gpu.json (and OUT/gpu-parity/gpu_parity.json) and a summary is printed. Nothing is
asserted: it reports numbers. ``--dry-run`` runs steps 1 and 2 on the CPU with a tiny preset (no compile, no
torchrun), to check the script itself where no GPU is.

    python benchmarks/gpu.py [--out gpu-check] [--presets 0.1b 1.5b] [--no-compile] [--skip-parity] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from smallinit import Config, ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.study.planning.plan import CPU_CORE_FLOPS, GPUS
from smallinit.train import Trainer
from smallinit.train.distributed import Runtime, parallelize
from smallinit.train.flops import train_flops_per_token
from smallinit.train.optim import build_optimizer

TARGETS = {"0.1b": 0.45, "1.5b": 0.50}
BATCH = {"0.1b": (16, 2048), "1.5b": (8, 2048), "cpu-1m": (4, 128)}  # sequences × tokens per step
PARITY = [  # the precision check's model: small, the byte tokenizer, 20 steps
    "model.d_model=256",
    "model.n_layers=4",
    "model.n_heads=4",
    "model.n_kv_heads=4",
    "model.d_ff=768",
    "data.tokenizer=bytes",
    "data.corpus=shakespeare",
    "data.seq_len=256",
    "train.batch_size=16",
    "train.steps=20",
    "train.warmup_steps=5",
    "train.log_every=1",
    "train.eval_every=10",
    "train.eval_batches=4",
    "train.checkpoint_every=0",
    "train.parallel=none",
]


def table_peak(name: str) -> float | None:
    """The dense bf16 peak of a GPU named like ``name`` ("NVIDIA H100 80GB HBM3" → h100)."""
    low = name.lower().replace(" ", "")
    return next(
        (peak for kind, (peak, _) in sorted(GPUS.items(), key=lambda kv: -len(kv[0])) if kind in low), None
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measured_peak(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def bench(preset: str, device: torch.device, *, compile: bool, warmup: int, steps: int) -> dict:
    batch, seq = BATCH[preset]
    cfg = ModelConfig.preset(preset)
    model = Transformer(cfg, seed=0).to(device)  # drawn on the CPU from the seed, as the trainer does
    tc = TrainConfig(compile=compile)
    parallelize(model, Runtime(device), tc, torch.bfloat16)
    opt = build_optimizer(model, tc)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    synchronize(device)
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    step_s = (time.perf_counter() - t0) / steps
    fpt = train_flops_per_token(model, seq)
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return {
        "preset": preset,
        "compile": compile,
        "batch": batch,
        "seq": seq,
        "params": model.num_params(),
        "tokens_per_s": batch * seq / step_s,
        "step_s": step_s,
        "flops_per_token": fpt,
        "model_tflops": fpt * batch * seq / step_s / 1e12,
        "warmup_s": warm_s,
        "peak_mem_gib": peak_mem,
    }


def precision_parity(out: Path, device: torch.device, steps: int) -> dict:
    """The same run in fp32 and in bf16 on one device: the largest loss differences along training."""
    curves = {}
    for precision in ("fp32", "bf16"):
        run = out / f"precision-{precision}"
        shutil.rmtree(run, ignore_errors=True)
        sets = [
            *PARITY,
            f"train.steps={steps}",
            f"train.warmup_steps={min(5, steps - 1)}",
            f"train.precision={precision}",
            f"train.device={device.type}",
        ]
        Trainer(Config.load(overrides=sets), run, callbacks=[], runtime=Runtime(device)).fit()
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        curves[precision] = {key: [r[key] for r in rows if key in r] for key in ("loss", "val_loss")}
        shutil.rmtree(run, ignore_errors=True)
    result = {}
    for key in ("loss", "val_loss"):
        pairs = list(zip(curves["fp32"][key], curves["bf16"][key]))
        result[f"{key}_max_abs_diff"] = max(abs(a - b) for a, b in pairs)
        result[f"{key}_max_rel_diff"] = max(abs(a - b) / abs(a) for a, b in pairs)
    result["final_loss_fp32_bf16"] = [curves["fp32"]["loss"][-1], curves["bf16"]["loss"][-1]]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu-check")
    ap.add_argument("--presets", nargs="+", default=["0.1b", "1.5b"])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip-parity", action="store_true", help="skip the 1 → N GPU torchrun check")
    ap.add_argument("--dry-run", action="store_true", help="steps 1 and 2 on the CPU with a tiny preset")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        device, presets, compile, steps = torch.device("cpu"), ["cpu-1m"], False, 2
        name, measured = "cpu (dry run)", measured_peak(device, n=512, reps=5)
        peak = CPU_CORE_FLOPS * torch.get_num_threads()
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU (or --dry-run on the CPU)")
    else:
        device, presets, compile, steps = torch.device("cuda"), args.presets, not args.no_compile, args.steps
        name, measured = torch.cuda.get_device_name(), measured_peak(torch.device("cuda"))
        peak = table_peak(name) or measured
    print(
        f"{name}: peak {peak / 1e12:.3g} TFLOP/s ({'table' if table_peak(name) else 'measured or CPU'}); "
        f"measured matmul {measured / 1e12:.3g} TFLOP/s",
        flush=True,
    )
    report: dict = {
        "device": name,
        "peak_flops": peak,
        "measured_peak_flops": measured,
        "torch": torch.__version__,
        "mfu": [],
        "dry_run": args.dry_run,
    }
    variants = [(p, compile) for p in presets] + ([(presets[0], False)] if compile else [])
    for preset, compiled in variants:
        r = bench(
            preset, device, compile=compiled, warmup=args.warmup if not args.dry_run else 1, steps=steps
        )
        r["mfu"] = r["model_tflops"] * 1e12 / peak
        r["target"] = TARGETS.get(preset) if compiled else None
        report["mfu"].append(r)
        verdict = (
            ""
            if r["target"] is None
            else ("meets" if r["mfu"] >= r["target"] else "misses") + f" the {r['target']:.0%} target"
        )
        print(
            f"{preset}{' compiled' if compiled else ' eager'}: {r['tokens_per_s']:,.0f} tokens/s, "
            f"{r['model_tflops']:.3g} TFLOP/s, MFU {r['mfu']:.1%} {verdict}; warm-up {r['warmup_s']:.0f} s; "
            f"peak memory {r['peak_mem_gib']:.1f} GiB",
            flush=True,
        )
    report["precision_parity"] = precision_parity(out, device, 4 if args.dry_run else 20)
    print("bf16 vs fp32:", json.dumps(report["precision_parity"]), flush=True)
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if gpus >= 2 and not args.skip_parity:
        cmd = [
            "torchrun",
            "--standalone",
            f"--nproc_per_node={gpus}",
            str(Path(__file__).parent / "gpu_parity.py"),
            "--out",
            str(out / "gpu-parity"),
            "--preset",
            "0.1b",
            "--steps",
            "20",
        ]
        print("1 → N GPUs:", " ".join(cmd), flush=True)
        report["parity_returncode"] = subprocess.run(cmd, check=False).returncode
    (out / "gpu.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'gpu.json'}")


if __name__ == "__main__":
    sys.exit(main())
