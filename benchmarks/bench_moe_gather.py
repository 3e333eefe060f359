"""MoE dispatch and combine: the deterministic ones (``MoE.to_experts``, ``from_experts``) against those they replaced.

Before, the layer gathered the (token, slot) rows as ``x[order // k]``: autograd's backward of it adds a
token's k gradients into one row in whatever order the threads run, so runs with top_k >= 3 were not
bit-reproducible; the combine scattered the experts' rows into zeros. Now both are gathers through the
permutation and its inverse, forward and backward (``smallinit.model.moe.GatherRows``): a token's k
gradients are summed in slot order. The peer is the old pair, kept here only, as a subclass.

One MoE layer, forward + backward (``--tokens`` × ``--d-model``, E experts of width ``--d-expert``), at
top_k 2 and 6; eager, and with ``--compile`` also both under torch.compile. Interleaved rounds, the
per-round ratio old time / new time (≥ 1: no slowdown). Each row also checks the numerics: the forward
equal bit for bit, the input's gradient within float rounding of the old one.

    python benchmarks/bench_moe_gather.py [--experts 32] [--rounds 7] [--compile] [--threads N]
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import Row, Stat, add_common_args, check, interleaved, main, paired

from smallinit import MoEConfig, gamma_init_
from smallinit.model import MoE


class AccumulatingMoE(MoE):
    """The layer with the dispatch and combine it had before: autograd's gather, whose backward adds a token's
    k gradients into one row in thread order, and a scatter into zeros back."""

    @staticmethod
    def to_experts(x: torch.Tensor, order: torch.Tensor, slots: torch.Tensor, k: int) -> torch.Tensor:
        return x[order // k]

    @staticmethod
    def from_experts(ys: torch.Tensor, order: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(ys).index_copy(0, order, ys)


def contestant(cls: type[MoE], args: argparse.Namespace, top_k: int, compiled: bool):
    layer = cls(args.d_model, args.d_expert, MoEConfig(num_experts=args.experts, top_k=top_k))
    gamma_init_(layer, 0.5, generator=torch.Generator().manual_seed(0))
    fn = torch.compile(layer) if compiled else layer
    x = torch.randn(args.tokens, args.d_model, generator=torch.Generator().manual_seed(1)).requires_grad_()

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        y, aux = fn(x)
        (y.square().mean() + aux).backward()
        return y.detach(), x.grad

    return call


def run(args: argparse.Namespace) -> list[Row]:
    rows = []
    for compiled in [False, True] if args.compile else [False]:
        for top_k in (2, 6):
            new = contestant(MoE, args, top_k, compiled)
            old = contestant(AccumulatingMoE, args, top_k, compiled)
            (y_new, g_new), (y_old, g_old) = new(), old()  # also the compile, outside the timing
            gap = ((g_new - g_old).abs().max() / g_old.abs().max()).item()
            t = interleaved({"new": new, "old": old}, rounds=args.rounds, warmup=1, clock=args.clock)
            ratio = paired(t["old"], t["new"])
            target, ok = check(ratio, at_least=0.95)
            shape = (
                f"{'compiled' if compiled else 'eager'} top-{top_k} of {args.experts}, {args.tokens} tokens, "
                f"d {args.d_model}/{args.d_expert}"
            )
            note = (
                f"forward {'bit-equal' if torch.equal(y_new, y_old) else 'DIFFERS'}, input grad gap {gap:.1e}"
            )
            rows.append(Row("moe", f"dispatch old ÷ new step time ({shape})", ratio, "×", target, ok, note))
            rows.append(
                Row("moe", f"dispatch new fwd+bwd ms ({shape})", Stat.of([1e3 * s for s in t["new"]]), "ms")
            )
    return rows


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-expert", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3 if quick else 7)
    ap.add_argument("--compile", action="store_true", help="also both layers under torch.compile")
    add_common_args(ap)


if __name__ == "__main__":
    sys.exit(main(__doc__, add_args, run))
