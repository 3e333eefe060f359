"""C6: with γ = 1 matrices first condense (low stable rank), then expand; γ = 0.5 stays diffuse."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..power import LATE_MINIMUM
from .comparison import ClaimResult, Comparison, judged
from .selection import BASELINE, EMULATED, FIXED, Runs, size_label


def _mean_stable_rank(rec: dict[str, Any]) -> float:
    return float(np.mean(list(rec["stable_rank"].values())))


@judged
def claim_c6(runs: Runs) -> ClaimResult:
    res = ClaimResult("C6", "With γ = 1 matrices first condense (low stable rank), then expand; γ = 0.5 stays diffuse and "
                      "changes slowly", "qualitative (heatmaps, stable rank)")
    for arm in (FIXED, EMULATED, BASELINE):  # the paper's setting; a baseline only when there is no fixed run
        sel = runs.where(arm)
        for n in sel.values("size"):
            at = sel.where(size=n)
            traj = {g: {seed: r.analysis for seed, r in at.where({"model.gamma": g}).run_by_seed().items()}
                    for g in (0.5, 1.0)}
            seeds = sorted(s for s in set(traj[0.5]) & set(traj[1.0]) if len(traj[0.5][s]) >= 3 and len(traj[1.0][s]) >= 3)
            if not seeds:
                continue
            steps = [r["step"] for r in traj[1.0][seeds[0]]]
            r1 = {s: [_mean_stable_rank(r) for r in traj[1.0][s]] for s in seeds}
            r05 = {s: [_mean_stable_rank(r) for r in traj[0.5][s]] for s in seeds}
            k = min(len(v) for v in (*r1.values(), *r05.values()))
            mean1 = np.mean([r1[s][:k] for s in seeds], axis=0)
            lowest = int(np.argmin(mean1))
            tag = f"@{size_label(n)}{' fixed' if arm is FIXED else ' baseline'}"
            expansion = Comparison(f"srank rebound γ1 after its minimum (step {steps[lowest]}) {tag}",
                                   [r1[s][k - 1] - r1[s][lowest] for s in seeds], "> 0")
            if steps[lowest] > LATE_MINIMUM * steps[k - 1]:
                expansion.untestable = (f"γ=1's stable rank is lowest at step {steps[lowest]} of {steps[k - 1]}, in "
                                        "the last third of training: no minimum yet to rebound from")
            res.comparisons += [
                Comparison(f"early srank γ.5−γ1 (step {steps[1]}) {tag}", [r05[s][1] - r1[s][1] for s in seeds], "> 0"),
                expansion,
                Comparison(f"srank path length γ1−γ.5 {tag}", [
                    float(np.abs(np.diff(r1[s][:k])).sum() - np.abs(np.diff(r05[s][:k])).sum()) for s in seeds], "> 0"),
            ]
            res.extra[f"stable_rank{tag}"] = {f"seed{s}": {"steps": steps[:k], "gamma1": r1[s][:k], "gamma0.5": r05[s][:k]}
                                              for s in seeds}
        if res.comparisons:
            return res  # every size of one arm
    res.comparisons.append(Comparison.missing("stable rank", "no analysis records for γ 0.5 and 1 (analysis.every)"))
    return res
