"""C6: with γ = 1 matrices first condense (low stable rank), then expand; γ = 0.5 stays diffuse.

Primary: γ = 1's rebound from its stable-rank minimum to the end of training, at the smallest size; the
paper gives no number. The seeds are split: the minimum is located on the mean trajectory of the first third
of them (by seed, at least one), and the rebound from that point is tested on the others, so neither the
point a rebound is measured from nor the precondition was chosen on the values tested (choosing the minimum
on the same values would make a flat trajectory "rebound" from its lowest noise). Preconditions: the minimum
so located lies before the last third of training, and the locating seeds rise from it to the end beyond their
noise (:func:`robust_minimum`, which needs ≥ 2 locating seeds, so ≥ 4 seeds), so that a dip of noise on a
course still falling is not judged as a minimum; a plan's MDE is that of this rule (:func:`rule_power`). A
seed whose course gave no stable rank (fewer than 3 analysis records, or an empty one) is counted per arm, and
the comparisons are then not judged on the others. Secondary: the early stable rank γ.5 − γ1 (the
condensed start) and the path length γ1 − γ.5 (γ = 0.5 changes slowly)."""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

from smallinit.study.judging.claims.comparison import PRIMARY, ClaimResult, Comparison, judged
from smallinit.study.judging.claims.registry import Claim, planned, register
from smallinit.study.judging.claims.selection import (
    BASELINE,
    EMULATED,
    FIXED,
    Runs,
    lost_problem,
    lost_seeds,
    mean_stable_rank,
    reference_lr,
    size_label,
)
from smallinit.study.judging.power import ALPHA, LATE_MINIMUM


def robust_minimum(
    ranks: np.ndarray, lowest: np.ndarray, candidates: int, alpha: float = ALPHA
) -> np.ndarray:
    """Whether the locating seeds' (last-but-one axis) minimum at ``lowest`` is one they rise from: the one-sided
    t-test of their rise to the last point (last axis) exceeds 0 at alpha/``candidates``, the points the minimum
    could have been located at (Bonferroni: the point is the lowest of the seeds' own mean, so its rise is the
    largest of ``candidates``). A dip of noise on a course still falling, or on a flat one, passes at most alpha
    of the time; one locating seed cannot tell a rise from noise."""
    rise = rebound(ranks, lowest)
    k = rise.shape[-1]
    if k < 2:
        return np.zeros(rise.shape[:-1], dtype=bool)
    crit = stats.t.ppf(1 - alpha / candidates, k - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return rise.mean(-1) > crit * rise.std(-1, ddof=1) / math.sqrt(k)


def candidate_points(steps: list[int]) -> int:
    """How many of the measurement points a minimum before the last third of training can be located at."""
    return sum(step <= LATE_MINIMUM * steps[-1] for step in steps)


def selection_seeds(n: int) -> int:
    """How many of n seeds locate the minimum (the rest test the rebound)."""
    return max(1, math.ceil(n / 3))


def rule_power(effect_sds: float, alpha: float, *, seeds: int, candidates: int) -> float:
    """The probability that the rule judges a rebound of ``effect_sds`` seed sds (each seed's end minus its value at
    the minimum) and agrees, at ``alpha`` for the test: the locating seeds' rise passes :func:`robust_minimum` and,
    independently (other seeds), the tested seeds' two-sided t-test rejects above 0. It assumes the minimum is
    located where it is; located elsewhere, the rebound tested from it is smaller, so this is the most the rule
    can have."""
    k = selection_seeds(seeds)
    m = seeds - k
    if k < 2 or m < 2:
        return 0.0
    located = stats.nct.sf(stats.t.ppf(1 - ALPHA / candidates, k - 1), k - 1, effect_sds * math.sqrt(k))
    tested = stats.nct.sf(stats.t.ppf(1 - alpha / 2, m - 1), m - 1, effect_sds * math.sqrt(m))
    return float(located * tested)


def located_minimum(ranks: np.ndarray) -> np.ndarray:
    """The index of the minimum of the seeds' (last-but-one axis) mean over the measurement points (last axis)."""
    return np.argmin(np.asarray(ranks, dtype=float).mean(-2), axis=-1)


def rebound(ranks: np.ndarray, lowest: np.ndarray) -> np.ndarray:
    """Each seed's stable rank at the end minus at the point ``lowest`` (one per leading index)."""
    ranks = np.asarray(ranks, dtype=float)
    return ranks[..., -1] - np.take_along_axis(ranks, np.asarray(lowest)[..., None, None], axis=-1)[..., 0]


def has_course(*courses: list, planned: bool = False) -> bool:
    """Each of a seed's analysis courses has ≥ 3 records, each with a stable rank that is a number (a minimum needs
    a point either side; a NaN anywhere in the course would move its minimum, its rebound or its path length). On a
    plan's runs every stable rank is unknown (NaN) by design: only the records are counted."""
    return all(
        len(recs) >= 3 and all(r.matrices and (planned or math.isfinite(mean_stable_rank(r))) for r in recs)
        for recs in courses
    )


def no_course(traj: dict[float, dict[int, list]]) -> str:
    """Per γ, the finished seeds whose course gave no stable rank: "γ=1: 1 of 6 seeds gave no stable-rank course
    (…)"; "" when every seed has one."""
    parts = []
    for g, by_seed in traj.items():
        bad = sorted(s for s, recs in by_seed.items() if not has_course(recs))
        if bad:
            parts.append(
                f"γ={g:g}: {len(bad)} of {len(by_seed)} seeds gave no stable-rank course (fewer than 3 analysis "
                f"records, or one without a stable rank: seed{'s' if len(bad) > 1 else ''} "
                f"{', '.join(map(str, bad))})"
            )
    return "; ".join(parts)


@judged
def claim_c6(runs: Runs) -> ClaimResult:
    res = ClaimResult(
        "C6",
        "With γ = 1 matrices first condense (low stable rank), then expand; γ = 0.5 stays diffuse and "
        "changes slowly",
        "qualitative (heatmaps, stable rank)",
    )
    for arm in (FIXED, EMULATED, BASELINE):  # the paper's setting; a baseline only when there is no fixed run
        sel = runs.where(arm)
        # a size whose runs were all lost too
        for n in sorted({*sel.values("size"), *(r.size for r in sel.lost)}):
            at = sel.where(size=n)
            traj = {
                g: {seed: r.analysis for seed, r in at.where({"model.gamma": g}).run_by_seed().items()}
                for g in (0.5, 1.0)
            }
            seeds = sorted(
                s
                for s in set(traj[0.5]) & set(traj[1.0])
                if has_course(traj[0.5][s], traj[1.0][s], planned=planned(at))
            )
            lost = lost_seeds(at.where({"model.gamma": 0.5}), at.where({"model.gamma": 1.0}))
            no_value = "" if planned(at) else no_course(traj)
            if not seeds:
                # no seed pair left to compare: the lost seeds are the result, never dropped
                if lost or no_value:
                    lone = Comparison.missing(
                        f"srank rebound γ1 @{size_label(n)}{' fixed' if arm is FIXED else ' baseline'}",
                        lost_problem(lost),
                        lost=lost,
                        no_value=no_value,
                    )
                    if not res.comparisons:
                        lone.role = PRIMARY  # the smallest size of the arm
                    res.comparisons.append(lone)
                continue
            steps = [r.step for r in traj[1.0][seeds[0]]]
            r1 = {s: [mean_stable_rank(r) for r in traj[1.0][s]] for s in seeds}
            r05 = {s: [mean_stable_rank(r) for r in traj[0.5][s]] for s in seeds}
            k = min(len(v) for v in (*r1.values(), *r05.values()))
            tag = f"@{size_label(n)}{' fixed' if arm is FIXED else ' baseline'}"
            chosen, tested = seeds[: selection_seeds(len(seeds))], seeds[selection_seeds(len(seeds)) :]
            # where the minimum lies is the runs' (a plan's label names no step, and its lateness is not checked)
            lowest = 0 if planned(at) else int(located_minimum(np.asarray([r1[s][:k] for s in chosen])))
            at_step = "" if planned(at) else f"step {steps[lowest]}, "
            label = (
                f"srank rebound γ1 after its minimum ({at_step}located on seed(s) "
                f"{', '.join(map(str, chosen))}) {tag}"
            )
            if not tested:
                expansion = Comparison.missing(
                    label,
                    f"{len(seeds)} seed(s): the minimum is located on some seeds "
                    "and the rebound tested on the others",
                )
            else:
                expansion = Comparison.by_seed(
                    label,
                    dict(zip(tested, rebound(np.asarray([r1[s][:k] for s in tested]), lowest).tolist())),
                    "> 0",
                )
            candidates = candidate_points(steps[:k])
            if tested and len(chosen) < 2:  # known from the design: robust_minimum never passes
                expansion.untestable = (
                    f"{len(seeds)} seeds: one locates the minimum, and one seed cannot tell a rise from it from "
                    "noise (a robust minimum needs ≥ 2 locating seeds: ≥ 4 seeds)"
                )
            elif planned(at):  # where the minimum lies, and whether it is robust, are the runs'
                if tested:
                    expansion.power = functools.partial(rule_power, seeds=len(seeds), candidates=candidates)
                    expansion.power_why = (
                        f"the split rule: {len(chosen)} seeds locate the minimum and must rise from it at "
                        f"α = {ALPHA:g}/{candidates} (one-sided), {len(tested)} test the rebound"
                    )
            elif steps[lowest] > LATE_MINIMUM * steps[k - 1]:
                expansion.untestable = (
                    f"γ=1's stable rank is lowest at step {steps[lowest]} of {steps[k - 1]}, in "
                    "the last third of training: no minimum yet to rebound from"
                )
            else:
                located = np.asarray([r1[s][:k] for s in chosen])
                if not robust_minimum(located, np.asarray(lowest), candidates):
                    rise = rebound(located, lowest)
                    expansion.untestable = (
                        f"γ=1's stable rank on seed(s) {', '.join(map(str, chosen))} is lowest at step "
                        f"{steps[lowest]}, but rises from it to the end by only {float(np.mean(rise)):+.3g}"
                        + (f" ± {float(np.std(rise, ddof=1)):.3g}" if len(chosen) > 1 else "")
                        + f": not above 0 at α = {ALPHA:g}/{candidates} (one-sided t over the locating seeds, "
                        "Bonferroni over the points it could lie at): no minimum located robustly, "
                        "so a dip of noise is not judged"
                    )
            if not res.comparisons:
                expansion.role = PRIMARY  # the smallest size of the arm
            compared = [
                Comparison(
                    f"early srank γ.5−γ1 (step {steps[1]}) {tag}",
                    [r05[s][1] - r1[s][1] for s in seeds],
                    "> 0",
                ),
                expansion,
                Comparison(
                    f"srank path length γ1−γ.5 {tag}",
                    [
                        float(np.abs(np.diff(r1[s][:k])).sum() - np.abs(np.diff(r05[s][:k])).sum())
                        for s in seeds
                    ],
                    "> 0",
                ),
            ]
            for c in compared:  # a diverged, failed or valueless seed is counted, not dropped
                c.lost, c.untestable, c.no_value = lost, lost_problem(lost) or c.untestable, no_value
            res.comparisons += compared
            res.extra[f"stable_rank{tag}"] = {
                f"seed{s}": {"steps": steps[:k], "gamma1": r1[s][:k], "gamma0.5": r05[s][:k]} for s in seeds
            }
        if res.comparisons:
            return res  # every size of one arm
    res.comparisons.append(
        Comparison.missing(
            "stable rank", "no analysis records for γ 0.5 and 1 (analysis.every)", role=PRIMARY
        )
    )
    return res


register(
    Claim(
        "C6",
        lambda runs, measured, options: claim_c6(reference_lr(runs)),
        unit="stable rank",
        decided_by_the_runs="γ = 1's stable-rank minimum before the last third of training, its locating seeds "
        "rising from it beyond their noise",
        seed_sd=(
            0.061,
            "the CPU study's sd over 10 seeds of the srank rebound at d16 (docs/findings-cpu.md)",
        ),
    )
)
