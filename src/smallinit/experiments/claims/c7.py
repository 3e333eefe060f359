"""C7: γ = 1's token-level gains concentrate on moderately-to-highly difficult tokens."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..verdicts import TTest, t_test
from .comparison import ClaimResult, Comparison, judged
from .selection import FIXED

EASY_BINS, MID_BINS, NOISY_BINS = (0, 1, 2), (4, 5, 6, 7, 8), (9,)  # of 10 difficulty deciles, for C7


@judged
def claim_c7(gaps: dict[int, dict[str, Any]] | None) -> ClaimResult:
    res = ClaimResult("C7", "γ = 1's token-level gains concentrate on moderately-to-highly difficult tokens, not easy ones "
                      "nor the noisiest", "qualitative (Δ_sym by difficulty)")
    if not gaps:
        res.comparisons.append(Comparison.missing("Δ_sym by difficulty", "needs γ 0.5 and 1 runs with the fixes"))
        return res
    used = {seed: gap for seed, gap in sorted(gaps.items()) if len(gap["bins"]) == 10}  # by difficulty decile
    mid_easy, mid_noisy = {}, {}
    for seed, gap in used.items():
        d = [b["mean_delta_sym"] for b in gap["bins"]]
        mid = float(np.mean([d[i] for i in MID_BINS]))
        mid_easy[seed] = mid - float(np.mean([d[i] for i in EASY_BINS]))
        mid_noisy[seed] = mid - float(np.mean([d[i] for i in NOISY_BINS]))
    res.comparisons += [Comparison.by_seed("Δ_sym mid−easy deciles", mid_easy, "> 0"),
                        Comparison.by_seed("Δ_sym mid−noisiest decile", mid_noisy, "> 0")]
    res.extra["token_gap"] = gaps
    better = t_test([float(g["mean_delta_sym"]) for g in used.values()])
    res.notes.append("mean Δ_sym (γ1 vs γ.5): " + (f"{better.mean:+.4f} [{better.lo:+.4f}, {better.hi:+.4f}]"
                                                   if isinstance(better, TTest) else better))
    bigram = [g["bigram_loss"] for g in used.values() if g.get("bigram_loss") is not None]
    worst = max((max(g["mean_loss_a"], g["mean_loss_b"]) for g in used.values()), default=math.inf)
    if bigram:
        res.notes.append(f"loss on these tokens: worst model {worst:.3f}, add-k bigram {np.mean(bigram):.3f}")
    if not isinstance(better, TTest) or better.lo <= 0:
        res.untestable = ("γ=1 is not better on average here (mean Δ_sym interval "
                          + (f"[{better.lo:+.4f}, {better.hi:+.4f}]" if isinstance(better, TTest) else better)
                          + " not above 0): where its gains lie is not defined")
    elif not bigram or worst >= float(np.mean(bigram)):
        res.untestable = (f"a model is not below the bigram baseline ({worst:.3f} ≥ {np.mean(bigram):.3f})"
                          if bigram else "no bigram baseline measured on these tokens")
    return res


def gaps_from_compares(compares: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]] | None:
    """C7's input from compare.json contents: γ = 1 (A) against γ = 0.5 (B), both with the fixes, the same seed and
    otherwise the same settings. Comparisons of several sizes or rates are never pooled: the largest model's are
    used, as the recipes judge C7 at the largest size."""
    groups: dict[str, dict[int, dict[str, Any]]] = {}  # by the settings the seeds share
    for c in compares:
        a, b = c.get("meta", {}).get("settings_a") or {}, c.get("meta", {}).get("settings_b") or {}
        fixed = all(s.get(k) == v for s in (a, b) for k, v in FIXED.items())
        rest = {k: v for k, v in a.items() if k != "model.gamma"}
        if fixed and a.get("model.gamma") == 1.0 and b.get("model.gamma") == 0.5 and rest == {
                k: v for k, v in b.items() if k != "model.gamma"}:
            key = repr(sorted((k, v) for k, v in rest.items() if k != "train.seed"))
            groups.setdefault(key, {})[int(a.get("train.seed") or 0)] = c

    def size(key: str) -> tuple[int, int, int]:  # model size from any member's settings, then the seeds
        a = next(iter(groups[key].values()))["meta"]["settings_a"]
        return a.get("model.d_model") or 0, a.get("model.n_layers") or 0, len(groups[key])

    return groups[max(groups, key=size)] if groups else None
