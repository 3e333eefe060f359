"""The one-GPU check: one command, about 8 minutes on one H100/H200, a JSON report of what one GPU can show.

Every row runs in its own Python process with a time limit (``--row-timeout``), so no row times another's
graphs, caches or memory, and a row that crashes, hangs or runs out of memory costs that row only. Each row's
result, or its error or timeout, is written to ``OUT/gpu.json`` as it finishes (an atomic rewrite: the file
always holds every finished row), its output to ``OUT/logs/ROW.log``; the end prints which rows ran, failed
and timed out. Every row gets an indexed device (``cuda:0``): NCCL refuses a process group bound to "cuda".

0. device: its name, the measured 8192³ bf16 matmul rate (the peak for a name not in PEAKS).
1. MFU: 0.1b and 1.5b, compiled (per block, as the trainer compiles) and eager. A full training step (forward,
   loss, backward, clipping, fused AdamW) on a fixed random batch, fp32 weights under bf16 autocast; tokens/s
   over ``--steps`` steps after ``--warmup``. FLOP convention: model FLOPs per token = 6·N_matmul + the causal
   attention's 6·L·T·d_attn (smallinit.train.flops; no recomputation counted) × tokens/s ÷ the GPU's dense
   (no sparsity) bf16 tensor-core peak, looked up by the exact device name (PEAKS); a name not in the table
   uses the measured matmul rate, and says so. Targets on H100/H200: ≥ 45 % at 0.1b, ≥ 50 % at 1.5b.
   Each row also gives the peak allocated memory against smallinit.train.memory's estimate (``check_fits``
   first: a preset that cannot fit is a row saying so, not a crash).
2. bf16 against fp32: the same small model trained by the Trainer in each precision, the loss differences per
   step (and their maximum over the first 10 steps, before chaotic divergence grows).
3. Resume on the GPU: a run stopped by SIGTERM after step 4 (the trainer's own preemption path) and resumed
   (``Trainer(..., resume=True)``) against the uninterrupted run: weights and AdamW state bit for bit.
4. MoE: the smallest MoE preset's step as in 1, compiled and eager (what ``compile=auto`` picks for MoE), each
   timed: the compiled losses against the eager ones over the same steps (a mismatch is flagged), tokens/s and
   MFU beside the dense rows', Dynamo's graphs, graph breaks and compiled frames (1, 0 and 1 expected), and the
   MFU ``smallinit plan`` assumes against the measured one.
5. A world of one: the Trainer under DDP and under FSDP2 over a real process group of one rank (NCCL; gloo on
   the CPU): the many-GPU code path on one GPU, losses against one process.
6. With ≥ 2 GPUs: benchmarks/gpu_parity.py under torchrun (DDP and FSDP2 against one GPU). With fewer, the
   report lists it under "skipped" with the reason: no row is left out silently.

``--cpu`` runs every row on the CPU with the cpu presets (compiled rows too, unless ``--no-compile``): the
script's own code path, checked where no GPU is. Nothing is asserted: it reports numbers (exit 1 if a row
failed or timed out).

    python benchmarks/gpu.py [--out gpu-check] [--presets 0.1b 1.5b] [--no-compile] [--skip-parity] [--cpu]
                             [--row-timeout 600]
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
from smallinit.study.planning.cost import CPU_CORE_FLOPS, CPU_MFU, GPU_MFU
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
# the compiled MoE's losses against eager's, largest relative difference over the same steps: fp32 differs in
# summation order only; bf16 autocast rounds each matmul to 2⁻⁸ (≈ 4e-3), and the two run different expert
# kernels (a matmul per expert eagerly, grouped_mm compiled). A wrong kernel (groups misplaced) is off by O(1).
MOE_LOSS_RTOL = {"cpu": 1e-4, "cuda": 2e-2}
DEVICES = {"cpu": torch.device("cpu"), "cuda": torch.device("cuda", 0)}  # indexed: NCCL binds to one GPU


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
    # drawn on the CPU from a seed: every process (compiled or eager) trains on the same batch
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
    step_losses = []

    def step() -> None:
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            out = model(x, y)
            loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_losses.append(out.loss.detach())  # read after the timing: no host sync per step

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
        "losses": torch.stack(step_losses)
        .float()
        .tolist(),  # the language-model loss, warm-up steps included
        **(compile_counts() if compile else {}),
    }


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


def group_args(device: torch.device) -> dict:
    """``init_process_group``'s backend and device for a rank on ``device``: NCCL bound to its GPU, which needs
    an index ("Please use a device_id with index"), or gloo on the CPU (which takes no device)."""
    if device.type == "cpu":
        return {"backend": "gloo", "device_id": None}
    if device.index is None:
        raise ValueError(f"a process group binds one GPU: {device} has no index")
    return {"backend": "nccl", "device_id": device}


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
    group = group_args(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # an in-process store: one rank needs no port (two checks on one machine cannot collide)
    dist.init_process_group(**group, store=dist.HashStore(), rank=0, world_size=1)
    result: dict = {"backend": group["backend"]}
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


def device_row(args: argparse.Namespace, device: torch.device, out: Path) -> dict:
    """The device's name and its measured matmul rate (bf16 8192³ on a GPU, fp32 512³ on the CPU)."""
    if device.type == "cpu":
        return {"name": "cpu", "measured_matmul_flops": measured_peak(device, n=512, reps=5)}
    return {"name": torch.cuda.get_device_name(device), "measured_matmul_flops": measured_peak(device)}


def mfu_row(args: argparse.Namespace, device: torch.device, out: Path) -> dict:
    warmup, steps = (1, 2) if device.type == "cpu" else (args.warmup, args.steps)
    return bench(args.preset, device, compile=args.row_compile, warmup=warmup, steps=steps)


# every kind of row: its function of (arguments, device, output folder), run in the row's own process
ROWS = {
    "device": device_row,
    "mfu": mfu_row,
    "precision": lambda args, device, out: precision_parity(
        out, device, [*RUN, *SMALL[device.type]], 4 if device.type == "cpu" else 20
    ),
    "resume": lambda args, device, out: resume_exact(out, device, [*RUN, *SMALL[device.type]]),
    "world_of_one": lambda args, device, out: world_of_one(
        out, device, [*RUN, *SMALL[device.type]], 4 if device.type == "cpu" else 10
    ),
}


def plan(args: argparse.Namespace, device: torch.device, presets: list[str]) -> list[tuple[str, list[str]]]:
    """Every row of the check, in order, as (name, the arguments of its ``gpu.py --row`` process)."""
    common = ["--device", str(device), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    compiled = [False] if args.no_compile else [True, False]
    rows = [("device", ["--row", "device", *common])]
    # the MoE preset last (also when --presets names it): its rows are compared with each other (moe_summary)
    for preset in [*(p for p in presets if p != MOE[device.type]), MOE[device.type]]:
        for comp in compiled:
            name = (
                f"{'moe' if preset == MOE[device.type] else 'mfu'} {preset} {'compiled' if comp else 'eager'}"
            )
            rows.append((name, ["--row", "mfu", "--preset", preset, *(["--row-compile"] * comp), *common]))
    rows += [(kind, ["--row", kind, *common]) for kind in ("precision", "resume", "world_of_one")]
    return rows


def run_row(cmd: list[str], log: Path, timeout: float, result: Path | None = None) -> dict:
    """Run one row's process (and whatever it starts, as one process group) for at most ``timeout`` seconds:
    the row it wrote to ``result``, else its error or timeout. Its output goes to ``log``."""
    if result is not None:
        result.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # a timed-out row, or anything a finished one left running (compile workers, torchrun ranks)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    seconds = time.perf_counter() - t0
    if code is None:
        return {"timed_out": f"stopped after {timeout:g} s; its output: {log}", "seconds": seconds}
    if code or (result is not None and not result.is_file()):
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
        return {"error": f"exit {code}: {tail[0] if tail else '(no output)'}; its output: {log}"}
    row = json.loads(result.read_text()) if result is not None else {"returncode": code}
    return {**row, "seconds": seconds}


def status(row: dict) -> str:
    return "timed out" if "timed_out" in row else "failed" if "error" in row else "ran"


def write_report(path: Path, report: dict) -> None:
    """Rewrite ``path`` atomically: a reader (or a crash) never sees half a report."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, path)


def add_mfu(row: dict, peak: float | None, target: float | None) -> None:
    if "model_tflops" in row and peak:
        row["mfu"] = row["model_tflops"] * 1e12 / peak
        row["target"] = target


def moe_summary(rows: dict, device: torch.device) -> dict:
    """The MoE rows against each other and against the dense ones: losses (compiled vs eager, the same steps
    from the same weights and batch), tokens/s and MFU, and the MFU the planner assumes."""
    moe = {n.split()[-1]: r for n, r in rows.items() if n.startswith("moe ")}
    dense = {n: r for n, r in rows.items() if n.startswith("mfu ")}
    out: dict = {
        "throughput": {
            n: {k: r.get(k) for k in ("tokens_per_s", "mfu")}
            if status(r) == "ran"
            else {"missing": status(r)}
            for n, r in {**{f"moe {m}": r for m, r in moe.items()}, **dense}.items()
        },
        "planner_assumed_mfu": GPU_MFU if device.type == "cuda" else CPU_MFU,
        "planner_measured_mfu": {m: r.get("mfu") for m, r in moe.items()},
    }
    compiled, eager = moe.get("compiled", {}), moe.get("eager", {})
    if "losses" in compiled and "losses" in eager:
        diffs = compare_losses(eager["losses"], compiled["losses"])
        rtol = MOE_LOSS_RTOL[device.type]
        worst = max(abs(p - q) / abs(p) for p, q in zip(eager["losses"], compiled["losses"]))
        out["compiled_vs_eager"] = {
            "steps": diffs["steps"],
            "abs_diff_per_step": diffs["abs_diff_per_step"],
            "max_rel_diff": worst,
            "rtol": rtol,
            "agree": worst <= rtol,
        }
    else:
        out["compiled_vs_eager"] = {"missing": "a compiled and an eager MoE row that both ran"}
    return out


def row_main(args: argparse.Namespace) -> int:
    """``--row KIND``: one row in this (fresh) process, written to --row-out."""
    device = torch.device(args.device)
    out = Path(args.out)
    result = ROWS[args.row](args, device, out)
    Path(args.row_out).write_text(json.dumps(result))
    return 0


def parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--row-timeout", type=float, default=600, help="seconds each row may run (default 600)")
    ap.add_argument("--row", choices=list(ROWS), help=argparse.SUPPRESS)
    ap.add_argument("--preset", help=argparse.SUPPRESS)
    ap.add_argument("--device", help=argparse.SUPPRESS)
    ap.add_argument("--row-compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--row-out", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.row:
        return row_main(args)
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
    (out / "logs").mkdir(parents=True, exist_ok=True)
    device = DEVICES["cpu" if args.cpu else "cuda"]
    report: dict = {
        "flop_convention": "6·N_matmul + 6·L·T·d_attn per token (causal attention), no recomputation; "
        "MFU = that × tokens/s ÷ the dense bf16 peak",
        "torch": torch.__version__,
        "rows": {},
        "skipped": [],
    }
    if args.no_compile:
        report["skipped"].append("compiled MFU rows and the compiled MoE row: --no-compile")
    rows = plan(args, device, presets)
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if args.skip_parity:
        report["skipped"].append("1 → N GPU parity (gpu_parity.py): --skip-parity")
    elif gpus < 2:
        report["skipped"].append(
            f"1 → N GPU parity (gpu_parity.py under torchrun): needs ≥ 2 GPUs, {gpus} visible"
        )
    else:
        script = str(Path(__file__).parent / "gpu_parity.py")
        rows.append(("parity", ["torchrun", "--standalone", f"--nproc_per_node={gpus}", script]))
    write_report(out / "gpu.json", report)
    peak = None
    for name, row_args in rows:
        log = out / "logs" / f"{name.replace(' ', '-')}.log"
        if name == "parity":
            result = run_row([*row_args, "--out", str(out / "gpu-parity")], log, args.row_timeout)
        else:
            cmd = [sys.executable, __file__, *row_args, "--out", str(out), "--row-out", str(out / "row.json")]
            result = run_row(cmd, log, args.row_timeout, out / "row.json")
        if name == "device" and status(result) == "ran":
            if args.cpu:
                peak = CPU_CORE_FLOPS * torch.get_num_threads()
                source = "CPU: one core's fp32 matmul rate × threads (smallinit.study.planning.cost)"
            else:
                peak = table_peak(result["name"]) or result["measured_matmul_flops"]
                source = (
                    "table (exact device name)"
                    if table_peak(result["name"])
                    else f"measured: {result['name']!r} is not in PEAKS"
                )
            report.update(peak_flops=peak, peak_source=source)
            print(f"{result['name']}: peak {peak / 1e12:.4g} TFLOP/s ({source})", flush=True)
        if name.startswith(("mfu", "moe")):
            preset, comp = name.split()[1], name.endswith("compiled")
            add_mfu(result, peak, TARGETS.get(preset) if comp and not args.cpu else None)
        report["rows"][name] = result
        if name.startswith("moe"):
            report["moe"] = moe_summary(report["rows"], device)
        write_report(out / "gpu.json", report)
        print(f"{name} ({status(result)}): {json.dumps(result)}", flush=True)
    summary = {
        s: [n for n, r in report["rows"].items() if status(r) == s] for s in ("ran", "failed", "timed out")
    }
    report["summary"] = summary
    report["seconds"] = time.perf_counter() - started
    write_report(out / "gpu.json", report)
    if "moe" in report:
        print_moe(report["moe"])
    for line in report["skipped"]:
        print(f"skipped: {line}")
    print(
        f"rows: {len(summary['ran'])} ran"
        + "".join(
            f"; {len(summary[s])} {s}: {', '.join(summary[s])}" for s in ("failed", "timed out") if summary[s]
        )
    )
    print(f"wrote {out / 'gpu.json'} ({report['seconds']:.0f} s)")
    return 1 if summary["failed"] or summary["timed out"] else 0


def print_moe(moe: dict) -> None:
    for name, r in moe["throughput"].items():
        if "missing" in r:
            print(f"{name}: {r['missing']}")
        else:
            mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
            print(f"{name}: {r['tokens_per_s']:,.0f} tokens/s{mfu}")
    c = moe["compiled_vs_eager"]
    if "missing" in c:
        print(f"MoE losses, compiled vs eager: not compared, missing {c['missing']}")
    else:
        verdict = "agree" if c["agree"] else "MISMATCH"
        print(
            f"MoE losses, compiled vs eager over {c['steps']} steps: largest relative difference "
            f"{c['max_rel_diff']:.2e} (tolerance {c['rtol']:g}): {verdict}"
        )
    measured = ", ".join(
        f"{m} {'—' if v is None else f'{v:.1%}'}" for m, v in moe["planner_measured_mfu"].items()
    )
    print(
        f"planner: smallinit plan assumes MFU {moe['planner_assumed_mfu']:.0%} for every model, MoE included "
        f"(smallinit.study.planning.cost); the MoE measured here: {measured or 'no row ran'}"
    )


if __name__ == "__main__":
    sys.exit(main())
