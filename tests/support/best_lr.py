"""Simulated best-lr studies for C4's "each γ at its best lr": the loss profiles over the rates, the noise, and the
grid its level is measured over (tests/study/test_best_lr.py; docs/experiments.md, C4).

A study draws per seed and γ a final loss at each of 5 rates a factor ~3 apart: the profile (nats above the
optimum), the seed's own offset (its data order, shared by both γ and every rate) and run-to-run noise, which may
be larger in one γ than the other (the σ ratio). With no effect both γ share the profile; only their noise differs.
"""

from __future__ import annotations

import itertools

import numpy as np

from smallinit.study.judging.claims.c4 import MAX_FLIPS, best_lr_test, flip_patterns

# the optimum's shapes, in nats above the best rate
SHARP = np.array([0.4, 0.1, 0.0, 0.1, 0.4])  # one best rate, found at any of these noises
FLAT = np.array([0.02, 0.005, 0.0, 0.005, 0.02])  # steps below the run noise: the choice nearly a coin toss
PLATEAU = np.array([0.4, 0.0, 0.0, 0.0, 0.4])  # three rates tie at the optimum, SHARP's steep sides outside
SHAPES = {"sharp": SHARP, "flat": FLAT, "plateau": PLATEAU}
OFFSET_SD = 0.05  # a seed's data order
RUN_SD = 0.034  # run-to-run sd: the paired difference's sd is the demo's pilot 0.048 at any one rate
RISING_SD = RUN_SD * np.array([0.6, 0.8, 1.0, 1.5, 2.5])  # noisier at larger rates

# the grid the level is held over: each shape; the σ ratio of the noisier γ's runs to the other's, either γ the
# noisier (the index into the γ axis, 0 = γ .5); the seeds run at every rate
RATIOS = (1.0, 1.5, 2.0, 3.0)
SEEDS = (8, 10, 16)
NOISE = [(1.0, 0)] + [(r, g) for r in RATIOS[1:] for g in (0, 1)]
GRID = [(shape, r, g, n) for shape, (r, g), n in itertools.product(SHAPES, NOISE, SEEDS)]
# the claim's own sign patterns: every one up to 12 seeds, 4096 drawn at 16 (p resolves 0.0005)
FLIPS = MAX_FLIPS


def studies(rng, draws, n, profile, run_sd=RUN_SD, *, ratio=1.0, noisier=0, effect=0.0, profile_1=None):
    """(draws, seeds, γ, lr) final losses; γ index ``noisier`` has ``ratio`` × the other's run noise; γ = 1 is
    lower by ``effect`` at every rate (its own profile if given)."""
    offset = rng.normal(0, OFFSET_SD, (draws, n, 1, 1))
    sd = np.ones((2, 1))
    sd[noisier] = ratio
    losses = 3.0 + offset + rng.normal(0, 1, (draws, n, 2, len(profile))) * run_sd * sd
    losses[:, :, 0] += profile
    losses[:, :, 1] += (profile if profile_1 is None else profile_1) - effect
    return losses


def mean_and_p(losses, max_flips=FLIPS, chunk=100):
    """(mean gap, p) of C4's sign-flip test for each study, in chunks that keep the flipped copies small."""
    flips = flip_patterns(losses.shape[1], max_flips=max_flips)
    out = [np.stack(best_lr_test(losses[i : i + chunk], flips), -1) for i in range(0, len(losses), chunk)]
    return np.concatenate(out).T


def sizes(mean, p, alpha, beta=1.0):
    """Each way, the share of studies the test decides at ``alpha`` with its p raised to ``beta`` (1: the raw p):
    agree (γ = 1 lower), disagree."""
    decided = p**beta <= alpha
    return float(np.mean(decided & (mean > 0))), float(np.mean(decided & (mean < 0)))


def grid_point(point, draws, seed=0, max_flips=FLIPS):
    """(mean gap, p) of ``draws`` null studies at one point of :data:`GRID`, reproducibly from ``seed``."""
    shape, ratio, noisier, n = point
    rng = np.random.default_rng([seed, GRID.index(point)])
    return mean_and_p(studies(rng, draws, n, SHAPES[shape], ratio=ratio, noisier=noisier), max_flips)
