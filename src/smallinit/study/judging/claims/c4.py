"""C4: with both fixes γ = 1 beats γ = 0.5 at every size, ≈ 44 % effective model size.

Primary: L(γ.5) − L(γ1) with both fixes at the smallest size (the cheapest, so the one with the most seeds);
the paper states no loss gap, only the direction. Secondary: the other sizes, each γ at its best learning
rate, and the effective size gain against the paper's +44 %."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from smallinit.errors import ConfigError
from smallinit.study.judging.claims.comparison import PRIMARY, ClaimResult, Comparison, judged
from smallinit.study.judging.claims.loss import loss_comparison
from smallinit.study.judging.claims.preconditions import lr_bracket_problem
from smallinit.study.judging.claims.registry import Claim, planned, register
from smallinit.study.judging.claims.selection import (
    FIXED,
    Runs,
    lost_problem,
    lost_seeds,
    reference_lr,
    size_label,
    val_loss,
)
from smallinit.study.judging.effective_size import effective_size_gain
from smallinit.study.judging.power import (
    ALPHA,
    MAX_SIZE_RATIO,
    MIN_SIZES,
    MIN_TOKENS_PER_PARAM,
    power_of_test,
)

PAPER_EFFECTIVE_SIZE = 0.44  # γ = 1 with both fixes is worth a 44 % larger model


GAMMAS = (0.5, 1.0)  # the two arms of the best-lr comparison, in the order of its loss arrays' γ axis
# the sd over seeds of the best-lr gap at the rates chosen, which varies with the rate chosen as well as with the
# seed: 0.132 over the 10 seeds of the full demo of 2026-12-03 (docs/findings-cpu.md), against 0.048 for the gap
# at one rate that had sized it
BEST_LR_SD = (0.132, "the sd over 10 seeds of the best-lr gap at the rates chosen, full demo of 2026-12-03")
# The sign-flip test is exact where both γ's runs are equally noisy; with one γ's runs up to 3× noisier and a flat or
# plateau optimum its p is too small against the noisier γ, the more so the smaller the level (6.6 % each way at
# α = 0.05, 1.7 % at 0.005), as a power of p. So its p is raised to β: the largest β that keeps the worst size each
# way ≤ α'/2 at every level α' in [0.005, 0.05] (Holm's smaller levels included; a constant factor κ on p would
# need κ ≈ 20, 5.3 at 0.05 alone) over tests/support/best_lr.py's grid (optimum sharp, flat or plateau; σ ratio
# 1–3, either γ the noisier; 8, 10, 16 seeds), 4,000 null studies a point: scripts/calibrate_best_lr.py measured
# it (β 0.63–0.66 at each level alone), tests/study/test_best_lr.py holds it on other draws
BEST_LR_BETA = 0.63
MAX_FLIPS = (
    4096  # sign patterns of the best-lr test: every one up to 12 seeds, else this many drawn at random
)


def loo_rates(losses: np.ndarray) -> np.ndarray:
    """Per seed and γ, the index of the learning rate whose mean loss over the other seeds is lowest.

    ``losses`` has (..., seeds, γ, lr) axes; the answer (..., seeds, γ)."""
    losses = np.asarray(losses, dtype=float)
    n = losses.shape[-3]
    others = (losses.sum(-3, keepdims=True) - losses) / (n - 1)
    return np.argmin(others, axis=-1)


def loo_gaps(losses: np.ndarray) -> np.ndarray:
    """Per seed, L(γ.5) − L(γ1), each γ at the rate the other seeds chose (:func:`loo_rates`): (..., seeds)."""
    losses = np.asarray(losses, dtype=float)
    at = np.take_along_axis(losses, loo_rates(losses)[..., None], axis=-1)[..., 0]
    return at[..., 0] - at[..., 1]


def flip_patterns(n: int, max_flips: int = MAX_FLIPS, seed: int = 0) -> np.ndarray:
    """(flips, n) booleans: which seeds swap their γ labels; the first row swaps none. Every pattern when there
    are at most ``max_flips``, else ``max_flips`` − 1 drawn at random beside it."""
    if 2**n <= max_flips:
        return ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)
    drawn = np.random.default_rng(seed).random((max_flips - 1, n)) < 0.5
    return np.vstack([np.zeros((1, n), dtype=bool), drawn])


def best_lr_test(losses: np.ndarray, flips: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean gap, two-sided p) of the sign-flip test of the best-lr gap, the rates re-chosen in every flip.

    ``losses`` (..., seeds, γ, lr). Under no effect of γ the two γ's losses of a seed (every rate) are exchangeable,
    so swapping them in any set of seeds and choosing the rates again gives a gap as likely as the one observed; p
    is the share of the ``flips`` (:func:`flip_patterns`, the identity first) whose mean gap is at least as far from
    0. Choosing the rates inside the test is what keeps its level: the gaps of a seed depend on the others' losses
    through the rates they chose, so a t-test over seeds would use too small a standard error."""
    losses = np.asarray(losses, dtype=float)
    swap = flips[:, :, None, None]  # (flips, seeds, 1, 1)
    flipped = np.where(swap, losses[..., None, :, ::-1, :], losses[..., None, :, :, :])
    stats_ = loo_gaps(flipped).mean(-1)  # (..., flips)
    observed = stats_[..., 0]
    p = np.mean(np.abs(stats_) >= np.abs(observed)[..., None] - 1e-12, axis=-1)
    return observed, p


def calibrated_p(p: np.ndarray | float) -> np.ndarray:
    """The best-lr test's p: the sign-flip test's raised to :data:`BEST_LR_BETA` (so never below it)."""
    return np.asarray(p, dtype=float) ** BEST_LR_BETA


def raw_level(alpha: float) -> float:
    """The level the sign-flip test's raw p is judged at when its calibrated p is judged at ``alpha``."""
    return alpha ** (1 / BEST_LR_BETA)


def smallest_p(n: int, max_flips: int = MAX_FLIPS) -> float:
    """The smallest p the best-lr test over n seeds can give: the sign-flip test's (the identity and the full swap
    tie), calibrated."""
    return float(calibrated_p(2 / min(2**n, max_flips)))


FEWEST_SEEDS = next(n for n in range(2, 64) if smallest_p(n) <= ALPHA)  # the fewest that can reach p ≤ α


def best_lr_power(effect_sds: float, alpha: float, *, seeds: int) -> float:
    """The power of the best-lr test over ``seeds`` at a true gap of ``effect_sds`` seed sds: the paired t-test's at
    the same seeds at the level its raw p is judged at (:func:`raw_level`; tests/study/test_best_lr.py measures the
    two alike by simulation), and none where the test cannot give p ≤ ``alpha`` (:func:`smallest_p`)."""
    if smallest_p(seeds) > alpha:
        return 0.0
    return power_of_test(effect_sds, 1.0, seeds, raw_level(alpha))


def best_lr_comparison(
    runs: Runs, size: tuple, min_tpp: float, arm: str = "fixed"
) -> tuple[Comparison, str] | None:
    """L(γ.5) − L(γ1) with each γ at its best learning rate (fixed arm), and a note of the rates chosen; ``arm``
    names the runs in the label (Q1 passes only Muon's).

    Each seed is tested at the rate the other seeds' mean loss chose, so the seed that is tested did not pick its
    own rate. That leaves the seeds' gaps dependent (a seed's losses chose the others' rates), so the verdict is a
    sign-flip test over the seeds with the rates chosen again inside every flip (:func:`best_lr_test`), which holds
    its level however sharp the optimum or lr-dependent the noise while both γ's runs are equally noisy; its p is
    calibrated (:data:`BEST_LR_BETA`) to hold it where one γ's runs are up to 3× noisier. The seeds it pairs are
    those run at every rate.
    A diverged or failed run anywhere in the grid makes the comparison not testable, as everywhere.
    """
    at = runs.where(FIXED).where(size=size)
    lrs = at.values("train.lr")
    if len(lrs) < 2:
        return None
    cells = {(g, lr): at.where({"model.gamma": g, "train.lr": lr}) for g in GAMMAS for lr in lrs}
    by_seed = {k: {**cell.run_by_seed(), **{r.seed: r for r in cell.lost}} for k, cell in cells.items()}
    seeds = sorted(set.intersection(*[set(v) for v in by_seed.values()]))  # the seeds run at every rate
    if not seeds:
        return None
    lost = "; ".join(  # counted at the rate it was lost at: one run of a seed's grid, not the seed
        f"at lr {lr:g}, {lost_seeds(cells[0.5, lr], cells[1.0, lr])}"
        for lr in lrs
        if any(r.seed in seeds for g in GAMMAS for r in cells[g, lr].lost)
    )
    label = f"L(γ.5)−L(γ1) {arm} @{size_label(size)}, each γ at its best lr"
    if lost or (len(seeds) < 2 and not planned(at)):  # the rates were never chosen: no number stands for them
        why = lost_problem(lost) or "1 seed run at every rate: its best lr cannot be chosen on other seeds"
        not_chosen = f"best lr not chosen: {'a run was lost' if lost else '1 seed'}"
        return Comparison.missing(f"{label} ({not_chosen})", why, "> 0", lost=lost), (
            f"@{size_label(size)}: {not_chosen}, so no rate is named"
        )
    if planned(at):  # which rate is best is the runs': pair the seeds at one rate
        chosen = {g: {s: by_seed[g, lrs[0]][s] for s in seeds} for g in GAMMAS}
        note = (
            f"@{size_label(size)}: best lr per seed, to be chosen on the other seeds among {len(lrs)} rates"
        )
    else:
        losses = np.asarray([[[by_seed[g, lr][s].val_loss for lr in lrs] for g in GAMMAS] for s in seeds])
        rates = loo_rates(losses)
        chosen = {
            g: {s: by_seed[g, lrs[rates[i, j]]][s] for i, s in enumerate(seeds)} for j, g in enumerate(GAMMAS)
        }
        lr = {g: {s: run.config["train.lr"] for s, run in chosen[g].items()} for g in chosen}
        note = f"@{size_label(size)}: best lr per seed, chosen on the other seeds (γ.5 / γ1): " + ", ".join(
            f"seed {s} {lr[0.5][s]:g} / {lr[1.0][s]:g}" for s in seeds
        )
    c = loss_comparison(
        label, Runs(list(chosen[0.5].values())), Runs(list(chosen[1.0].values())), "> 0", min_tpp
    )
    if c.untestable:
        return c, note
    if smallest_p(len(seeds)) > ALPHA:  # known from the design
        c.untestable = (
            f"{len(seeds)} seeds at every rate: the sign-flip test over them cannot give a calibrated p below "
            f"{smallest_p(len(seeds)):.2g} > α = {ALPHA:g} (needs ≥ {FEWEST_SEEDS})"
        )
    # its power, MDE and seeds for 80 % are the rule's (the t-test's at the level its raw p is judged at)
    c.power = functools.partial(best_lr_power, seeds=len(seeds))
    c.power_why = f"sign-flip test over the {len(seeds)} seeds run at every rate, p^{BEST_LR_BETA:g}"
    if planned(at):
        c.planned_sd = BEST_LR_SD
        return c, note
    c.untestable = c.untestable or lr_bracket_problem(lr, lrs)  # the best lr is an outcome
    if not c.untestable:
        _, p = best_lr_test(losses, flip_patterns(len(seeds)))
        c.resampled_p = float(calibrated_p(p))
        c.resampled_why = (
            f"sign-flip test over {len(seeds)} seeds, each γ's rates chosen again in each of "
            f"{len(flip_patterns(len(seeds)))} flips, p^{BEST_LR_BETA:g} calibrated for unequal noise over σ "
            "ratios 1–3"
        )
    return c, note


@judged
def claim_c4(
    runs: Runs,
    *,
    arm: dict[str, Any] = FIXED,
    n_boot: int = 1000,
    all_lrs: Runs | None = None,
    min_tpp: float = MIN_TOKENS_PER_PARAM,
) -> ClaimResult:
    """With ``arm`` = a baseline the same measurement serves as the contrast without the fixes; ``all_lrs``
    (runs at every learning rate) adds the comparison with each γ at its own best rate."""
    res = ClaimResult(
        "C4",
        "With both fixes γ = 1 beats γ = 0.5 at every size: ≈ 44 % effective model size",
        "gain at every size; +44 % effective size",
    )
    fixed = runs.where(arm)
    tag = "fixed" if arm is FIXED else "baseline"
    g05, g1 = fixed.where({"model.gamma": 0.5}), fixed.where({"model.gamma": 1.0})
    first: Comparison | None = None  # the smallest size's gain: the primary
    for n in fixed.values("size"):
        c = loss_comparison(
            f"L(γ.5)−L(γ1) {tag} @{size_label(n)}", g05.where(size=n), g1.where(size=n), "> 0", min_tpp
        )
        if c.samples or c.unknown or c.lost:  # unknown: a plan's seeds
            res.comparisons.append(c)
            first = first or c
        best = best_lr_comparison(all_lrs, n, min_tpp) if all_lrs is not None and arm is FIXED else None
        if best is not None:
            res.comparisons.append(best[0])
            res.notes.append(best[1])
    if first is None:
        first = Comparison.missing(f"L(γ.5)−L(γ1) {tag}", "no runs at γ 0.5 and 1 with these settings")
        res.comparisons.insert(0, first)
    first.role = PRIMARY
    res.comparisons.append(_effective_size(res, g05, g1, n_boot, min_tpp))
    return res


def _effective_size(res: ClaimResult, g05: Runs, g1: Runs, n_boot: int, min_tpp: float) -> Comparison:
    label, paper = "effective size gain", "+0.44"
    sizes = sorted(set(g05.values("size")) & set(g1.values("size")))
    if len(sizes) < MIN_SIZES:
        return Comparison.missing(label, f"needs ≥ {MIN_SIZES} sizes with both γ, has {len(sizes)}", paper)
    lost = lost_seeds(g05, g1)
    if lost:  # the fit over sizes would silently lose those seeds
        return Comparison.missing(label, lost_problem(lost), paper, lost=lost)
    seeds = min(len(sel.where(size=n).by_seed(val_loss)) for sel in (g05, g1) for n in sizes)
    if seeds < 2:
        return Comparison.missing(label, f"{seeds} seed(s) at some size: needs ≥ 2 per arm and size", paper)
    tpp = [r.tokens_per_param() for r in (*g05, *g1)]
    if min(tpp) < min_tpp:
        return Comparison.missing(
            label, f"trained to {min(tpp):.2g} tokens per non-embedding parameter < {min_tpp:g}", paper
        )
    if max(tpp) > 1.5 * min(tpp):
        return Comparison.missing(
            label,
            f"tokens per parameter differ {max(tpp) / min(tpp):.1f}× across sizes: not "
            "a scaling law at matched training",
            paper,
        )
    # a secondary judged by its own interval: its Bonferroni share of the claim's secondaries' α (the others,
    # and itself, are the claim's comparisons but the primary)
    level = 1 - ALPHA / len(res.comparisons)
    if planned(g05):  # the fit and its sanity are the runs'
        return Comparison.interval(
            f"{label} (bootstrap over seeds)", math.nan, math.nan, math.nan, level, paper
        )
    base = [r for r in g05 if r.val_loss and r.size in sizes]
    treat = [r for r in g1 if r.val_loss and r.size in sizes]
    try:
        esg = effective_size_gain(
            [r.params_nonembed for r in base],
            [r.val_loss for r in base],
            [r.params_nonembed for r in treat],
            [r.val_loss for r in treat],
            base_seed=[r.seed for r in base],
            treat_seed=[r.seed for r in treat],
            n_boot=n_boot,
            ci=level,
        )
    except ConfigError as e:
        return Comparison.missing(label, f"fit failed: {e}", paper)
    res.extra["effective_size_gain"] = esg.to_dict()
    ratio = 1 + esg.gain
    if not (math.isfinite(ratio) and 1 / MAX_SIZE_RATIO <= ratio <= MAX_SIZE_RATIO) or esg.unbounded:
        return Comparison.missing(
            label,
            f"no sane estimate: N_eff/N = {ratio:.3g} from the fit "
            f"({'; '.join(esg.notes) or 'outside [0.1, 10]'})",
            paper,
        )
    return Comparison.interval(
        f"{label} (bootstrap over seeds)",
        esg.gain,
        esg.lo,
        esg.hi,
        level,
        paper,
        paper_value=PAPER_EFFECTIVE_SIZE,
    )


register(
    Claim(
        "C4",
        lambda runs, measured, options: claim_c4(
            reference_lr(runs), all_lrs=runs, n_boot=int(options.get("n_boot", 1000))
        ),
        decided_by_the_runs="each γ's best learning rate inside the grid; a sane effective-size fit "
        "(N_eff/N within 10×)",
    )
)
