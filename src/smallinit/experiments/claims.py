"""The paper's claims C1–C7, measured on a set of finished runs, each with a computed verdict.

A claim is tested by one or more comparisons. Each comparison yields one number per seed, signed so that a
positive value is the paper's direction (for example L(γ=0.5) − L(γ=1): γ = 1 better), and a verdict from
the spread over seeds by the project's one rule (smallinit.report.verdict): **agree** when the mean is more
than 2 standard errors above zero, **disagree** when more than 2 below, **inconclusive** otherwise (and
with a single seed, or when the runs a comparison needs are missing). The residual-flow exponent is judged
against a ±0.15 band around 1 − γ, the effective size gain by its bootstrap interval over seeds. A claim
agrees when all of its comparisons agree, disagrees when any disagrees, and is inconclusive otherwise; a
part of a claim the runs cannot test counts as inconclusive. The comparisons and their signs come from the
paper's statements; none was chosen or changed to make a verdict agree.

Runs are selected by their resolved configs (γ, ε, gate, size), not by folder names, so any sweep that
holds the right cells can be judged. A "size" is a model shape (width, depth, heads, d_ff, experts), so
runs with and without the gate count as the same size; the scaling fits use the number of parameters
without embeddings. "Baseline" means ε = 1e-5 with no gate, "fixed" ε = 1e-12 with the elementwise gate.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.norm_factor import relative_factor
from ..analysis.scaling import effective_size_gain
from ..errors import ConfigError
from ..report.verdict import verdict_paired
from ..train.runs import Run
from .sweep import sweep_rows

AGREE, DISAGREE, INCONCLUSIVE = "agree", "disagree", "inconclusive"
BOOTSTRAP_CI = 0.95  # level of the effective-size interval (≈ the ±2 SE of the other verdicts)
BASELINE = {"model.norm_eps": 1e-5, "model.gate": "none"}
FIXED = {"model.norm_eps": 1e-12, "model.gate": "elementwise"}
FLOW_TOLERANCE = 0.15  # |fitted exponent − (1 − γ)| allowed for C5 (as in the analysis acceptance)
EASY_BINS, MID_BINS, NOISY_BINS = (0, 1, 2), (4, 5, 6, 7, 8), (9,)  # of 10 difficulty deciles, for C7


def combine(verdicts: Iterable[str]) -> str:
    vs = list(verdicts)
    if not vs:
        return INCONCLUSIVE
    if DISAGREE in vs:
        return DISAGREE
    return AGREE if all(v == AGREE for v in vs) else INCONCLUSIVE


@dataclass
class Comparison:
    """One tested comparison: per-seed values (positive = the paper's direction) and the paper's number."""

    label: str
    samples: list[float]
    paper: str = ""
    expected: str = "positive"  # or "zero": within ±tolerance
    tolerance: float = 0.0
    verdict: str = INCONCLUSIVE
    reason: str = ""
    estimate: float | None = None  # for a comparison judged by its own interval (a bootstrap)
    lo: float = math.nan
    hi: float = math.nan

    def __post_init__(self) -> None:
        if self.estimate is None and not self.reason:
            self.samples = [float(x) for x in self.samples if x is not None and math.isfinite(x)]
            v = verdict_paired(self.samples, self.expected, tolerance=self.tolerance)
            self.verdict, self.reason = v.label, v.reason

    @staticmethod
    def interval(label: str, estimate: float, lo: float, hi: float, paper: str = "") -> Comparison:
        """A comparison judged by an interval from elsewhere: agree if lo > 0, disagree if hi < 0."""
        v, why = INCONCLUSIVE, "no finite interval"
        if math.isfinite(lo) and math.isfinite(hi):
            v = AGREE if lo > 0 else DISAGREE if hi < 0 else INCONCLUSIVE
            why = f"interval [{lo:.3g}, {hi:.3g}]" + (" excludes 0" if v != INCONCLUSIVE else " contains 0")
        return Comparison(label, [], paper, verdict=v, reason=why, estimate=estimate, lo=lo, hi=hi)

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples)) if self.samples else math.nan

    @property
    def sd(self) -> float:
        return float(np.std(self.samples, ddof=1)) if len(self.samples) > 1 else math.nan

    def text(self) -> str:
        if self.estimate is not None:
            return f"{self.label}: {self.estimate:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"
        if not self.samples:
            return f"{self.label}: not measured{f' ({self.reason})' if self.reason else ''}"
        sd = f" ± {self.sd:.3f}" if len(self.samples) > 1 else ""
        return f"{self.label}: {self.mean:+.3f}{sd} (n={len(self.samples)})"

    @staticmethod
    def missing(label: str, why: str, paper: str = "") -> Comparison:
        """A part of a claim these runs cannot test: it keeps the claim inconclusive."""
        return Comparison(label, [], paper, verdict=INCONCLUSIVE, reason=why, estimate=None, lo=math.nan, hi=math.nan)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "samples": self.samples, "mean": self.mean, "sd": self.sd, "n": len(self.samples),
                "expected": self.expected, "tolerance": self.tolerance, "estimate": self.estimate, "lo": self.lo,
                "hi": self.hi, "verdict": self.verdict, "reason": self.reason, "paper": self.paper,
                "text": self.text()}


@dataclass
class ClaimResult:
    claim: str
    statement: str
    paper: str
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return combine(c.verdict for c in self.comparisons)

    @property
    def measured(self) -> str:
        parts = [c.text() for c in self.comparisons] or ["not measured at this scale"]
        return "; ".join(parts + self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "statement": self.statement, "paper": self.paper, "verdict": self.verdict,
                "measured": self.measured, "comparisons": [c.to_dict() for c in self.comparisons],
                "notes": self.notes, "extra": self.extra}


# -- runs ------------------------------------------------------------------------------------------------------


class Runs:
    """The finished runs of one or more sweep folders, selectable by config values."""

    def __init__(self, runs: list[Run]):
        self.runs = runs

    @staticmethod
    def load(*folders: str | os.PathLike) -> Runs:
        """Every done cell of the given sweep folders (folders with a sweep.json below them are searched)."""
        runs = []
        for folder in folders:
            for spec in sorted(Path(folder).rglob("sweep.json")):
                sweep_dir = spec.parent
                for row in sweep_rows(sweep_dir):
                    run = Run.load(sweep_dir / row["dir"], row["cell"]) if row["status"] == "done" else None
                    if run is not None:
                        runs.append(run)
        return Runs(runs)

    @staticmethod
    def finished(runs: Iterable[Run]) -> Runs:
        """The runs that wrote their summary (a run still training, or killed, is not judged)."""
        return Runs([r for r in runs if r.summary])

    def where(self, conditions: dict[str, Any] | None = None, **more: Any) -> Runs:
        cond = {**(conditions or {}), **more}
        return Runs([r for r in self.runs if r.matches(cond)])

    def values(self, key: str) -> list[Any]:
        vals = {r.size if key == "size" else r.config.get(key) for r in self.runs}
        return sorted(v for v in vals if v is not None)

    def by_seed(self, metric: Callable[[Run], float | None]) -> dict[int, float]:
        """metric per seed; a seed with several runs (should not happen within one selection) is averaged."""
        acc: dict[int, list[float]] = {}
        for r in self.runs:
            v = metric(r)
            if v is not None and math.isfinite(v):
                acc.setdefault(r.seed, []).append(v)
        return {s: float(np.mean(v)) for s, v in acc.items()}

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self):
        return iter(self.runs)


def val_loss(run: Run) -> float | None:
    return run.val_loss


def paired(a: Runs, b: Runs, metric: Callable[[Run], float | None] = val_loss) -> list[float]:
    """metric(a) − metric(b) for every seed both selections finished."""
    ma, mb = a.by_seed(metric), b.by_seed(metric)
    return [ma[s] - mb[s] for s in sorted(set(ma) & set(mb))]


def _size_label(size: tuple) -> str:
    return f"d{size[0]}×{size[1]}" + (f"×{size[4]}e" if size[4] else "")


def _last_analysis(run: Run) -> dict[str, Any] | None:
    recs = [r for r in run.analysis if r.get("step") == run.config.get("train.steps")]
    return recs[-1] if recs else None


def sink_mean(run: Run) -> float | None:
    """Mean sink score over layers at the end of training (the analysis record of the last step)."""
    rec = _last_analysis(run)
    return float(rec["sink_mean"]) if rec and "sink_mean" in rec else None


# -- the claims --------------------------------------------------------------------------------------------------


def claim_c1(runs: Runs) -> ClaimResult:
    res = ClaimResult("C1", "Without the fixes, γ = 1 beats γ = 0.5 at every size, but the gain shrinks with size",
                      "gain ≈ 0.05 at 0.1B → ≈ 0.003 at 1.5B")
    base = runs.where(BASELINE)
    gains = {}
    for n in base.values("size"):
        g = paired(base.where({"model.gamma": 0.5, "size": n}), base.where({"model.gamma": 1.0, "size": n}))
        if g:
            gains[n] = g
            res.comparisons.append(Comparison(f"L(γ.5)−L(γ1) @{_size_label(n)}", g, "≈ +0.05 … +0.003"))
    if len(gains) >= 2:
        lo, hi = min(gains), max(gains)
        common = min(len(gains[lo]), len(gains[hi]))
        shrink = [a - b for a, b in zip(gains[lo][:common], gains[hi][:common])]
        res.comparisons.append(Comparison(f"gain shrink {_size_label(lo)}→{_size_label(hi)}", shrink, "≈ +0.047"))
    elif gains:
        res.comparisons.append(Comparison.missing("gain shrink with size", "needs ≥ 2 sizes of baseline runs"))
    else:
        res.comparisons.append(Comparison.missing("L(γ.5)−L(γ1) without fixes", "no baseline runs at γ 0.5 and 1"))
    return res


def _factor_note(widths: Iterable[int], gamma: float = 1.0, eps: float = 1e-5) -> str:
    """The analytic RMSNorm factor at init (relative to 1/σ) at the tested widths and the paper's d = 2048."""
    parts = [f"d={d}: {relative_factor(gamma, eps, d):.2f}" for d in sorted(set(widths))] + [
        f"d=2048: {relative_factor(gamma, eps, 2048):.2f}"]
    return f"analytic RMSNorm factor at init, γ={gamma:g}, ε={eps:g}, of ideal: " + ", ".join(parts)


def claim_c2(runs: Runs) -> ClaimResult:
    res = ClaimResult("C2", "ε = 1e-12 instead of 1e-5 lowers the loss at γ = 1 (RMSNorm saturation), hardly at γ = 0.5",
                      "−0.038 at γ=1, −0.001 at γ=0.5 (1.5B)")
    nogate = runs.where({"model.gate": "none"})
    tested: list[int] = []
    for n in nogate.values("size"):
        at = nogate.where(size=n)
        cells = {(g, e): at.where({"model.gamma": g, "model.norm_eps": e}) for g in (0.5, 1.0) for e in (1e-5, 1e-12)}
        if not all(len(c) for c in cells.values()):
            continue
        tested.append(n[0])
        fix1 = paired(cells[1.0, 1e-5], cells[1.0, 1e-12])
        fix05 = paired(cells[0.5, 1e-5], cells[0.5, 1e-12])
        res.comparisons.append(Comparison(f"ε-fix gain at γ1 @{_size_label(n)}", fix1, "+0.038"))
        k = min(len(fix1), len(fix05))
        res.comparisons.append(Comparison(f"γ1 minus γ.5 ε-fix gain @{_size_label(n)}",
                                          [a - b for a, b in zip(fix1[:k], fix05[:k])], "+0.037"))
    if not res.comparisons:
        res.comparisons.append(Comparison.missing("ε-fix gain", "needs γ {0.5, 1} × ε {1e-5, 1e-12} without gate"))
    res.notes.append(_factor_note(tested or runs.values("model.d_model")))
    return res


def claim_c3(runs: Runs) -> ClaimResult:
    res = ClaimResult("C3", "Small init raises the attention sink; the gate lowers the loss at γ = 1, hardly at γ = 0.5",
                      "sink +0.11/layer; gate −0.047 at γ=1, −0.004 at γ=0.5 (1.5B, ε=1e-12)")
    eps = 1e-12
    sel = runs.where({"model.norm_eps": eps})
    for n in sel.values("size"):
        at = sel.where(size=n)
        cells = {(g, gate): at.where({"model.gamma": g, "model.gate": gate})
                 for g in (0.5, 1.0) for gate in ("none", "elementwise")}
        if not all(len(c) for c in cells.values()):
            continue
        gate1 = paired(cells[1.0, "none"], cells[1.0, "elementwise"])
        gate05 = paired(cells[0.5, "none"], cells[0.5, "elementwise"])
        res.comparisons.append(Comparison(f"gate gain at γ1 @{_size_label(n)}", gate1, "+0.047"))
        k = min(len(gate1), len(gate05))
        res.comparisons.append(Comparison(f"γ1 minus γ.5 gate gain @{_size_label(n)}",
                                          [a - b for a, b in zip(gate1[:k], gate05[:k])], "+0.043"))
        sink = paired(cells[1.0, "none"], cells[0.5, "none"], sink_mean)
        if sink:
            res.comparisons.append(Comparison(f"sink γ1−γ.5 (no gate) @{_size_label(n)}", sink, "+0.11"))
        else:
            res.comparisons.append(Comparison.missing("sink γ1−γ.5", "no sink scores (analysis.every was off)"))
    if not res.comparisons:
        res.comparisons.append(Comparison.missing("gate gain", "needs γ {0.5, 1} × gate {none, elementwise} at ε 1e-12"))
    return res


def claim_c4(runs: Runs, *, arm: dict[str, Any] = FIXED, n_boot: int = 1000) -> ClaimResult:
    """With ``arm`` = BASELINE the same measurement serves as the contrast without the fixes."""
    res = ClaimResult("C4", "With both fixes γ = 1 beats γ = 0.5 at every size: ≈ 44 % effective model size",
                      "gain at every size; +44 % effective size")
    fixed = runs.where(arm)
    tag = "fixed" if arm is FIXED else "baseline"
    g05, g1 = fixed.where({"model.gamma": 0.5}), fixed.where({"model.gamma": 1.0})
    for n in fixed.values("size"):
        g = paired(g05.where(size=n), g1.where(size=n))
        if g:
            res.comparisons.append(Comparison(f"L(γ.5)−L(γ1) {tag} @{_size_label(n)}", g, "> 0"))
    sizes = g05.values("size")
    if len(sizes) >= 3 and len(g1):
        base = [r for r in g05 if r.val_loss]
        treat = [r for r in g1 if r.val_loss]
        try:
            esg = effective_size_gain(
                [r.params_nonembed for r in base], [r.val_loss for r in base], [r.params_nonembed for r in treat],
                [r.val_loss for r in treat], base_seed=[r.seed for r in base], treat_seed=[r.seed for r in treat],
                n_boot=n_boot, ci=BOOTSTRAP_CI,
            )
        except ConfigError as e:
            res.comparisons.append(Comparison.missing("effective size gain", f"fit failed: {e}"))
        else:
            res.extra["effective_size_gain"] = esg.to_dict()
            res.comparisons.append(Comparison.interval(f"effective size gain ({BOOTSTRAP_CI:.0%} bootstrap over seeds)",
                                                       esg.gain, esg.lo, esg.hi, "+0.44"))
    else:
        res.comparisons.append(Comparison.missing("effective size gain", "needs ≥ 3 sizes", "+0.44"))
    return res


def claim_c5(runs: Runs, flow: dict[str, Any] | None) -> ClaimResult:
    res = ClaimResult("C5", "Residual flow ‖h_L−e‖/‖e‖ ≍ d^(1−γ); loss is best at γ = 1 and worse above it",
                      "exponent 1−γ; best loss at γ = 1")
    if flow:
        for gamma, seed_slopes in zip(flow["gammas"], flow["seed_slopes"]):
            res.comparisons.append(Comparison(f"flow exponent − (1−γ) at γ{gamma:g}", [s - (1 - gamma) for s in seed_slopes],
                                              f"0 ± {FLOW_TOLERANCE}", expected="zero", tolerance=FLOW_TOLERANCE))
        res.extra["residual_flow"] = flow
    else:
        res.comparisons.append(Comparison.missing("flow exponent", "residual-flow sweep not run"))
    fixed = runs.where(FIXED)
    n_loss = len(res.comparisons)
    for n in fixed.values("size"):
        at = fixed.where(size=n)
        gammas = at.values("model.gamma")
        if len(gammas) < 3 or 1.0 not in gammas:
            continue
        ref = at.where({"model.gamma": 1.0})
        for g in gammas:
            if g != 1.0:
                res.comparisons.append(Comparison(f"L(γ{g:g})−L(γ1) @{_size_label(n)}", paired(at.where({"model.gamma": g}), ref),
                                                  "> 0"))
    if len(res.comparisons) == n_loss:
        res.comparisons.append(Comparison.missing("loss best at γ = 1", "needs ≥ 3 γ values with the fixes"))
    return res


def _mean_stable_rank(rec: dict[str, Any]) -> float:
    return float(np.mean(list(rec["stable_rank"].values())))


def claim_c6(runs: Runs) -> ClaimResult:
    res = ClaimResult("C6", "With γ = 1 matrices first condense (low stable rank), then expand; γ = 0.5 stays diffuse and "
                      "changes slowly", "qualitative (heatmaps, stable rank)")
    for arm in (FIXED, BASELINE):  # the paper's setting; the baseline only when there is no fixed run
        sel = runs.where(arm)
        for n in sel.values("size"):
            at = sel.where(size=n)
            traj = {g: {r.seed: r.analysis for r in at.where({"model.gamma": g})}
                    for g in (0.5, 1.0)}
            seeds = sorted(s for s in set(traj[0.5]) & set(traj[1.0]) if len(traj[0.5][s]) >= 3 and len(traj[1.0][s]) >= 3)
            if not seeds:
                continue
            early, expand, speed = [], [], []
            curves: dict[str, list] = {}
            for s in seeds:
                r05 = [_mean_stable_rank(r) for r in traj[0.5][s]]
                r1 = [_mean_stable_rank(r) for r in traj[1.0][s]]
                early.append(r05[1] - r1[1])  # first measurement after step 0: γ=1 lower (condensed)
                expand.append(r1[-1] - r1[1])  # γ=1 then grows
                speed.append(float(np.abs(np.diff(r1)).sum() - np.abs(np.diff(r05)).sum()))  # γ=.5 moves less
                curves[f"seed{s}"] = {"steps": [r["step"] for r in traj[1.0][s]], "gamma1": r1, "gamma0.5": r05}
            tag = f"@{_size_label(n)}{' fixed' if arm is FIXED else ' baseline'}"
            res.comparisons += [
                Comparison(f"early srank γ.5−γ1 {tag}", early, "> 0"),
                Comparison(f"srank growth γ1 early→end {tag}", expand, "> 0"),
                Comparison(f"srank path length γ1−γ.5 {tag}", speed, "> 0"),
            ]
            res.extra[f"stable_rank{tag}"] = curves
        if res.comparisons:
            return res  # every size of one arm
    res.comparisons.append(Comparison.missing("stable rank", "no analysis records for γ 0.5 and 1 (analysis.every)"))
    return res


def claim_c7(gaps: dict[int, dict[str, Any]] | None) -> ClaimResult:
    res = ClaimResult("C7", "γ = 1's token-level gains concentrate on moderately-to-highly difficult tokens, not easy ones "
                      "nor the noisiest", "qualitative (Δ_sym by difficulty)")
    if not gaps:
        res.comparisons.append(Comparison.missing("Δ_sym by difficulty", "needs γ 0.5 and 1 runs with the fixes"))
        return res
    mid_easy, mid_noisy = [], []
    for gap in gaps.values():
        d = [b["mean_delta_sym"] for b in gap["bins"]]
        if len(d) != 10:
            continue
        mid = float(np.mean([d[i] for i in MID_BINS]))
        mid_easy.append(mid - float(np.mean([d[i] for i in EASY_BINS])))
        mid_noisy.append(mid - float(np.mean([d[i] for i in NOISY_BINS])))
    res.comparisons += [Comparison("Δ_sym mid−easy deciles", mid_easy, "> 0"),
                        Comparison("Δ_sym mid−noisiest decile", mid_noisy, "> 0")]
    res.extra["token_gap"] = gaps
    return res


CLAIMS = ("C1", "C2", "C3", "C4", "C5", "C6", "C7")


def judge_all(runs: Runs, flow: dict[str, Any] | None = None, gaps: dict[int, dict[str, Any]] | None = None, *,
              n_boot: int = 1000) -> list[ClaimResult]:
    """C1–C7 on ``runs``; C5's exponent needs a residual-flow sweep (``flow``), C7 token comparisons (``gaps``)."""
    return [claim_c1(runs), claim_c2(runs), claim_c3(runs), claim_c4(runs, n_boot=n_boot), claim_c5(runs, flow),
            claim_c6(runs), claim_c7(gaps)]


def gaps_from_compares(compares: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]] | None:
    """C7's input from compare.json contents: γ = 1 (A) against γ = 0.5 (B), both with the fixes, same seed."""
    gaps = {}
    for c in compares:
        a, b = c.get("meta", {}).get("settings_a") or {}, c.get("meta", {}).get("settings_b") or {}
        fixed = all(s.get(k) == v for s in (a, b) for k, v in FIXED.items())
        seed = a.get("train.seed")
        if fixed and a.get("model.gamma") == 1.0 and b.get("model.gamma") == 0.5 and seed == b.get("train.seed"):
            gaps[int(seed or 0)] = c
    return gaps or None
