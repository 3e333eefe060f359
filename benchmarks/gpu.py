"""The one-GPU check: one command, about 7 minutes on one H100/H200, a JSON report of what one GPU can show.

Rows, each reported (and, for MFU, each run in a fresh process, so that no row times another's graphs, caches or
memory):

1. MFU: 0.1b and 1.5b, compiled (per block, as the trainer compiles) and eager. A full training step (forward,
   loss, backward, clipping, fused AdamW) on random tokens, fp32 weights under bf16 autocast; tokens/s over
   ``--steps`` steps after ``--warmup``. FLOP convention: model FLOPs per token = 6·N_matmul + the causal
   attention's 6·L·T·d_attn (smallinit.train.flops; no recomputation counted) × tokens/s ÷ the GPU's dense
   (no sparsity) bf16 tensor-core peak, looked up by the exact device name (PEAKS); a name not in the table
   uses the measured 8192³ bf16 matmul rate, and says so. Targets on H100/H200: ≥ 45 % at 0.1b, ≥ 50 % at 1.5b.
   Each row also gives the peak allocated memory against smallinit.train.memory's estimate (``check_fits``
   first: a preset that cannot fit is a row saying so, not a crash).
2. bf16 against fp32: the same small model trained by the Trainer in each precision, the loss differences per
   step (and their maximum over the first 10 steps, before chaotic divergence grows).
3. Resume on the GPU: a run stopped by SIGTERM after step 4 (the trainer's own preemption path) and resumed
   (``Trainer(..., resume=True)``) against the uninterrupted run: weights and AdamW state bit for bit.
4. MoE compiled: the smallest MoE preset's step under torch.compile (in a fresh process): tokens/s, MFU, and
   its graphs, graph breaks and compiled frames (Dynamo's counters; 1, 0 and 1 expected).
5. A world of one: the Trainer under DDP and under FSDP2 over a real process group of one rank (NCCL; gloo on
   the CPU): the many-GPU code path on one GPU, losses against one process.
6. With ≥ 2 GPUs: benchmarks/gpu_parity.py under torchrun (DDP and FSDP2 against one GPU). With fewer, the
   report lists it under "skipped" with the reason: no row is left out silently.

``--cpu`` runs every row on the CPU with the cpu presets (compiled rows too, unless ``--no-compile``): the
script's own code path, checked where no GPU is. Nothing is asserted: it reports numbers.

    python benchmarks/gpu.py [--out gpu-check] [--presets 0.1b 1.5b] [--no-compile] [--skip-parity] [--cpu]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from smallinit import Config, ModelConfig, Transformer
from smallinit.config import PRESETS, TrainConfig
from smallinit.errors import ConfigError, Preempted, SmallinitError
from smallinit.study.planning.cost import CPU_CORE_FLOPS
from smallinit.train import Callback, Trainer
from smallinit.train.distributed import Runtime, parallelize
from smallinit.train.flops import train_flops_per_token
from smallinit.train.memory import GIB, check_fits, estimate_memory
from smallinit.train.optim import build_optimizer

# Dense bf16 tensor-core peaks (FLOP/s, without sparsity) from the vendors' data sheets, keyed by the exact name
# torch.cuda.get_device_name() reports: the PCIe and NVL parts run slower clocks than the SXM ones.
PEAKS = {
    "NVIDIA H100 80GB HBM3": 989e12,  # SXM5
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H200": 989e12,  # SXM
    "NVIDIA H200 NVL": 835e12,
    "NVIDIA H800": 989e12,
    "NVIDIA H800 PCIe": 756e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA L40S": 362e12,
    "NVIDIA B200": 2250e12,
}
TARGETS = {"0.1b": 0.45, "1.5b": 0.50}
BATCH = {"0.1b": 16, "1.5b": 8}  # sequences per step; other presets: 8 on a GPU, 4 on the CPU
MOE = {"cpu": "cpu-moe-1m", "cuda": "moe-1.5b-a0.25b"}  # the smallest MoE preset
RUN = [  # what the precision, resume and world-of-one rows' runs share
    "data.tokenizer=bytes",
    "data.corpus=shakespeare",
    "train.warmup_steps=2",
    "train.log_every=1",
    "train.eval_every=0",
    "train.checkpoint_every=0",
]
SMALL = {  # their model: small on a GPU, tiny on the CPU
    "cuda": [
        "model.d_model=256",
        "model.n_layers=4",
        "model.n_heads=4",
        "model.n_kv_heads=4",
        "model.d_ff=768",
    ]
    + ["data.seq_len=256", "train.batch_size=16"],
    "cpu": ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=2", "model.d_ff=64"]
    + ["data.seq_len=32", "train.batch_size=4"],
}
EARLY = 10  # steps over which the layouts' and precisions' losses are compared as parity


def table_peak(name: str) -> float | None:
    """The dense bf16 peak of the GPU named exactly ``name`` (None if it is not in PEAKS)."""
    return PEAKS.get(name)


def check_presets(names: list[str]) -> list[str]:
    """The presets, each known to smallinit (else one ConfigError naming the choices)."""
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise ConfigError(f"--presets: unknown preset {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    return names


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    """Start a peak-memory count: collect reference cycles first (compiled blocks and the optimizer hold some),
    so that a dead model's tensors are freed and not counted in the next row's peak."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


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


def step_shape(preset: str, device: torch.device) -> tuple[int, int]:
    """(sequences, tokens per sequence) of a step of ``preset``."""
    cfg = ModelConfig.preset(preset)
    batch = BATCH.get(preset, 8 if device.type == "cuda" else 4)
    return batch, min(2048 if device.type == "cuda" else 128, cfg.max_seq_len)


def compile_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "frames_compiled": counters["frames"]["total"],
    }


def bench(preset: str, device: torch.device, *, compile: bool, warmup: int, steps: int) -> dict:
    """One MFU row (run in its own process): tokens/s, model FLOP/s and peak memory of a full training step."""
    batch, seq = step_shape(preset, device)
    cfg = ModelConfig.preset(preset)
    amp = torch.bfloat16 if device.type == "cuda" else None
    row: dict = {"preset": preset, "compile": compile, "batch": batch, "seq": seq}
    run_cfg = Config.load(
        overrides=[f"model.preset={preset}", f"data.seq_len={seq}", f"train.batch_size={batch}"]
    )
    est = estimate_memory(cfg, micro_batch=batch, seq_len=seq, precision="bf16" if amp else "fp32")
    row["estimate_gib"] = est.total / GIB
    try:
        check_fits(run_cfg, device, 1, amp)
    except ConfigError as e:
        return {**row, "error": str(e)}
    reset_peak(device)
    model = Transformer(cfg, seed=0).to(device)  # drawn on the CPU from the seed, as the trainer does
    tc = TrainConfig(compile=compile)
    parallelize(model, Runtime(device), tc)
    opt = build_optimizer(model, tc)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> None:
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            out = model(x, y)
            loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

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
    return {
        **row,
        "params": model.num_params(),
        "tokens_per_s": batch * seq / step_s,
        "step_s": step_s,
        "flops_per_token": fpt,
        "model_tflops": fpt * batch * seq / step_s / 1e12,
        "warmup_s": warm_s,
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
        **(compile_counts() if compile else {}),
    }


def in_fresh_process(args: list[str], out: Path) -> dict:
    """Run ``gpu.py --row ...`` in a new Python process and return the row it wrote (or its failure)."""
    out.unlink(missing_ok=True)
    r = subprocess.run(
        [sys.executable, __file__, *args, "--row-out", str(out)], capture_output=True, text=True, check=False
    )
    if r.returncode or not out.is_file():
        return {"error": f"exit {r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"}
    return json.loads(out.read_text())


def losses(run: Path) -> list[float]:
    return [
        r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]


def compare_losses(a: list[float], b: list[float]) -> dict:
    """Per-step differences, and their maximum over the first EARLY steps (parity, before chaos grows)."""
    diffs = [abs(p - q) for p, q in zip(a, b)]
    return {
        "steps": len(diffs),
        "abs_diff_per_step": diffs,
        f"max_abs_diff_first_{EARLY}": max(diffs[:EARLY]),
        f"max_rel_diff_first_{EARLY}": max(d / abs(p) for d, p in zip(diffs[:EARLY], a)),
    }


def train(sets: list[str], run: Path, runtime: Runtime, **kw) -> Trainer:
    shutil.rmtree(run, ignore_errors=True)
    trainer = Trainer(Config.load(overrides=sets), run, runtime=runtime, **kw)
    trainer.fit()
    return trainer


def precision_parity(out: Path, device: torch.device, small: list[str], steps: int) -> dict:
    """The same run in fp32 and in bf16 on one device: the loss differences along training."""
    runs = {}
    for precision in ("fp32", "bf16"):
        sets = [*small, f"train.steps={steps}", f"train.precision={precision}", f"train.device={device.type}"]
        train(sets, out / f"precision-{precision}", Runtime(device), callbacks=[])
        runs[precision] = losses(out / f"precision-{precision}")
    return compare_losses(runs["fp32"], runs["bf16"])


class StopAfter(Callback):
    """Sends this process SIGTERM at the end of step ``step``: the trainer's preemption path stops there."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, record) -> None:
        if trainer.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def state_of(trainer: Trainer) -> dict[str, torch.Tensor]:
    tensors = {f"model.{k}": v for k, v in trainer.model.state_dict().items()}
    for i, state in enumerate(trainer.optimizer.state.values()):
        tensors.update({f"optim.{i}.{k}": v for k, v in state.items() if torch.is_tensor(v)})
    return tensors


def resume_exact(out: Path, device: torch.device, small: list[str]) -> dict:
    """Stopped by SIGTERM after step 4, resumed, against the uninterrupted run: equal bit for bit?"""
    sets = [*small, "train.steps=8", "train.checkpoint_every=4", f"train.device={device.type}"]
    full = train(sets, out / "resume-full", Runtime(device), callbacks=[])
    try:
        train(sets, out / "resume-cut", Runtime(device), callbacks=[StopAfter(4)])
        return {"error": "the run was not stopped at step 4"}
    except Preempted:
        pass
    cfg = Config.load(overrides=sets)
    resumed = Trainer(cfg, out / "resume-cut", runtime=Runtime(device), resume=True, callbacks=[])
    resumed.fit()
    a, b = state_of(full), state_of(resumed)
    unequal = sorted(k for k in a if k not in b or not torch.equal(a[k].cpu(), b[k].cpu()))
    return {"tensors": len(a), "bit_exact": not unequal and a.keys() == b.keys(), "unequal": unequal[:10]}


class WorldOfOne(Runtime):
    """One rank that takes the many-rank path (DDP / FSDP2 wrapping, collectives) over a real process group."""

    @property
    def is_distributed(self) -> bool:
        return True


def world_of_one(out: Path, device: torch.device, small: list[str], steps: int) -> dict:
    """The Trainer under DDP and FSDP2 over a process group of one rank, against one process."""
    import torch.distributed as dist

    sets = [*small, f"train.steps={steps}", f"train.device={device.type}"]
    train([*sets, "train.parallel=none"], out / "one", Runtime(device), callbacks=[])
    ref = losses(out / "one")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, rank=0, world_size=1, device_id=device if device.type == "cuda" else None
    )
    result: dict = {"backend": backend}
    try:
        for layout in ("ddp", "fsdp"):
            try:
                train([*sets, f"train.parallel={layout}"], out / layout, WorldOfOne(device), callbacks=[])
                result[layout] = compare_losses(ref, losses(out / layout))
            except (RuntimeError, SmallinitError) as e:
                result[layout] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        dist.destroy_process_group()
    return result


def one_row(args: argparse.Namespace) -> None:
    """``--row PRESET``: one MFU row in this (fresh) process, written to --row-out."""
    device = torch.device("cpu" if args.cpu else "cuda")
    warmup, steps = (1, 2) if args.cpu else (args.warmup, args.steps)
    row = bench(args.row, device, compile=args.row_compile, warmup=warmup, steps=steps)
    Path(args.row_out).write_text(json.dumps(row))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu-check")
    ap.add_argument(
        "--presets", nargs="+", help="presets of the MFU rows (default 0.1b 1.5b; cpu-1m with --cpu)"
    )
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled rows (listed as skipped)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip-parity", action="store_true", help="skip the 1 → N GPU torchrun check")
    ap.add_argument(
        "--cpu", "--dry-run", action="store_true", help="every row on the CPU with the cpu presets"
    )
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--row-compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--row-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.row:
        one_row(args)
        return 0
    try:
        presets = check_presets(args.presets or (["cpu-1m"] if args.cpu else ["0.1b", "1.5b"]))
    except ConfigError as e:
        print(f"gpu.py: error: {e}", file=sys.stderr)
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("gpu.py: error: no CUDA GPU; run with --cpu to check the script on the CPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.cpu else "cuda")
    small = [*RUN, *SMALL[device.type]]
    if args.cpu:
        name, measured, peak = (
            "cpu",
            measured_peak(device, n=512, reps=5),
            CPU_CORE_FLOPS * torch.get_num_threads(),
        )
        peak_source = "CPU: one core's fp32 matmul rate × threads (smallinit.study.planning.cost)"
    else:
        name, measured = torch.cuda.get_device_name(), measured_peak(device)
        peak = table_peak(name) or measured
        peak_source = (
            "table (exact device name)" if table_peak(name) else f"measured: {name!r} is not in PEAKS"
        )
    report: dict = {
        "device": name,
        "peak_flops": peak,
        "peak_source": peak_source,
        "measured_matmul_flops": measured,
        "flop_convention": "6·N_matmul + 6·L·T·d_attn per token (causal attention), no recomputation; "
        "MFU = that × tokens/s ÷ the dense bf16 peak",
        "torch": torch.__version__,
        "mfu": [],
        "skipped": [],
    }
    print(f"{name}: peak {peak / 1e12:.4g} TFLOP/s ({peak_source}); matmul {measured / 1e12:.4g} TFLOP/s")
    compiled = [False] if args.no_compile else [True, False]
    if args.no_compile:
        report["skipped"].append("compiled MFU rows and the compiled MoE row: --no-compile")
    for preset in presets:
        for comp in compiled:
            flags = ["--row", preset, *(["--row-compile"] if comp else []), *(["--cpu"] if args.cpu else [])]
            flags += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
            r = in_fresh_process(flags, out / "row.json")
            r.update(preset=preset, compile=comp)
            if "model_tflops" in r:
                r["mfu"] = r["model_tflops"] * 1e12 / peak
                r["target"] = TARGETS.get(preset) if comp and not args.cpu else None
            report["mfu"].append(r)
            print(f"MFU {preset} {'compiled' if comp else 'eager'}: {json.dumps(r)}", flush=True)
    steps = 4 if args.cpu else 20
    report["precision"] = precision_parity(out, device, small, steps)
    print("bf16 vs fp32:", json.dumps(report["precision"]), flush=True)
    report["resume"] = resume_exact(out, device, small)
    print("resume:", json.dumps(report["resume"]), flush=True)
    if not args.no_compile:
        flags = ["--row", MOE[device.type], "--row-compile", *(["--cpu"] if args.cpu else [])]
        moe = in_fresh_process([*flags, "--warmup", "3", "--steps", "3"], out / "row.json")
        if "model_tflops" in moe:
            moe["mfu"] = moe["model_tflops"] * 1e12 / peak
        report["moe_compiled"] = moe
        print("MoE compiled:", json.dumps(report["moe_compiled"]), flush=True)
    report["world_of_one"] = world_of_one(out, device, small, 4 if args.cpu else 10)
    print("world of one:", json.dumps(report["world_of_one"]), flush=True)
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if args.skip_parity:
        report["skipped"].append("1 → N GPU parity (gpu_parity.py): --skip-parity")
    elif gpus < 2:
        report["skipped"].append(
            f"1 → N GPU parity (gpu_parity.py under torchrun): needs ≥ 2 GPUs, {gpus} visible"
        )
    else:
        script = str(Path(__file__).parent / "gpu_parity.py")
        cmd = [
            "torchrun",
            "--standalone",
            f"--nproc_per_node={gpus}",
            script,
            "--out",
            str(out / "gpu-parity"),
        ]
        report["parity_returncode"] = subprocess.run(cmd, check=False).returncode
    for line in report["skipped"]:
        print(f"skipped: {line}")
    report["seconds"] = time.perf_counter() - started
    (out / "gpu.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'gpu.json'} ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
