"""What a Python loop over experts costs: one MoE layer, grouped_mm dispatch against one matmul per expert.

The active compute is held fixed (top_k experts of width d_expert per token) while the expert count E grows,
so any slowdown with E is dispatch overhead. Each round times both dispatches on the same layer and the
same tokens (forward + backward), interleaved; reports the median time per call and the median per-round
ratio loop / grouped. CPU only (grouped_mm runs eagerly on the CPU in our setup).

    python benchmarks/bench_moe_dispatch.py --threads 1 --experts 8,32,128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from smallinit import MoEConfig, gamma_init_
from smallinit.model import MoE


def call(layer: MoE, x: torch.Tensor, dispatch: str) -> None:
    layer.dispatch = dispatch
    y, aux = layer(x)
    (y.square().mean() + aux).backward()
    layer.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", default="8,32,128", help="comma-separated expert counts")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-expert", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3, help="timed calls per dispatch per round")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--json", default="bench_moe_dispatch.json", metavar="PATH")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    x = torch.randn(args.tokens, args.d_model, generator=torch.Generator().manual_seed(0))
    rows = []
    for E in (int(e) for e in args.experts.split(",")):
        layer = MoE(args.d_model, args.d_expert, MoEConfig(num_experts=E, top_k=args.top_k))
        gamma_init_(layer, 0.5, generator=torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {"grouped": [], "loop": []}
        for d in times:
            call(layer, x, d)  # warm-up
        for _ in range(args.repeats):
            for d in times:
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call(layer, x, d)
                times[d].append((time.perf_counter() - t0) / args.calls)
        ratio = statistics.median(lp / gr for lp, gr in zip(times["loop"], times["grouped"]))
        rows.append(
            {
                "experts": E,
                "grouped_ms": 1e3 * statistics.median(times["grouped"]),
                "loop_ms": 1e3 * statistics.median(times["loop"]),
                "loop_over_grouped": ratio,
            }
        )

    print(
        f"one MoE layer, forward + backward | {args.tokens} tokens, d_model {args.d_model}, d_expert "
        f"{args.d_expert}, top-{args.top_k} | {torch.get_num_threads()} threads | median of {args.repeats} rounds"
    )
    print(f"{'experts':>8} {'grouped ms':>11} {'loop ms':>9} {'loop/grouped':>13}")
    for r in rows:
        print(
            f"{r['experts']:>8} {r['grouped_ms']:>11.1f} {r['loop_ms']:>9.1f} {r['loop_over_grouped']:>13.2f}"
        )
    result = {
        "benchmark": "moe_dispatch",
        "tokens": args.tokens,
        "d_model": args.d_model,
        "d_expert": args.d_expert,
        "top_k": args.top_k,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
