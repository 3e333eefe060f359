"""Loss comparisons: the gap L(a) − L(b) at the end of training, paired by seed, with its course along training."""

from __future__ import annotations

from typing import Any

import numpy as np

from .comparison import Comparison
from .preconditions import regime_problem
from .selection import Runs, paired


def gap_trajectory(a: Runs, b: Runs) -> dict[str, Any] | None:
    """L(a) − L(b) per seed at every evaluation both runs of a seed share: steps, tokens per non-embedding
    parameter (of a), per-seed gaps, and their mean and sd over seeds."""
    ca = {seed: (dict(r.val_curve), r) for seed, r in a.run_by_seed().items()}
    cb = {seed: dict(r.val_curve) for seed, r in b.run_by_seed().items()}
    seeds = sorted(set(ca) & set(cb))
    if not seeds:
        return None
    steps = sorted(set.intersection(*[set(ca[s][0]) & set(cb[s]) for s in seeds]))
    if not steps:
        return None
    gaps = [[ca[s][0][t] - cb[s][t] for t in steps] for s in seeds]
    run = ca[seeds[0]][1]
    arr = np.asarray(gaps)
    return {"steps": steps, "tokens_per_param": [run.tokens_per_param(t) for t in steps], "seeds": seeds,
            "gaps": gaps, "mean": arr.mean(axis=0).tolist(),
            "sd": (arr.std(axis=0, ddof=1) if len(seeds) > 1 else np.full(len(steps), np.nan)).tolist()}


def loss_comparison(label: str, a: Runs, b: Runs, paper: str, min_tpp: float) -> Comparison:
    """L(a) − L(b) at the end of training, paired by seed, testable only in the trained, settled regime."""
    traj = gap_trajectory(a, b)
    c = Comparison.by_seed(label, paired(a, b), paper, trajectory=traj)
    c.untestable = regime_problem([*a, *b], traj, min_tpp)
    return c
