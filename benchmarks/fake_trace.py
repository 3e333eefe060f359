"""One FSDP2 training step traced over fake ranks: the sharding plan and the memory per rank, without a GPU.

The technique of torchtitan's memory estimator: a fake process group (``init_process_group("fake")`` with
``FakeStore``: every collective returns at once and moves nothing) and fake tensors (``FakeTensorMode``: shapes,
dtypes and strides, no storage, no arithmetic). The model is built on the meta device, sharded by the trainer's
own ``parallelize`` (``fully_shard`` per block, then the root, bf16 compute with fp32 reduction), given fake
storage, and trained for one step exactly as the trainer's step does it: forward under bf16 autocast, loss,
backward, global gradient-norm clipping, the fused AdamW of ``build_optimizer``. A first step creates the
optimizer state; PyTorch's ``FSDPMemTracker`` then records the second, by category, at its peak. The numbers
are rank 0's; every rank holds the same shapes.

What the trace checks: that the sharding plan applies (every parameter Shard(0) over N ranks, 1/N of it per
rank), that the step's forward and backward run at the preset's real shapes (2048-token sequences, the MoE
dispatch), that fused AdamW steps the sharded tensors, and the bytes each rank holds, against
``smallinit.train.memory.estimate_memory``.

What it leaves unchecked, because fake CUDA tensors are not enough: without CUDA, ``autocast("cuda")``
disables itself, so the trace runs on the CPU device under CPU autocast, whose op lists differ from CUDA's
(FSDP2's bf16 parameter copies make the matmuls bf16 either way); no CUDA kernel runs (SDPA's flash or cuDNN
backends, the fused AdamW CUDA kernel, torch.compile), MoE takes its CPU grouped-matmul dispatch where GPUs
take the loop; no NCCL (no communication buffers, no timing); no CUDA streams, so FSDP2's prefetch of the next
block's all-gather overlaps nothing here and the caching allocator's fragmentation is absent.

    python benchmarks/fake_trace.py [--presets 1.5b moe-1.5b-a0.25b] [--micro-batch 4] [--seq-len 2048]
                                    [--ranks 8] [--activation-checkpointing] [--json trace.json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.distributed as dist

from smallinit import ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.train.distributed import Runtime, clip_grad_norm_, parallelize
from smallinit.train.memory import GIB, estimate_memory
from smallinit.train.optim import build_optimizer

# FSDPMemTracker's categories, grouped as smallinit.train.memory.MemoryEstimate groups them
STATE = ("Sharded Param", "Sharded Grad", "OptState", "Buffer")
ACTIVATIONS = ("Activation", "Temp", "Inputs")
IN_FLIGHT = ("Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter")


def sharding_plan(model: torch.nn.Module, ranks: int) -> dict[str, Any]:
    """Each parameter's placement and its bytes on this rank against 1/N of the whole."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    units = [name or "(root)" for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    full = local = 0
    unsharded = []
    for name, p in model.named_parameters():
        if not (isinstance(p, DTensor) and p.placements == (Shard(0),)):
            unsharded.append(name)
            continue
        full += p.numel()
        local += p.to_local().numel()
    return {
        "fsdp_units": units,
        "params": full,
        "params_on_rank": local,
        "share_on_rank": local / max(full, 1),
        "ideal_share": 1 / ranks,
        "not_sharded": unsharded,
    }


def trace_step(
    cfg: ModelConfig,
    *,
    micro_batch: int,
    seq_len: int,
    ranks: int = 8,
    activation_checkpointing: bool = False,
) -> dict[str, Any]:
    """Rank 0's peak memory in one traced FSDP2 training step, by category, next to the estimate."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("trace_step needs a process without a process group (it creates a fake one)")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        tc = TrainConfig(parallel="fsdp", compile=False, activation_checkpointing=activation_checkpointing)
        with torch.device("meta"):
            model = Transformer(cfg, init=False)
        # outside fake mode: the device mesh reads its rank map as real numbers
        engine = parallelize(model, Runtime(torch.device("cpu"), 0, ranks, 0), tc)
        plan = sharding_plan(model, ranks)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            opt = build_optimizer(model, tc)
            tokens = torch.randint(0, cfg.vocab_size, (micro_batch, seq_len))
            seen: dict[str, torch.dtype] = {}

            def logits_dtype(_m: torch.nn.Module, _i: Any, out: torch.Tensor) -> None:
                seen["logits"] = out.dtype

            model.lm_head.register_forward_hook(logits_dtype)

            def step() -> None:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = engine(tokens, tokens).loss
                loss.backward()
                clip_grad_norm_(model, tc.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)

            step()  # creates the AdamW state, which the tracker then finds in place
            tracker = FSDPMemTracker(mod=model, optm=opt)
            tracker.track_inputs((tokens,))
            with tracker:
                step()
            peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        fused = all(g.get("fused") for g in opt.param_groups)
    finally:
        dist.destroy_process_group()
    by_name = {getattr(k, "value", k): v for k, v in peak.items()}
    traced = {
        "state": sum(by_name[k] for k in STATE),
        "activations": sum(by_name[k] for k in ACTIVATIONS),
        "in_flight": sum(by_name[k] for k in IN_FLIGHT),
        "total": by_name["Total"],
    }
    est = estimate_memory(
        cfg,
        micro_batch=micro_batch,
        seq_len=seq_len,
        world_size=ranks,
        parallel="fsdp",
        precision="bf16",
        activation_checkpointing=activation_checkpointing,
    )
    estimate = {
        "state": est.weights + est.grads + est.optimizer,
        "activations": est.activations,
        "in_flight": est.in_flight,
        "total": est.total,
    }
    return {
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "ranks": ranks,
        "activation_checkpointing": activation_checkpointing,
        "plan": plan,
        "fused_adamw": fused,
        "logits_dtype": str(seen.get("logits")),
        "peak_bytes": by_name,
        "traced": traced,
        "estimate": estimate,
    }


def format_rows(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """The traced peak beside the estimate, in GiB (MiB for models under 1 GiB). The categories are compared at the
    traced peak: the estimate adds each one's own maximum, the trace their sum at one moment."""
    unit, name = (GIB, "GiB") if max(r["estimate"]["total"] for _, r in rows) >= GIB else (2**20, "MiB")
    head = (
        f"{'preset':<26} {'traced':>8} {'estim.':>8} {'t/e':>6} {'state t/e':>13} {'activ. t/e':>13} "
        f"{'in flight t/e':>14}"
    )
    lines = [
        f"{name} on rank 0 of {rows[0][1]['ranks']}, bf16, FSDP2 (t = traced peak, e = estimate)",
        head,
        "-" * len(head),
    ]
    for label, r in rows:
        t, e = r["traced"], r["estimate"]
        pair = [f"{t[k] / unit:.2f}/{e[k] / unit:.2f}" for k in ("state", "activations", "in_flight")]
        lines.append(
            f"{label:<26} {t['total'] / unit:>8.2f} {e['total'] / unit:>8.2f} {t['total'] / e['total']:>6.2f} "
            f"{pair[0]:>13} {pair[1]:>13} {pair[2]:>14}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["1.5b", "moe-1.5b-a0.25b"])
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per rank")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--activation-checkpointing", action="store_true", help="also trace with it on")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for preset in args.presets:
        cfg = ModelConfig.preset(preset)
        seq = min(args.seq_len, cfg.max_seq_len)
        for ac in (False, True) if args.activation_checkpointing else (False,):
            r = trace_step(
                cfg, micro_batch=args.micro_batch, seq_len=seq, ranks=args.ranks, activation_checkpointing=ac
            )
            r["preset"] = preset
            rows.append((f"{preset} × {args.micro_batch}×{seq}" + (" AC" if ac else ""), r))
            plan = r["plan"]
            print(
                f"{preset}{' AC' if ac else ''}: {len(plan['fsdp_units'])} FSDP units, {plan['share_on_rank']:.4f} "
                f"of {plan['params']:,} parameters on rank 0 (1/{args.ranks} = {plan['ideal_share']:.4f}), "
                f"not sharded: {plan['not_sharded'] or 'none'}; fused AdamW {r['fused_adamw']}; "
                f"logits {r['logits_dtype']}",
                flush=True,
            )
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r for _, r in rows], f, indent=1)


if __name__ == "__main__":
    main()
