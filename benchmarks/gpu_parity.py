"""NCCL parity and throughput on GPUs: DDP and FSDP2 against one GPU, tokens/s, peak memory vs the estimate.

Run on one node with N GPUs (N ≥ 2):

    torchrun --standalone --nproc_per_node N benchmarks/gpu_parity.py [--out gpu-parity] [--preset 0.1b]

1. Parity (fp32, a small model, the same global batch): rank 0 trains alone on its GPU, then all N ranks
   train with train.parallel=ddp and then fsdp; the per-step training losses, the validation losses and
   the final weights are compared with the single-GPU run (per record, and the largest difference over
   the first 10 steps: later, the chaotic growth of any difference dominates).
2. Throughput (bf16, ``--preset``, ``--seq-len`` tokens, ``--micro-batch`` sequences per GPU): ddp, fsdp,
   and fsdp with activation checkpointing (and ``--compile`` adds compiled variants); tokens/s over the
   steps after the first log interval, and each rank's peak allocated memory next to
   ``smallinit.train.memory.estimate_memory`` for the same layout.

Writes OUT/gpu_parity.json and prints a table (rank 0). Run folders go to OUT/runs/ (deleted at the end
unless --keep). Nothing here is asserted: it reports numbers.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from smallinit import Config
from smallinit.train import Trainer
from smallinit.train import checkpoint as ckpt
from smallinit.train.distributed import Runtime, shutdown
from smallinit.train.memory import GIB, estimate_memory

PARITY = [
    "model.d_model=256",
    "model.n_layers=4",
    "model.n_heads=4",
    "model.n_kv_heads=4",
    "model.d_ff=768",
    "data.tokenizer=bytes",
    "data.corpus=shakespeare",
    "data.seq_len=256",
    "train.precision=fp32",
    "train.steps=20",
    "train.warmup_steps=5",
    "train.log_every=1",
    "train.eval_every=10",
    "train.eval_batches=4",
    "train.checkpoint_every=0",
]


EARLY = 10  # steps compared as parity


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_tensors(run: Path) -> dict[str, torch.Tensor]:
    model, optim = ckpt.read_tensors(ckpt.newest_checkpoint(run))  # whole, or a distributed run's shards
    return {**model, **optim}


def compare(ref: Path, other: Path) -> dict:
    a, b = metrics(ref), metrics(other)
    out = {}
    for key in ("loss", "val_loss"):  # parity over the first EARLY steps; later, chaotic divergence grows
        x = [r[key] for r in a if key in r]
        y = [r[key] for r in b if key in r]
        diffs = [abs(p - q) for p, q in zip(x, y)]
        out[f"{key}_abs_diff_per_record"] = diffs
        early = [d for r, d in zip((r for r in a if key in r), diffs) if r["step"] <= EARLY]
        out[f"{key}_max_abs_diff_first_{EARLY}"] = max(early, default=float("nan"))
        out[f"{key}_max_rel_diff_first_{EARLY}"] = max(
            (d / abs(p) for d, p in zip(early, x)), default=float("nan")
        )
    ta, tb = final_tensors(ref), final_tensors(other)
    out["weights_max_abs_diff"] = max((ta[k].float() - tb[k].float()).abs().max().item() for k in ta)
    return out


def train(sets: list[str], run: Path, runtime: Runtime | None = None) -> Trainer:
    trainer = Trainer(Config.load(overrides=sets), run, callbacks=[], runtime=runtime)
    trainer.fit()
    return trainer


def parity(rt: Runtime, root: Path, batch: int) -> dict:
    sets = [*PARITY, f"train.batch_size={batch}"]
    if rt.is_main:  # the reference: one GPU, no process group involved
        train([*sets, "train.parallel=none"], root / "single", Runtime(rt.device))
    dist.barrier()
    results = {}
    for layout in ("ddp", "fsdp"):
        train([*sets, f"train.parallel={layout}"], root / layout)
        if rt.is_main:
            results[layout] = compare(root / "single", root / layout)
    return results


def throughput(rt: Runtime, root: Path, args: argparse.Namespace) -> list[dict]:
    batch = args.micro_batch * rt.world_size
    base = [
        f"model.preset={args.preset}",
        f"data.seq_len={args.seq_len}",
        f"train.batch_size={batch}",
        f"train.steps={args.steps}",
        "train.warmup_steps=2",
        f"train.log_every={args.log_every}",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "train.precision=bf16",
    ]
    variants = [("ddp", False, False), ("fsdp", False, False), ("fsdp", True, False)]
    if args.compile:
        variants += [("ddp", False, True), ("fsdp", True, True)]
    rows = []
    for layout, ac, compiled in variants:
        name = f"{layout}{'+ac' if ac else ''}{'+compile' if compiled else ''}"
        gc.collect()  # the previous row's model and optimizer hold reference cycles: free them before counting
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(rt.device)
        sets = [
            *base,
            f"train.parallel={layout}",
            f"train.activation_checkpointing={str(ac).lower()}",
            f"train.compile={str(compiled).lower()}",
        ]
        trainer = train(sets, root / name)
        peak = torch.tensor(
            [torch.cuda.max_memory_allocated(rt.device)], device=rt.device, dtype=torch.float64
        )
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        if rt.is_main:
            speeds = [
                r["tokens_per_s"]
                for r in metrics(root / name)
                if "tokens_per_s" in r and r["step"] > args.log_every and math.isfinite(r["tokens_per_s"])
            ]
            est = estimate_memory(
                trainer.cfg.model,
                micro_batch=args.micro_batch,
                seq_len=args.seq_len,
                world_size=rt.world_size,
                parallel=layout,
                precision="bf16",
                activation_checkpointing=ac,
            )
            rows.append(
                {
                    "layout": name,
                    "params": est.params,
                    "tokens_per_s": sum(speeds) / len(speeds) if speeds else float("nan"),
                    "tokens_per_s_per_gpu": (sum(speeds) / len(speeds) / rt.world_size)
                    if speeds
                    else float("nan"),
                    "peak_gib_max_rank": peak.item() / GIB,
                    "estimate_gib": est.total / GIB,
                }
            )
        del trainer
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu-parity")
    p.add_argument("--preset", default="0.1b")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per GPU per step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time torch.compile per block")
    p.add_argument("--skip-parity", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the run folders")
    args = p.parse_args()

    rt = Runtime.from_env(Config.load(overrides=["train.parallel=ddp", "train.device=cuda"]).train)
    if not rt.is_distributed or rt.device.type != "cuda":
        raise SystemExit("gpu_parity: run under torchrun with at least 2 GPUs (see the docstring)")
    out = Path(args.out)
    root = out / "runs"
    if rt.is_main:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    dist.barrier()
    report = {
        "world_size": rt.world_size,
        "gpu": torch.cuda.get_device_name(rt.device),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "host": platform.node(),
    }
    if not args.skip_parity:
        report["parity_fp32"] = parity(rt, root / "parity", batch=8 * rt.world_size)
    report["throughput_bf16"] = throughput(rt, root / "speed", args)
    if rt.is_main:
        (out / "gpu_parity.json").write_text(json.dumps(report, indent=2))
        print(json.dumps({k: v for k, v in report.items() if k != "throughput_bf16"}, indent=2))
        print(f"{'layout':<18} {'tok/s':>10} {'tok/s/GPU':>10} {'peak GiB':>9} {'estimate':>9}")
        for r in report["throughput_bf16"]:
            print(
                f"{r['layout']:<18} {r['tokens_per_s']:>10,.0f} {r['tokens_per_s_per_gpu']:>10,.0f} "
                f"{r['peak_gib_max_rank']:>9.2f} {r['estimate_gib']:>9.2f}"
            )
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    shutdown()


if __name__ == "__main__":
    main()
