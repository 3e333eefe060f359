"""Measure C4's best-lr sign-flip test over the unequal-noise grid and the power β its p needs.

    nice -n 5 python scripts/calibrate_best_lr.py --draws 4000 --out /tmp/best-lr-grid.npz

Simulates ``--draws`` null studies at each point of tests/support/best_lr.py's GRID (optimum sharp, flat or plateau;
σ ratio 1–3 with either γ the noisier; 8, 10, 16 seeds) with the claim's own test, and prints each point's size each
way at α = 0.05 with the p as it is and calibrated (p^β, ``--beta``, default c4.BEST_LR_BETA), the worst size at
each level α' in [0.005, 0.05], and the largest β that keeps the worst size each way ≤ α'/2 at every one of them
(and at each alone), by the point estimates and allowing each size one Monte Carlo standard error above α'/2 (at
the small levels a few studies decide, so the worst of 126 point estimates exceeds α'/2 by chance alone); beside it,
the smallest constant factor κ (p × κ) that would do the same. ``--out`` keeps every study's (mean, p), and a
second run with the same file only re-reads it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from smallinit.study.judging.claims.c4 import BEST_LR_BETA  # noqa: E402
from support.best_lr import GRID, grid_point, sizes  # noqa: E402

LEVELS = np.geomspace(0.005, 0.05, 11)
BETAS = np.round(np.arange(1.0, 0.3, -0.01), 2)
KAPPAS = np.round(np.arange(1.0, 40.0, 0.05), 2)


def worst(results, alpha: float, calibrate) -> float:
    """The largest share, over the grid and the two ways, of null studies decided at ``alpha`` by calibrate(p)."""
    return max(
        max(np.mean((calibrate(p) <= alpha) & (mean > 0)), np.mean((calibrate(p) <= alpha) & (mean < 0)))
        for mean, p in results.values()
    )


def holds(results, levels, mc_sds: float, calibrate) -> bool:
    """The worst size each way is ≤ α'/2 (+ ``mc_sds`` binomial standard errors) at every level in ``levels``."""
    draws = len(next(iter(results.values()))[1])
    return all(
        worst(results, a, calibrate) <= a / 2 + mc_sds * np.sqrt(a / 2 * (1 - a / 2) / draws) for a in levels
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--beta", type=float, default=BEST_LR_BETA)
    ap.add_argument("--out", type=Path, help="an .npz of every study's (mean, p), re-read when it exists")
    args = ap.parse_args()
    results = {}
    if args.out and args.out.exists():
        kept = np.load(args.out)
        results = {point: kept[repr(point)] for point in GRID if repr(point) in kept}
    for point in GRID:
        if point not in results:
            start = time.time()
            results[point] = grid_point(point, args.draws)
            print(f"{point}: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
            if args.out:
                np.savez(args.out, **{repr(k): v for k, v in results.items()})
    print(
        f"{'optimum':8} {'σ ratio':>8} {'noisier':>8} {'seeds':>5} {'agree':>7} {'disagree':>8}  calibrated"
    )
    for (shape, ratio, noisier, n), (mean, p) in results.items():
        old, cal = sizes(mean, p, 0.05), sizes(mean, p, 0.05, args.beta)
        who = "—" if ratio == 1 else ("γ .5", "γ 1")[noisier]
        print(
            f"{shape:8} {ratio:8g} {who:>8} {n:5d} {old[0]:7.2%} {old[1]:8.2%}  {cal[0]:6.2%} {cal[1]:6.2%}"
        )
    for a in LEVELS:
        print(
            f"α' = {a:.4f}: worst size each way {worst(results, a, lambda p: p):.3%} as it is, "
            f"{worst(results, a, lambda p: p**args.beta):.3%} with p^{args.beta:g}, against α'/2 = {a / 2:.3%}"
        )
    for mc_sds in (0, 1):
        beta = next((b for b in BETAS if holds(results, LEVELS, mc_sds, lambda p, b=b: p**b)), None)
        kappa = next((k for k in KAPPAS if holds(results, LEVELS, mc_sds, lambda p, k=k: k * p)), None)
        alone = [next(b for b in BETAS if holds(results, [a], mc_sds, lambda p, b=b: p**b)) for a in LEVELS]
        print(
            f"allowing {mc_sds} Monte Carlo se: largest β {beta} (each level alone {min(alone)}–{max(alone)}); "
            f"smallest κ {kappa}"
        )


if __name__ == "__main__":
    main()
