"""Loss comparisons: the gap L(a) − L(b) at the end of training, paired by seed, with its course along training
and its trend.

The verdict is the gap at the budget the runs were trained to, stated as such. Beside it, the trend: each
seed's least-squares slope of the gap against log tokens over the second half of training (every evaluation
from half the budget on), tested across seeds with Student-t. Per doubling of tokens the gap moves by
slope·ln 2. At α = 0.05 the trend is

* **moving** (closing or widening) when the slope's interval excludes 0: a flat gap is called moving 5 % of
  the time;
* **settled** when the interval of the movement per doubling lies within ±½ the gap's seed sd at the budget:
  a gap moving one seed sd per half budget is called settled at most 2.5 % of the time;
* **undetermined** otherwise (too few seeds or evaluations to tell).

A gap closing toward the other sign gets its extrapolated crossing: where the mean line a + b·log τ reaches 0,
with Fieller's interval for the ratio −a/b (unbounded when the slope's interval reaches 0).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from .comparison import Comparison
from .preconditions import regime_problem
from .selection import Runs, lost_problem, lost_seeds, paired

TREND_ALPHA = 0.05
SETTLED_FRACTION = 0.5  # of the seed sd at the budget: the most a settled gap moves per doubling of tokens
MOVING, SETTLED, UNDETERMINED = "moving", "settled", "undetermined"


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


def second_half(tokens: np.ndarray) -> np.ndarray:
    """The evaluations from half the budget on (tokens > 0)."""
    tokens = np.asarray(tokens, dtype=float)
    return (tokens >= tokens[-1] / 2 * (1 - 1e-9)) & (tokens > 0)


def seed_lines(gaps: np.ndarray, log_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per seed (last-but-one axis), the gap's least-squares line against log tokens over the last axis:
    (value at the last point, slope)."""
    x = np.asarray(log_tokens, dtype=float)
    xc = x - x.mean()
    slope = (np.asarray(gaps) * xc).sum(-1) / (xc**2).sum()
    at_end = np.asarray(gaps).mean(-1) + slope * (x[-1] - x.mean())
    return at_end, slope


def trend_state(slopes: np.ndarray, seed_sd: np.ndarray, alpha: float = TREND_ALPHA) -> np.ndarray:
    """MOVING / SETTLED / UNDETERMINED from per-seed slopes (last axis) and the gap's seed sd at the budget."""
    slopes = np.asarray(slopes, dtype=float)
    n = slopes.shape[-1]
    m, se = slopes.mean(-1), slopes.std(-1, ddof=1) / math.sqrt(n)
    half = stats.t.ppf(1 - alpha / 2, n - 1) * se
    moving = np.abs(m) > half
    settled = ~moving & ((np.abs(m) + half) * math.log(2) < SETTLED_FRACTION * np.asarray(seed_sd))
    return np.where(moving, MOVING, np.where(settled, SETTLED, UNDETERMINED))


def crossing(at_end: np.ndarray, slopes: np.ndarray, alpha: float = TREND_ALPHA) -> tuple[float, float, float]:
    """Where the mean line reaches 0, in log tokens relative to the last evaluation: estimate and Fieller's
    (1 − alpha) interval (±inf when unbounded)."""
    n = len(slopes)
    a, b = float(np.mean(at_end)), float(np.mean(slopes))
    cov = np.cov(np.vstack([at_end, slopes])) / n
    t2 = stats.t.ppf(1 - alpha / 2, n - 1) ** 2
    qa, qb, qc = b * b - t2 * cov[1, 1], a * b - t2 * cov[0, 1], a * a - t2 * cov[0, 0]
    est = -a / b if b else math.inf
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:  # the slope's interval reaches 0: no bound on where (or whether) it crosses
        return est, -math.inf, math.inf
    r = math.sqrt(disc)
    return est, (-qb - r) / qa, (-qb + r) / qa


def gap_trend(traj: dict[str, Any] | None) -> dict[str, Any] | None:
    """The gap's trend over the second half of training (module docstring), or None without 2 seeds and 3
    evaluations there."""
    if traj is None or len(traj["seeds"]) < 2:
        return None
    tokens = np.asarray(traj["tokens_per_param"], dtype=float)
    keep = second_half(tokens)
    if keep.sum() < 3:
        return None
    gaps = np.asarray(traj["gaps"], dtype=float)[:, keep]
    at_end, slopes = seed_lines(gaps, np.log(tokens[keep]))
    seed_sd = float(np.std(np.asarray(traj["gaps"])[:, -1], ddof=1))
    state = str(trend_state(slopes, seed_sd))
    per_doubling = float(np.mean(slopes)) * math.log(2)
    gap = float(np.mean(np.asarray(traj["gaps"])[:, -1]))
    out: dict[str, Any] = {"tokens_per_param": float(tokens[-1]), "state": state, "per_doubling": per_doubling,
                           "seed_sd": seed_sd, "slopes": slopes.tolist()}
    closing = np.sign(per_doubling) == -np.sign(gap)
    if state == MOVING:
        out["direction"] = "closing" if closing else "widening"
    words = {SETTLED: "settled", UNDETERMINED: "trend undetermined",
             MOVING: out.get("direction", "")}[state] + f" ({per_doubling:+.3f} per doubling of tokens)"
    if closing and per_doubling:
        est, lo, hi = crossing(at_end, slopes)
        cross = [float(tokens[-1] * math.exp(min(v, 700.0))) if v > -math.inf else 0.0 for v in (est, lo, hi)]
        out["crossing_tokens_per_param"] = cross
        if state == MOVING:
            words += (f", crossing extrapolated at ≈ {cross[0]:.3g} tokens/param [{cross[1]:.3g}, "
                      + (f"{cross[2]:.3g}]" if math.isfinite(cross[2]) else "unbounded]"))
    out["summary"] = words
    return out


def loss_comparison(label: str, a: Runs, b: Runs, paper: str, min_tpp: float, **kw: Any) -> Comparison:
    """L(a) − L(b) at the end of training, paired by seed, testable in the trained regime, with its trend."""
    traj = gap_trajectory(a, b)
    c = Comparison.by_seed(label, paired(a, b), paper, trajectory=traj, trend=gap_trend(traj), lost=lost_seeds(a, b),
                           **kw)
    c.untestable = lost_problem(c.lost) or regime_problem([*a, *b], traj, min_tpp)  # lost seeds: not judged
    return c
