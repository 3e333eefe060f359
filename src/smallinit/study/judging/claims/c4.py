"""C4: with both fixes γ = 1 beats γ = 0.5 at every size, ≈ 44 % effective model size.

Primary: L(γ.5) − L(γ1) with both fixes at the smallest size (the cheapest, so the one with the most seeds);
the paper states no loss gap, only the direction. Secondary: the other sizes, each γ at its best learning
rate, and the effective size gain against the paper's +44 %."""

from __future__ import annotations

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
from smallinit.study.judging.power import ALPHA, MAX_SIZE_RATIO, MIN_SIZES, MIN_TOKENS_PER_PARAM
from smallinit.study.judging.scaling import effective_size_gain
from smallinit.study.running.runs import Run

PAPER_EFFECTIVE_SIZE = 0.44  # γ = 1 with both fixes is worth a 44 % larger model


def best_lr_comparison(runs: Runs, size: tuple, min_tpp: float) -> tuple[Comparison, str] | None:
    """L(γ.5) − L(γ1) with each γ at its best learning rate (fixed arm), and a note of the rates chosen.

    Each seed's rates are chosen on the other seeds' mean loss, so the seed that is tested did not pick its own
    rate: picking on the same losses that are then tested would favour whichever γ's best run was luckiest. A
    diverged or failed run counts as an infinite loss at its rate, so a rate where a seed diverged is not chosen
    for its survivors; where the chosen rate's run of the tested seed was lost, the comparison counts it.
    """
    at = runs.where(FIXED).where(size=size)
    lrs = at.values("train.lr")
    if len(lrs) < 2:
        return None
    cells = {(g, lr): at.where({"model.gamma": g, "train.lr": lr}) for g in (0.5, 1.0) for lr in lrs}
    loss = {
        k: {**cell.by_seed(val_loss), **{r.seed: math.inf for r in cell.lost}} for k, cell in cells.items()
    }
    by_seed = {k: {**cell.run_by_seed(), **{r.seed: r for r in cell.lost}} for k, cell in cells.items()}
    chosen: dict[float, dict[int, Run]] = {
        0.5: {},
        1.0: {},
    }  # each seed's run at the rate the other seeds chose
    if planned(
        at
    ):  # which rate is best is the runs': a plan pairs the seeds every rate has, at any one of them
        every = set.intersection(*[set(by_seed[k]) for k in cells])
        chosen = {g: {s: by_seed[g, lrs[0]][s] for s in sorted(every)} for g in (0.5, 1.0)}
    else:
        for g in (0.5, 1.0):
            for seed in sorted({s for lr in lrs for s in loss[g, lr]}):
                others = {lr: [v for t, v in loss[g, lr].items() if t != seed] for lr in lrs}
                means = {lr: float(np.mean(v)) for lr, v in others.items() if v}
                runs_at_best = by_seed[g, min(means, key=means.get)] if means else {}
                if seed in runs_at_best:
                    chosen[g][seed] = runs_at_best[seed]
    seeds = sorted(chosen[0.5].keys() & chosen[1.0].keys())
    if not seeds:
        return None
    lr = {g: {s: run.config["train.lr"] for s, run in chosen[g].items()} for g in chosen}
    note = f"@{size_label(size)}: best lr per seed, chosen on the other seeds (γ.5 / γ1): " + ", ".join(
        f"seed {s} {lr[0.5][s]:g} / {lr[1.0][s]:g}" for s in seeds
    )
    c = loss_comparison(
        f"L(γ.5)−L(γ1) fixed @{size_label(size)}, each γ at its best lr",
        Runs(list(chosen[0.5].values())),
        Runs(list(chosen[1.0].values())),
        "> 0",
        min_tpp,
    )
    c.untestable = (
        "" if planned(at) else lr_bracket_problem(lr, lrs)
    ) or c.untestable  # the best lr is an outcome
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
    level = 1 - ALPHA  # a secondary comparison, judged by its own interval
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
