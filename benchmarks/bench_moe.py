"""Throughput of an MoE model against a dense model with the same ACTIVE parameter count, in one run.

Three contestants, timed interleaved (round r runs each once) so drifting machine load hits all alike:
  dense        the MoE config with ``moe`` removed and d_ff = the MoE layer's active width
               (top_k · d_expert [+ d_expert shared] + router params / 3·d_model, rounded)
  moe-grouped  the MoE model, experts run by torch.nn.functional.grouped_mm (CPU only)
  moe-loop     the same weights, one matmul per expert (a Python loop over experts)
A step is forward + backward + AdamW on random tokens (``--mode train``) or a no-grad forward (``forward``).
Reports the median tokens/s over ``--repeats`` rounds and the median over rounds of each round's ratio to
dense (robust to load that drifts between rounds); writes the numbers as JSON.

    python benchmarks/bench_moe.py                      # cpu-moe-5m, batch 8 × 256 tokens
    python benchmarks/bench_moe.py --threads 1 --mode forward --vocab 257 --json moe-forward.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from smallinit import ModelConfig, Transformer
from smallinit.model import MoE


def dense_twin(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` without MoE, its feed-forward as wide as the MoE layer's active parameters."""
    m = cfg.moe
    if m.every_n_layers != 1:
        raise SystemExit("bench_moe: use a config whose every layer is MoE (moe.every_n_layers = 1)")
    d_expert = m.d_expert or cfg.d_ff
    active = 3 * cfg.d_model * d_expert * (m.top_k + m.shared_expert) + cfg.d_model * m.num_experts
    return dataclasses.replace(cfg, moe=None, d_ff=round(active / (3 * cfg.d_model)))


def set_dispatch(model: torch.nn.Module, dispatch: str) -> None:
    for mod in model.modules():
        if isinstance(mod, MoE):
            mod.dispatch = dispatch


def make_step(model: Transformer, tokens: torch.Tensor, mode: str):
    if mode == "forward":
        model.eval()

        @torch.no_grad()
        def step() -> None:
            model(tokens)

        return step
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step() -> None:
        out = model(tokens[:, :-1], tokens[:, 1:])
        loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-moe-5m", help="an MoE preset (default cpu-moe-5m)")
    ap.add_argument(
        "--vocab",
        type=int,
        default=0,
        help="vocabulary size; 0 = the preset's (a small one, e.g. "
        "257 for the byte tokenizer, leaves the feed-forward a larger share of the time)",
    )
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--mode", choices=("train", "forward"), default="train")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per contestant per round")
    ap.add_argument("--repeats", type=int, default=7, help="rounds; the median is reported")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default="bench_moe.json", metavar="PATH")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    moe_cfg = ModelConfig.preset(args.preset, max_seq_len=max(args.seq + 1, 16))
    moe_cfg.vocab_size = args.vocab or moe_cfg.vocab_size
    if moe_cfg.moe is None:
        raise SystemExit(f"bench_moe: {args.preset} is not an MoE preset")
    models = {"dense": Transformer(dense_twin(moe_cfg), seed=0).to(device)}
    moe = Transformer(moe_cfg, seed=0).to(device)
    models["moe-grouped"], models["moe-loop"] = moe, Transformer(moe_cfg, seed=0).to(device)
    set_dispatch(models["moe-grouped"], "grouped")
    set_dispatch(models["moe-loop"], "loop")
    contestants = list(models) if device.type == "cpu" else ["dense", "moe-loop"]

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, moe_cfg.vocab_size, (args.batch, args.seq + 1), generator=gen).to(device)
    steps = {name: make_step(models[name], tokens, args.mode) for name in contestants}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for name in contestants:  # warm-up: allocator, kernels, optimizer state
        steps[name]()
        steps[name]()
    per_round: dict[str, list[float]] = {name: [] for name in contestants}
    for _ in range(args.repeats):
        for name in contestants:
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            sync()
            per_round[name].append(args.batch * args.seq * args.steps / (time.perf_counter() - t0))

    rows = []
    for name in contestants:
        m = models[name]
        # the ratio is taken within each round (same machine load), then the median over rounds
        ratios = [a / b for a, b in zip(per_round[name], per_round["dense"])]
        rows.append(
            {
                "model": name,
                "params": m.num_params(),
                "params_active": m.num_params(active=True),
                "tokens_per_s": statistics.median(per_round[name]),
                "ratio_to_dense": statistics.median(ratios),
                "rounds": per_round[name],
            }
        )
    print(
        f"{args.preset} (vocab {moe_cfg.vocab_size}) vs dense twin | {args.mode} | batch {args.batch} × {args.seq} tokens | "
        f"{args.device}, {torch.get_num_threads()} threads | median of {args.repeats} rounds × {args.steps} steps"
    )
    print(f"{'model':<12} {'params':>12} {'active':>12} {'tokens/s':>10} {'× dense':>8}")
    for r in rows:
        print(
            f"{r['model']:<12} {r['params']:>12,} {r['params_active']:>12,} {r['tokens_per_s']:>10,.0f} "
            f"{r['ratio_to_dense']:>8.2f}"
        )
    result = {
        "benchmark": "moe_vs_dense_same_active",
        "preset": args.preset,
        "vocab": moe_cfg.vocab_size,
        "mode": args.mode,
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "repeats": args.repeats,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "dense_d_ff": models["dense"].config.d_ff,
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
