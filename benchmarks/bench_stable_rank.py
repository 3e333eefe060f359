"""Time of stable rank (and mean |cos|) for every matrix of a preset, against a full-SVD reference.

Builds the preset at init (γ from the preset, default 1), then times, in one process:
  lanczos   smallinit.analysis.stable_rank for every ≥2-d parameter (Gram matrix + Lanczos)
  svdvals   the same ratio with σ₁ from torch.linalg.svdvals (full singular values) — the reference
  cosine    mean |cos| over row pairs (rows sampled to 1024 for the embedding / LM head)
and reports the largest relative difference between the two stable ranks.

    python benchmarks/bench_stable_rank.py [--preset 0.1b] [--no-svd] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from common import machine

from smallinit import ModelConfig, Transformer
from smallinit.measures.condensation import frobenius_sq, named_matrices, sampled_mean_abs_cos, stable_rank


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="0.1b")
    ap.add_argument("--no-svd", action="store_true", help="skip the (slow) full-SVD reference")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = Transformer(ModelConfig.preset(args.preset))
    mats = named_matrices(model)
    n_params = sum(W.numel() for W in mats.values())
    out = {"preset": args.preset, "matrices": len(mats), "params": n_params, "machine": machine()}

    t0 = time.perf_counter()
    fast = {n: stable_rank(W) for n, W in mats.items()}
    out["lanczos_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for W in mats.values():
        sampled_mean_abs_cos(W)
    out["cosine_s"] = time.perf_counter() - t0
    if not args.no_svd:
        t0 = time.perf_counter()
        exact = {
            n: frobenius_sq(W) / torch.linalg.svdvals(W.detach())[0].item() ** 2 for n, W in mats.items()
        }
        out["svdvals_s"] = time.perf_counter() - t0
        out["max_rel_diff"] = max(abs(fast[n] - exact[n]) / exact[n] for n in mats)
    print(
        f"{args.preset}: {len(mats)} matrices, {n_params / 1e6:.1f} M weights; stable rank (Lanczos) "
        f"{out['lanczos_s']:.1f} s, mean |cos| {out['cosine_s']:.1f} s"
        + (
            ""
            if args.no_svd
            else f"; svdvals reference {out['svdvals_s']:.1f} s, "
            f"largest relative difference {out['max_rel_diff']:.1e}"
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
