"""MoE under ``train.compile=true``: the dispatch torch.compile now traces (``smallinit::expert_mm``) against the
one it traced before (a matmul per expert over ``counts.tolist()``, kept as ``MoE.dispatch="loop"``).

Two models with the same weights, their blocks compiled as the trainer compiles them, train on the same
batches (forward, loss with the router losses, backward, AdamW). Each first runs ``--warmup`` steps alone, on
batches whose routing differs, while Dynamo's counters record its graphs, graph breaks and compiled frames;
then rounds time one step of each, interleaved, and the per-round ratio old / new is summarised by its median.
The losses of the two are checked to agree at every step.

    python benchmarks/bench_moe_compile.py --preset cpu-moe-1m --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from smallinit import ModelConfig, Transformer
from smallinit.config import TrainConfig
from smallinit.model import MoE
from smallinit.train.distributed import compile_for_training
from smallinit.train.optim import build_optimizer

DISPATCH = {
    "new": "auto",
    "old": "loop",
}  # "auto" under compile is expert_mm; "loop" is what compile ran before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-moe-1m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: the process's CPU seconds")
    ap.add_argument("--json", default="bench_moe_compile.json", metavar="PATH")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    cfg = ModelConfig.preset(args.preset)
    gen = torch.Generator().manual_seed(0)

    def batch() -> torch.Tensor:
        return torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=gen)

    contestants = {}
    for name, dispatch in DISPATCH.items():
        model = Transformer(cfg, seed=0)
        for m in model.modules():
            if isinstance(m, MoE):
                m.dispatch = dispatch
        for block in model.blocks:
            compile_for_training(block)
        contestants[name] = (model, build_optimizer(model, TrainConfig()))

    def step(name: str, tokens: torch.Tensor) -> float:
        model, opt = contestants[name]
        out = model(tokens[:, :-1], tokens[:, 1:])
        (out.loss + out.aux_loss).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    warm = [batch() for _ in range(args.warmup)]
    compiled = {}
    for name in contestants:
        torch._dynamo.reset()  # each its own compiles: what a fresh process would do
        counters.clear()
        t0 = time.perf_counter()
        losses = [step(name, tokens) for tokens in warm]
        compiled[name] = {
            "graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "frames_compiled": counters["frames"]["total"],
            "resumed_frames": len(counters["resumes"]),
            "warmup_s": time.perf_counter() - t0,
            "losses": losses,
        }
    times: dict[str, list[float]] = {n: [] for n in contestants}
    gaps = [max(abs(a - b) for a, b in zip(compiled["old"]["losses"], compiled["new"]["losses"]))]
    for r in range(args.rounds):
        tokens = batch()
        order = list(contestants)[r % 2 :] + list(contestants)[: r % 2]
        losses = {}
        for name in order:
            t0 = clock()
            losses[name] = step(name, tokens)
            times[name].append(clock() - t0)
        gaps.append(abs(losses["old"] - losses["new"]))
    ratio = statistics.median(o / n for o, n in zip(times["old"], times["new"]))
    result = {
        "benchmark": "moe_compile",
        "preset": args.preset,
        "batch": [args.batch, args.seq],
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "torch": torch.__version__,
        "compiled": {n: {k: v for k, v in c.items() if k != "losses"} for n, c in compiled.items()},
        "step_ms": {n: 1e3 * statistics.median(t) for n, t in times.items()},
        "old_over_new": ratio,
        "ratio_min_max": [
            min(o / n for o, n in zip(times["old"], times["new"])),
            max(o / n for o, n in zip(times["old"], times["new"])),
        ],
        "max_loss_gap": max(gaps),
    }
    print(
        f"{args.preset} compiled, batch {args.batch} × {args.seq}, {torch.get_num_threads()} threads, "
        f"median of {args.rounds} rounds after {args.warmup} warm-up steps"
    )
    for name, c in result["compiled"].items():
        print(
            f"  {name} ({DISPATCH[name]}): {c['graphs']} graphs, {c['graph_breaks']} breaks, "
            f"{c['frames_compiled']} frames compiled ({c['resumed_frames']} resumed after a break), "
            f"warm-up {c['warmup_s']:.1f} s, step {result['step_ms'][name]:.1f} ms"
        )
    print(
        f"  step time old / new: {ratio:.2f} (rounds {result['ratio_min_max'][0]:.2f}–{result['ratio_min_max'][1]:.2f}); largest loss gap {result['max_loss_gap']:.2e}"
    )
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
