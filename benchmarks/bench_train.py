"""Training throughput against Hugging Face's LlamaForCausalLM, gate overheads, and MFU on this CPU.

Contestants per size, timed interleaved in one process (a sample = one full training step: forward, loss,
backward, gradient clipping, AdamW step, zero_grad, on a fixed random batch):
  ours-none         our Transformer with gate="none" (the like-for-like peer of Llama)
  ours-headwise     gate="headwise"
  ours-elementwise  gate="elementwise" (our default)
  hf-llama          transformers.LlamaForCausalLM, same shape (d_model, layers, heads, kv heads, d_ff, vocab,
                    tied embeddings, ε, RoPE θ), SDPA attention, carrying ours-none's weights, its own loss
                    (``labels`` with ``shift_labels``, so both predict the same targets)
  matmul            one 2048² fp32 torch.mm into a preallocated output: the machine's matmul rate, for MFU
Both models get the same optimizer (smallinit's: AdamW, its parameter groups, the fused kernel) and threads;
one more row times that optimizer against ``torch.optim.AdamW``'s defaults.

    python benchmarks/bench_train.py [--sizes cpu-5m cpu-20m] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
from common import (
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
from torch import nn

from smallinit import ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.train.optim import build_optimizer

GATES = ("none", "headwise", "elementwise")


def llama_twin(model: Transformer) -> nn.Module:
    """LlamaForCausalLM of the same shape holding ``model``'s weights (``model`` must have gate="none")."""
    from transformers import LlamaForCausalLM

    from smallinit.export.hf import hf_config, hf_tensors

    cfg = model.config
    assert cfg.gate == "none" and not cfg.qk_norm and cfg.moe is None, "Llama has no gate, QK-norm or MoE"
    hcfg = hf_config(cfg, "LlamaForCausalLM", eos_id=0)
    hcfg._attn_implementation = "sdpa"
    hcfg.use_cache = False
    twin = LlamaForCausalLM(hcfg)
    missing, unexpected = twin.load_state_dict(
        hf_tensors(model.state_dict(), cfg, "LlamaForCausalLM"), strict=False
    )
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return twin


def ours_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y).loss


def hf_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=y, shift_labels=y).loss


def train_step(model: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One full training step as the trainer runs it (without data loading and logging)."""
    tc = TrainConfig()
    opt = build_optimizer(model, tc)

    def step() -> None:
        loss_fn(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bench_size(
    preset: str, *, batch: int, seq: int, rounds: int, steps: int, clock: str = "wall"
) -> list[Row]:
    cfgs = {g: ModelConfig.preset(preset, gate=g) for g in GATES}
    models: dict[str, nn.Module] = {f"ours-{g}": Transformer(c, seed=0) for g, c in cfgs.items()}
    models["hf-llama"] = llama_twin(models["ours-none"])
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfgs["none"].vocab_size, (batch, seq + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    with torch.no_grad():  # same weights, same function: the comparison is like for like
        ours, theirs = ours_loss(models["ours-none"], x, y).item(), hf_loss(models["hf-llama"], x, y).item()
    assert math.isclose(ours, theirs, rel_tol=1e-4), f"ours {ours} vs Llama {theirs}: not the same model"

    cases = {
        name: train_step(m, hf_loss if name == "hf-llama" else ours_loss, x, y) for name, m in models.items()
    }
    mm, mm_flops = matmul_case()
    cases["matmul"] = mm
    t = interleaved(cases, rounds=rounds, warmup=2, inner=steps, clock=clock)
    tokens_per_step = batch * seq
    tps = {name: Stat.of([tokens_per_step / s for s in t[name]]) for name in models}
    rate = Stat.of([mm_flops / s / 1e9 for s in t["matmul"]])
    where = f"{preset}, batch {batch}×{seq}"

    rows = []
    for name in models:
        rows.append(
            Row(
                "train",
                f"{where}: {name} tokens/s",
                tps[name],
                "tokens/s",
                extra={"params": sum(p.numel() for p in models[name].parameters())},
            )
        )
    for g in GATES:
        ratio = paired(t["hf-llama"], t[f"ours-{g}"])  # tokens/s ratio = inverse step-time ratio
        target, ok = check(ratio, at_least=0.95) if g == "none" else ("", None)
        rows.append(
            Row(
                "train",
                f"{where}: ours ({g} gate) / HF Llama tokens/s",
                ratio,
                "×",
                target,
                ok,
                note="like for like" if g == "none" else "ours does more work (the gate)",
            )
        )
    for g in ("headwise", "elementwise"):
        over = paired(t[f"ours-{g}"], t["ours-none"], lambda a, b: a / b - 1)
        flops = (
            train_flops_per_token(models[f"ours-{g}"], seq) / train_flops_per_token(models["ours-none"], seq)
            - 1
        )
        target, ok = check(over, at_most=0.05)
        rows.append(
            Row(
                "overhead",
                f"{where}: {g} gate step time vs none",
                over,
                "+frac",
                target,
                ok,
                note=f"its FLOPs alone add {flops:+.1%}",
                extra={"flops_overhead": flops},
            )
        )
    rows.append(Row("train", "fp32 matmul rate (2048², same run)", rate, "GFLOP/s"))
    for name in ("ours-none", "ours-elementwise", "hf-llama"):
        fpt = train_flops_per_token(models[name] if name != "hf-llama" else models["ours-none"], seq)
        mfu = paired(t[name], t["matmul"], lambda s, m, fpt=fpt: fpt * tokens_per_step / s / (mm_flops / m))
        target, ok = check(mfu, at_least=0.60) if preset == "cpu-20m" and name == "ours-none" else ("", None)
        rows.append(
            Row(
                "mfu",
                f"{where}: {name} MFU",
                mfu,
                "frac",
                target,
                ok,
                note=f"{fpt / 1e6:.1f} MFLOP/token",
                extra={"flops_per_token": fpt},
            )
        )
    return rows


def bench_optimizer(preset: str, *, rounds: int, clock: str) -> Row:
    """Our AdamW (fused kernel) against ``torch.optim.AdamW``'s defaults, the optimizer HF's Trainer builds."""
    models = {k: Transformer(ModelConfig.preset(preset), seed=0) for k in ("ours", "torch-default")}
    gen = torch.Generator().manual_seed(0)
    for m in models.values():
        for p in m.parameters():
            p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    opts = {
        "ours": build_optimizer(models["ours"], TrainConfig()),
        "torch-default": torch.optim.AdamW(models["torch-default"].parameters(), lr=1e-3),
    }
    t = interleaved({k: o.step for k, o in opts.items()}, rounds=rounds * 3, warmup=2, inner=3, clock=clock)
    return Row(
        "train",
        f"{preset}: AdamW step, torch defaults / ours (fused)",
        paired(t["torch-default"], t["ours"]),
        "×",
        note="> 1: ours is faster",
    )


def run(args: argparse.Namespace) -> list[Row]:
    rows = []
    for preset in args.sizes:
        rows += bench_size(
            preset, batch=args.batch, seq=args.seq, rounds=args.rounds, steps=args.steps, clock=args.clock
        )
    rows.append(bench_optimizer(args.sizes[-1], rounds=args.rounds, clock=args.clock))
    return rows


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--sizes", nargs="+", default=["cpu-5m", "cpu-20m"])
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (default: TrainConfig's 16)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence (default: DataConfig's 128)")
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)
    ap.add_argument("--steps", type=int, default=1, help="steps per sample")
    add_common_args(ap)


if __name__ == "__main__":
    main(__doc__, add_args, run)
