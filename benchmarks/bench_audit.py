"""Audit speed: ``smallinit.audit`` of a model against one training step of the same model.

The audit reads every weight (σ, truncation, kurtosis, the top singular value by power iteration), runs the
forward three times (the roles' trace and the output projections' on 8 tokens, the norms on the batch) and
reads each norm's factor. Its peer is what a user pays per step anyway: one training step (forward, loss,
backward, AdamW) of the same model on the same batch. Interleaved rounds, per-round ratio. Beside it, the
audit of a preset built on the meta device (shapes and config only) against building that model on meta.

    python benchmarks/bench_audit.py [--preset cpu-20m] [--meta-preset 1.5b] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import Row, Stat, add_common_args, check, interleaved, main, paired


def run(args: argparse.Namespace) -> list[Row]:
    from smallinit.auditing import audit
    from smallinit.config import ModelConfig
    from smallinit.model import Transformer

    cfg = ModelConfig.preset(args.preset)
    model = Transformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (args.batch, 65), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        model(x[:, :-1], targets=x[:, 1:]).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = interleaved(
        {"audit": lambda: audit(model, x[:, :-1]), "step": step}, rounds=args.rounds, clock=args.clock
    )
    ratio = paired(t["audit"], t["step"])  # audit time in training steps
    target, ok = check(ratio, at_most=10.0)
    shape = f"{args.preset}, batch {args.batch} × 64"
    meta_cfg = ModelConfig.preset(args.meta_preset)

    def build() -> Transformer:
        with torch.device("meta"):
            return Transformer(meta_cfg)

    on_meta = build()
    m = interleaved(
        {"audit": lambda: audit(on_meta, config=meta_cfg), "build": build},
        rounds=args.rounds,
        clock=args.clock,
    )
    return [
        Row("audit", f"audit ÷ one training step ({shape})", ratio, "steps", target, ok),
        Row("audit", f"audit seconds ({shape})", Stat.of(t["audit"]), "s"),
        Row("audit", f"training step seconds ({shape})", Stat.of(t["step"]), "s"),
        Row("audit", f"audit ÷ building on meta ({args.meta_preset})", paired(m["audit"], m["build"]), "×"),
        Row("audit", f"audit seconds ({args.meta_preset} on meta)", Stat.of(m["audit"]), "s"),
    ]


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--rounds", type=int, default=2 if quick else 3)
    ap.add_argument("--preset", default="cpu-20m")
    ap.add_argument("--meta-preset", default="1.5b")
    ap.add_argument("--batch", type=int, default=4)
    add_common_args(ap)


if __name__ == "__main__":
    sys.exit(main(__doc__, add_args, run))
