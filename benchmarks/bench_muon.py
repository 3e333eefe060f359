"""Muon's training step against AdamW's at cpu-5m and cpu-20m, as ratios measured in one run.

Contestants per size, timed interleaved in one process on a fixed random batch, with the same weights and threads:
  adamw   smallinit's optimizer with train.optimizer = "adamw" (AdamW, fused kernel)
  muon    train.optimizer = "muon" (torch.optim.Muon on the hidden matrices, AdamW on the rest)
A sample is one full training step (forward, loss, backward, gradient clipping, optimizer step, zero_grad) or,
in the second comparison, the optimizer step alone on fixed random gradients. Muon's Newton–Schulz iteration
(5 rounds of three matmuls per matrix, in bf16) is the cost it adds.

    python benchmarks/bench_muon.py [--sizes cpu-5m cpu-20m] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from common import Row, add_common_args, interleaved, main, paired

from smallinit import ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.train.optim import build_optimizer

OPTIMIZERS = ("adamw", "muon")


def full_step(model: Transformer, tc: TrainConfig, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    opt = build_optimizer(model, tc)

    def step() -> None:
        model(x, y).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def optimizer_step(model: Transformer, tc: TrainConfig) -> Callable[[], None]:
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    return build_optimizer(model, tc).step


def bench_size(preset: str, *, batch: int, seq: int, rounds: int, clock: str) -> list[Row]:
    cfg = ModelConfig.preset(preset)
    tcs = {name: TrainConfig(optimizer=name) for name in OPTIMIZERS}
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    steps = {name: full_step(Transformer(cfg, seed=0), tc, x, y) for name, tc in tcs.items()}
    t = interleaved(steps, rounds=rounds, warmup=2, inner=1, clock=clock)
    alone = {name: optimizer_step(Transformer(cfg, seed=0), tc) for name, tc in tcs.items()}
    t_alone = interleaved(alone, rounds=rounds * 3, warmup=2, inner=3, clock=clock)
    where = f"{preset}, batch {batch}×{seq}"
    return [
        Row("muon", f"{where}: Muon / AdamW full training step time", paired(t["muon"], t["adamw"]), "×"),
        Row(
            "muon",
            f"{preset}: Muon / AdamW optimizer step alone",
            paired(t_alone["muon"], t_alone["adamw"]),
            "×",
        ),
    ]


def run(args: argparse.Namespace) -> list[Row]:
    rows = []
    for preset in args.sizes:
        rows += bench_size(preset, batch=args.batch, seq=args.seq, rounds=args.rounds, clock=args.clock)
    return rows


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--sizes", nargs="+", default=["cpu-5m", "cpu-20m"])
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (default: TrainConfig's 16)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence (default: DataConfig's 128)")
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)
    add_common_args(ap)


if __name__ == "__main__":
    main(__doc__, add_args, run)
