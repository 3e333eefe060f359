"""γ-init speed: parameters per second of ``gamma_init_`` against ``torch.nn.init.normal_`` on the same tensors.

Drawing the numbers is the cost that cannot be avoided, so the peer is the bare draw: ``normal_`` with the
same seeded generator on every matrix and embedding of the same model, in the same order. gamma_init_
adds what it needs to know what to draw (module types, the (1 + w) norm probe, one forward on the meta
device, the architecture's own inits) and sets norms and biases. Interleaved rounds, per-round ratio.
The model is a Hugging Face Llama (``--hidden``, ``--layers``, vocabulary 32 000) built on the meta
device and materialised with ``to_empty``, the path large models take.

    python benchmarks/bench_init.py [--hidden 512] [--layers 8] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import Row, Stat, add_common_args, check, interleaved, main, paired


def build(hidden: int, layers: int):
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 256),
        vocab_size=32000,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to_empty(device="cpu")


def run(args: argparse.Namespace) -> list[Row]:
    from smallinit import gamma_init_

    model = build(args.hidden, args.layers)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    n = sum(p.numel() for p in model.parameters())

    def ours() -> None:
        gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))

    def peer() -> None:
        g = torch.Generator().manual_seed(0)
        for p in matrices:
            torch.nn.init.normal_(p, 0.0, p.shape[-1] ** -1.0, generator=g)

    t = interleaved({"gamma_init_": ours, "normal_": peer}, rounds=args.rounds, clock=args.clock)
    ratio = paired(t["normal_"], t["gamma_init_"])  # throughput ratio = peer time / our time
    target, ok = check(ratio, at_least=0.9)
    shape = f"Llama d={args.hidden} L={args.layers}, {n / 1e6:.0f} M params"
    return [
        Row("init", f"gamma_init_ ÷ nn.init.normal_ parameters/s ({shape})", ratio, "×", target, ok),
        Row(
            "init",
            f"gamma_init_ parameters/s ({shape})",
            Stat.of([n / s for s in t["gamma_init_"]]),
            "params/s",
        ),
        Row(
            "init",
            f"nn.init.normal_ parameters/s ({shape})",
            Stat.of([n / s for s in t["normal_"]]),
            "params/s",
        ),
    ]


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--rounds", type=int, default=2 if quick else 3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4 if quick else 8)
    add_common_args(ap)


if __name__ == "__main__":
    sys.exit(main(__doc__, add_args, run))
