"""Loss comparisons: the gap L(a) − L(b) at the end of training, paired by seed, with its course along training
and its trend.

The verdict is the gap at the budget the runs were trained to, stated as such. Beside it, the trend: each
seed's least-squares slope of the gap against log tokens over the second half of training (the evaluation
nearest half the budget and every one after: with evaluations every ⌊T/8⌋ steps, the one at 4·⌊T/8⌋, just
short of T/2, is in), tested across seeds with Student-t. Per doubling of tokens the gap moves by
slope·ln 2. At α = 0.05 the trend is

* **moving** (where it heads: below) when the slope's interval excludes 0: a flat gap is called moving 5 % of
  the time;
* **settled** when the interval of the movement per doubling lies within ±½ the gap's seed sd at the budget:
  a gap moving one seed sd per half budget is called settled at most 2.5 % of the time;
* **undetermined** otherwise (too few seeds or evaluations to tell).

A moving gap says where it heads:

* **crossed**: the mean line a + b·log τ reaches 0 inside the fitted range, so the gap changed sign in the
  second half; where, with Fieller's interval for the ratio −a/b;
* **closing** with a crossing extrapolated only when the gap is still moving at the end: each seed's
  quadratic in log τ over the same evaluations gives the slope at the last one and the curvature; the end
  slope's interval excludes 0 in the closing direction and the curvature's does not say the gap
  decelerates. Then the mean line's zero, with Fieller's interval (unbounded when the slope's reaches 0);
* **closing; crossing not extrapolated** (direction "converging") when a closing gap is not shown to be still
  moving at the end (it slows toward 0, or 3 evaluations cannot tell), since a straight line drawn through a gap
  that decays toward 0 reaches 0 at a confident, wrong point. The words withhold the crossing, never deny it: a
  gap still closing may cross later;
* **widening** otherwise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from smallinit.study.judging.claims.comparison import Comparison
from smallinit.study.judging.claims.preconditions import regime_problem
from smallinit.study.judging.claims.selection import (
    Runs,
    lost_problem,
    lost_seeds,
    no_value,
    paired,
    val_loss,
)

TREND_ALPHA = 0.05
SETTLED_FRACTION = 0.5  # of the seed sd at the budget: the most a settled gap moves per doubling of tokens
MOVING, SETTLED, UNDETERMINED = "moving", "settled", "undetermined"
DIRECTION_WORDS = {  # what the trend line says of a moving gap, by its direction: only what is known
    "crossed": "crossed 0 at",
    "widening": "widening",
    "closing": "closing",  # followed by where the crossing is extrapolated
    "converging": "closing; crossing not extrapolated: not shown to be still moving at the end",
}


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
    return {
        "steps": steps,
        "tokens_per_param": [run.tokens_per_param(t) for t in steps],
        "seeds": seeds,
        "gaps": gaps,
        "mean": arr.mean(axis=0).tolist(),
        "sd": (arr.std(axis=0, ddof=1) if len(seeds) > 1 else np.full(len(steps), np.nan)).tolist(),
    }


def second_half(tokens: np.ndarray) -> np.ndarray:
    """The evaluations from the one nearest half the budget (in log tokens; the earlier on a tie) on, tokens > 0.
    Nearest rather than at-or-after: a schedule of every ⌊T/8⌋ steps evaluates just short of T/2."""
    tokens = np.asarray(tokens, dtype=float)
    positive = tokens > 0
    distance = np.abs(np.log(np.where(positive, tokens, 1.0) / (tokens[-1] / 2)))
    start = int(np.argmin(np.where(positive, distance + 1e-9 * (tokens > tokens[-1] / 2), np.inf)))
    return np.arange(len(tokens)) >= start


def seed_lines(gaps: np.ndarray, log_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per seed (last-but-one axis), the gap's least-squares line against log tokens over the last axis:
    (value at the last point, slope)."""
    x = np.asarray(log_tokens, dtype=float)
    xc = x - x.mean()
    slope = (np.asarray(gaps) * xc).sum(-1) / (xc**2).sum()
    at_end = np.asarray(gaps).mean(-1) + slope * (x[-1] - x.mean())
    return at_end, slope


def seed_curves(gaps: np.ndarray, log_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per seed (last-but-one axis), the gap's least-squares quadratic in log tokens over the last axis (≥ 4
    points): (slope at the last point, curvature)."""
    u = np.asarray(log_tokens, dtype=float) - float(log_tokens[-1])
    coef = np.einsum(
        "pk,...k->p...", np.linalg.pinv(np.stack([np.ones_like(u), u, u * u], 1)), np.asarray(gaps)
    )
    return coef[1], coef[2]


def _excludes_zero(values: np.ndarray, sign: np.ndarray, alpha: float) -> np.ndarray:
    """Whether the t-interval of the mean over the last axis lies wholly on the side ``sign`` of 0."""
    n = values.shape[-1]
    half = stats.t.ppf(1 - alpha / 2, n - 1) * values.std(-1, ddof=1) / math.sqrt(n)
    return sign * values.mean(-1) > half


def still_moving(gaps: np.ndarray, log_tokens: np.ndarray, alpha: float = TREND_ALPHA) -> np.ndarray:
    """Whether a closing gap (seeds on the last-but-one axis, evaluations on the last) is shown still moving at
    its last evaluation: the quadratic's end slope excludes 0 toward 0 and its curvature does not show the gap
    slowing down. False with fewer than 4 evaluations, which cannot tell."""
    gaps = np.asarray(gaps, dtype=float)
    if gaps.shape[-1] < 4:
        return np.zeros(gaps.shape[:-2], dtype=bool)
    end_slope, curvature = seed_curves(gaps, log_tokens)
    towards = -np.sign(gaps[..., -1].mean(-1))  # closing: the slope has the sign opposite to the gap's
    return _excludes_zero(end_slope, towards, alpha) & ~_excludes_zero(curvature, -towards, alpha)


def trend_state(slopes: np.ndarray, seed_sd: np.ndarray, alpha: float = TREND_ALPHA) -> np.ndarray:
    """MOVING / SETTLED / UNDETERMINED from per-seed slopes (last axis) and the gap's seed sd at the budget."""
    slopes = np.asarray(slopes, dtype=float)
    n = slopes.shape[-1]
    m, se = slopes.mean(-1), slopes.std(-1, ddof=1) / math.sqrt(n)
    half = stats.t.ppf(1 - alpha / 2, n - 1) * se
    moving = np.abs(m) > half
    settled = ~moving & ((np.abs(m) + half) * math.log(2) < SETTLED_FRACTION * np.asarray(seed_sd))
    return np.where(moving, MOVING, np.where(settled, SETTLED, UNDETERMINED))


def crossing(
    at_end: np.ndarray, slopes: np.ndarray, alpha: float = TREND_ALPHA
) -> tuple[float, float, float]:
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


def trend_course(
    gaps: np.ndarray, tokens: np.ndarray, alpha: float = TREND_ALPHA
) -> tuple[np.ndarray, np.ndarray]:
    """(state, direction) of gaps (seeds on the last-but-one axis, every evaluation on the last, any leading axes)
    at ``tokens`` per parameter, over the second half (module docstring): the direction of a moving gap is
    "crossed", "closing" (a crossing extrapolated), "converging" or "widening", "" otherwise."""
    gaps, tokens = np.asarray(gaps, dtype=float), np.asarray(tokens, dtype=float)
    keep = second_half(tokens)
    x = np.log(tokens[keep])
    at_end, slopes = seed_lines(gaps[..., keep], x)
    state = trend_state(slopes, gaps[..., -1].std(-1, ddof=1), alpha)
    level, slope = at_end.mean(-1), slopes.mean(-1)
    closing = np.sign(slope) == -np.sign(level)
    with np.errstate(divide="ignore", invalid="ignore"):
        crossed = ~closing & (-level / slope >= x[0] - x[-1])  # the mean line's zero inside the fitted range
    direction = np.where(
        crossed,
        "crossed",
        np.where(
            ~closing, "widening", np.where(still_moving(gaps[..., keep], x, alpha), "closing", "converging")
        ),
    )
    return state, np.where(state == MOVING, direction, "")


def gap_trend(traj: dict[str, Any] | None) -> dict[str, Any] | None:
    """The gap's trend over the second half of training (module docstring), or None without 2 seeds and 3
    evaluations there."""
    if traj is None or len(traj["seeds"]) < 2:
        return None
    tokens = np.asarray(traj["tokens_per_param"], dtype=float)
    keep = second_half(tokens)
    if keep.sum() < 3:
        return None
    gaps = np.asarray(traj["gaps"], dtype=float)
    at_end, slopes = seed_lines(gaps[:, keep], np.log(tokens[keep]))
    state, direction = (str(v) for v in trend_course(gaps, tokens))
    seed_sd = float(np.std(gaps[:, -1], ddof=1))
    per_doubling = float(np.mean(slopes)) * math.log(2)
    out: dict[str, Any] = {
        "tokens_per_param": float(tokens[-1]),
        "state": state,
        "per_doubling": per_doubling,
        "seed_sd": seed_sd,
        "slopes": slopes.tolist(),
        "from_tokens_per_param": float(tokens[keep][0]),
    }
    est, lo, hi = crossing(at_end, slopes)
    cross = [float(tokens[-1] * math.exp(min(v, 700.0))) if v > -math.inf else 0.0 for v in (est, lo, hi)]
    interval = f"[{cross[1]:.3g}, " + (f"{cross[2]:.3g}]" if math.isfinite(cross[2]) else "unbounded]")
    rate = f"({per_doubling:+.3f} per doubling of tokens, fitted from {tokens[keep][0]:.3g} tokens/param)"
    if direction:
        out["direction"] = direction
    if direction == "crossed":
        out["crossed_tokens_per_param"] = cross
    if direction == "closing":
        out["crossing_tokens_per_param"] = cross
    words = (
        DIRECTION_WORDS[direction] if direction else ("settled" if state == SETTLED else "trend undetermined")
    )
    out["summary"] = {
        "crossed": f"{words} ≈ {cross[0]:.3g} tokens/param {interval} {rate}",
        "closing": f"{words} {rate}, crossing extrapolated at ≈ {cross[0]:.3g} tokens/param {interval}",
    }.get(direction, f"{words} {rate}")
    return out


def loss_comparison(label: str, a: Runs, b: Runs, paper: str, min_tpp: float, **kw: Any) -> Comparison:
    """L(a) − L(b) at the end of training, paired by seed, testable in the trained regime, with its trend."""
    traj = gap_trajectory(a, b)
    c = Comparison.by_seed(
        label,
        paired(a, b),
        paper,
        trajectory=traj,
        trend=gap_trend(traj),
        lost=lost_seeds(a, b),
        no_value=no_value(a, b, val_loss, "final validation loss"),
        unit="nats",
        **kw,
    )
    c.untestable = lost_problem(c.lost) or regime_problem([*a, *b], traj, min_tpp)  # lost seeds: not judged
    return c
