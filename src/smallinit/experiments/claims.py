"""The paper's claims C1–C7, measured on a set of finished runs, each with a computed verdict.

A claim is tested by one or more comparisons. Each comparison yields one number per seed, signed so that a
positive value is the paper's direction (for example L(γ=0.5) − L(γ=1): γ = 1 better), and is judged by the
project's one rule (:mod:`smallinit.experiments.verdicts`): Student-t over seeds, Holm–Bonferroni within the
claim, and **not testable here** where a precondition fails. The comparisons and their signs come from the
paper's statements; none was chosen or changed to make a verdict agree.

Preconditions are computed from the runs themselves, never from their configuration alone:

* every loss comparison: each run trained to ≥ ``min_tokens_per_param`` tokens per non-embedding
  parameter (20 by default), evaluated at ≥ 4 points, and the gap **settled**: the same sign at half and
  full budget (unless either is within its seed sd of 0: that is noise about no effect, and the t-test
  judges it), and not still moving toward the other sign by more than its seed spread. The gap along
  training is kept with the comparison (``trajectory``), since that curve is the finding.
* C2: the γ = 1 baseline's RMSNorm factor at init, analytic and measured, is below 0.5 (ε can saturate).
* C3: a sink has formed in the no-gate γ = 1 runs: some layer's sink score exceeds 3× the uniform-attention
  value (H_T − 1)/(T − 1), measured on ≥ 16 sequences of ≥ 256 tokens. Without a sink the gate has nothing
  to remove, so the whole claim, its loss gains included, is not testable.
* C6: the γ = 1 stable-rank minimum falls before the last third of training.
* C7: γ = 1 is better on average (its mean Δ_sym's interval above 0) and both models beat a bigram model.
* C1's shrink: γ = 1 ahead (a positive gain) at the smallest and the largest size. C4's effective size: ≥ 3 sizes, ≥ 2 seeds per arm and
  size, matched tokens per parameter, a finite N_eff within 10× of N.

Runs are selected by their resolved configs (γ, ε, gate, size), not by folder names, so any sweep that
holds the right cells can be judged. A "size" is a model shape (width, depth, heads, d_ff, experts), so
runs with and without the gate count as the same size; the scaling fits use the number of parameters
without embeddings. "Baseline" means ε = 1e-5 with no gate — with ε scaled to emulate a d = 2048 model's
saturation at init (``model.norm_eps_width``) where such runs exist, else as given — and "fixed" ε = 1e-12
with the elementwise gate. Runs at another learning rate than the most common one are only used by the
learning-rate check (each γ at its own best rate).
"""

from __future__ import annotations

import functools
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.norm_factor import relative_factor
from ..analysis.scaling import effective_size_gain
from ..config import emulated_eps
from ..errors import ConfigError
from .runs import Run
from .sweep import cell_dir, cell_states, load_cells
from .verdicts import (
    AGREE,
    ALPHA,
    DISAGREE,
    INCONCLUSIVE,
    NOT_TESTABLE,
    TTest,
    combine,
    holm,
    t_test,
)

EMULATED_WIDTH = 2048  # the paper's width at 1.5B, whose saturation the emulated baseline reproduces
BASELINE = {"model.norm_eps": 1e-5, "model.gate": "none", "model.norm_eps_width": 0}
EMULATED = {"model.norm_eps": 1e-5, "model.gate": "none", "model.norm_eps_width": EMULATED_WIDTH}
FIXED = {"model.norm_eps": 1e-12, "model.gate": "elementwise"}
FLOW_TOLERANCE = 0.15  # |fitted exponent − (1 − γ)| allowed for C5 (as in the analysis acceptance)
EASY_BINS, MID_BINS, NOISY_BINS = (0, 1, 2), (4, 5, 6, 7, 8), (9,)  # of 10 difficulty deciles, for C7
MIN_TOKENS_PER_PARAM = 20.0  # per non-embedding parameter, for every loss comparison
MIN_EVALS = 4
SATURATED = 0.5  # C2: the norm factor at init must be below this for ε to matter
SINK_RATIO = 3.0  # C3: a sink has formed when some layer exceeds this multiple of uniform attention
SINK_SEQS, SINK_TOKENS = 16, 256
MAX_SIZE_RATIO = 10.0  # C4: an N_eff/N outside [1/10, 10] is an artefact of the fit, not an estimate


@dataclass
class Comparison:
    """One tested comparison: per-seed values (positive = the paper's direction) and the paper's number.

    ``seeds`` names the seed of each sample where samples are paired by seed (a difference of two comparisons pairs
    the seeds both have). ``untestable`` names a failed precondition; ``estimate``/``lo``/``hi`` hold a comparison
    judged by an interval from elsewhere (a bootstrap); ``trajectory`` the gap along training for a loss
    comparison.
    The verdict is set by the claim that holds the comparison (the family correction needs them all).
    """

    label: str
    samples: list[float]
    paper: str = ""
    seeds: list[int] | None = None
    expected: str = "positive"  # or "zero": within ±tolerance
    tolerance: float = 0.0
    untestable: str = ""
    estimate: float | None = None
    lo: float = math.nan
    hi: float = math.nan
    interval_verdict: str = ""
    trajectory: dict[str, Any] | None = None
    verdict: str = INCONCLUSIVE
    reason: str = ""

    def __post_init__(self) -> None:
        kept = [i for i, x in enumerate(self.samples) if x is not None and math.isfinite(x)]
        self.samples = [float(self.samples[i]) for i in kept]
        if self.seeds is not None:
            self.seeds = [self.seeds[i] for i in kept]

    @staticmethod
    def by_seed(label: str, values: dict[int, float], paper: str = "", **kw: Any) -> Comparison:
        """A comparison of per-seed values, which remembers their seeds."""
        return Comparison(label, list(values.values()), paper, seeds=list(values), **kw)

    @staticmethod
    def difference(label: str, x: Comparison, y: Comparison, paper: str = "") -> Comparison:
        """x's per-seed values minus y's, for the seeds both have; not testable where either is not."""
        xs, ys = dict(zip(x.seeds or [], x.samples)), dict(zip(y.seeds or [], y.samples))
        return Comparison.by_seed(label, {s: xs[s] - ys[s] for s in sorted(xs.keys() & ys.keys())}, paper,
                                  untestable=x.untestable or y.untestable)

    @staticmethod
    def interval(label: str, estimate: float, lo: float, hi: float, level: float, paper: str = "") -> Comparison:
        """A comparison judged by its own interval at ``level``: agree if lo > 0, disagree if hi < 0."""
        v = AGREE if lo > 0 else DISAGREE if hi < 0 else INCONCLUSIVE
        why = f"{level:.1%} interval [{lo:.3g}, {hi:.3g}]" + (" excludes 0" if v != INCONCLUSIVE else " contains 0")
        return Comparison(label, [], paper, estimate=estimate, lo=lo, hi=hi, interval_verdict=v, reason=why)

    @staticmethod
    def missing(label: str, why: str, paper: str = "") -> Comparison:
        """A part of a claim these runs cannot test, and why."""
        return Comparison(label, [], paper, untestable=why)

    def test(self) -> TTest | str:
        """The t-test of the samples, or why there is none."""
        if self.untestable:
            return self.untestable
        return t_test(self.samples, self.expected, self.tolerance)

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
            return f"{self.label}: not measured"
        sd = f" ± {self.sd:.3f}" if len(self.samples) > 1 else ""
        return f"{self.label}: {self.mean:+.3f}{sd} (n={len(self.samples)})"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "samples": self.samples, "seeds": self.seeds, "mean": self.mean, "sd": self.sd,
                "n": len(self.samples), "expected": self.expected, "tolerance": self.tolerance,
                "estimate": self.estimate, "lo": self.lo, "hi": self.hi, "verdict": self.verdict, "reason": self.reason,
                "paper": self.paper, "trajectory": self.trajectory, "text": self.text()}


@dataclass
class ClaimResult:
    claim: str
    statement: str
    paper: str
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    untestable: str = ""  # a precondition of the whole claim that failed

    def judge(self) -> None:
        """Every comparison's verdict and reason: the t-tests, then Holm over the claim's family."""
        tests = []
        for c in self.comparisons:
            if self.untestable:
                c.verdict, c.reason = NOT_TESTABLE, self.untestable
            elif c.untestable:
                c.verdict, c.reason = NOT_TESTABLE, c.untestable
            elif c.interval_verdict:
                c.verdict = c.interval_verdict
            else:
                t = c.test()
                if isinstance(t, str):
                    c.verdict, c.reason = NOT_TESTABLE, t
                else:
                    tests.append((c, t))
        rejected = holm([t.p for _, t in tests])
        for (c, t), rej in zip(tests, rejected):
            c.verdict = t.outcome if rej else INCONCLUSIVE
            c.reason = (f"95% t-interval [{t.lo:+.3g}, {t.hi:+.3g}]; p = {t.p:.2g} ({t.why}), "
                        f"{'rejected' if rej else 'not rejected'} by Holm at α = {ALPHA:g} over {len(tests)}")

    @property
    def n_testable(self) -> int:
        """Comparisons that will be judged by a test (the size of the family)."""
        return sum(1 for c in self.comparisons if not isinstance(c.test(), str))

    @property
    def verdict(self) -> str:
        self.judge()
        return combine(c.verdict for c in self.comparisons)

    @property
    def measured(self) -> str:
        parts = [c.text() for c in self.comparisons] or ["not measured at this scale"]
        return "; ".join(parts + self.notes)

    def to_dict(self) -> dict[str, Any]:
        verdict = self.verdict
        return {"claim": self.claim, "statement": self.statement, "paper": self.paper, "verdict": verdict,
                "untestable": self.untestable, "measured": self.measured,
                "comparisons": [c.to_dict() for c in self.comparisons], "notes": self.notes, "extra": self.extra}


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
                states = cell_states(spec.parent)
                for cell in load_cells(spec.parent):
                    run = Run.load(cell_dir(spec.parent, cell.id), cell.id) \
                        if states.get(cell.id, {}).get("status") == "done" else None
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

    def run_by_seed(self) -> dict[int, Run]:
        """The run of each seed (the last one if a seed has several, which one selection should not)."""
        return {r.seed: r for r in self.runs}

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self):
        return iter(self.runs)


def val_loss(run: Run) -> float | None:
    return run.val_loss


def paired(a: Runs, b: Runs, metric: Callable[[Run], float | None] = val_loss) -> dict[int, float]:
    """metric(a) − metric(b) by seed, for every seed both selections finished."""
    ma, mb = a.by_seed(metric), b.by_seed(metric)
    return {s: ma[s] - mb[s] for s in sorted(set(ma) & set(mb))}


def size_label(size: tuple) -> str:
    """d_model × layers (× experts), as comparisons name a size: "d32×4"."""
    return f"d{size[0]}×{size[1]}" + (f"×{size[4]}e" if size[4] else "")


def _last_analysis(run: Run) -> dict[str, Any] | None:
    """The run's last analysis record, if it was taken in the last sixth of training (the end state)."""
    recs = run.analysis
    steps = int(run.config.get("train.steps") or 0)
    return recs[-1] if recs and recs[-1].get("step", 0) >= 5 / 6 * steps else None


def sink_mean(run: Run) -> float | None:
    """Mean sink score over layers at the end of training (the analysis record of the last step)."""
    rec = _last_analysis(run)
    return float(rec["sink_mean"]) if rec and "sink_mean" in rec else None


def effective_eps(run: Run) -> float:
    """The ε the run's norms used (``model.norm_eps_width`` scales it)."""
    c = run.config
    return emulated_eps(float(c["model.norm_eps"]), int(c.get("model.norm_eps_width") or 0), int(c["model.d_model"]),
                        float(c["model.gamma"]))


def uniform_sink(seq_len: int) -> float:
    """The sink score of uniform causal attention: mean over query positions i = 2..T of 1/i."""
    return (sum(1.0 / i for i in range(1, seq_len + 1)) - 1.0) / (seq_len - 1)


# -- loss comparisons: the regime check --------------------------------------------------------------------------


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


def regime_problem(runs: Iterable[Run], traj: dict[str, Any] | None, min_tpp: float) -> str:
    """Why a loss comparison of these runs is not a verdict yet ("" when it is)."""
    runs = list(runs)
    if not runs or traj is None:
        return "no paired evaluations"
    least = min(runs, key=lambda r: r.tokens_per_param())
    if least.tokens_per_param() < min_tpp:
        return (f"trained to {least.tokens_per_param():.2g} tokens per non-embedding parameter < {min_tpp:g} "
                f"({least.name})")
    steps, mean, tpp = traj["steps"], traj["mean"], traj["tokens_per_param"]
    if len(steps) < MIN_EVALS:
        return f"evaluated at {len(steps)} points < {MIN_EVALS}: the gap's course is unknown"
    half = min(range(len(steps)), key=lambda i: abs(steps[i] - steps[-1] / 2))
    g_half, g_full = mean[half], mean[-1]
    at = f"{g_half:+.3f} at {tpp[half]:.3g} tokens/param → {g_full:+.3f} at {tpp[-1]:.3g}"
    change, spread = g_full - g_half, traj["sd"][-1]
    # a flip between two values each within its seed spread of 0 is noise about no effect, for the t-test
    if np.sign(g_half) != np.sign(g_full) and min(abs(g_half) - traj["sd"][half], abs(g_full) - spread) > 0:
        return f"the gap changed sign ({at})"
    if np.sign(change) == -np.sign(g_full) and math.isfinite(spread) and abs(change) > spread:
        return f"the gap is still closing ({at}; moved {abs(change):.3f} > seed sd {spread:.3f})"
    return ""


def loss_comparison(label: str, a: Runs, b: Runs, paper: str, min_tpp: float) -> Comparison:
    """L(a) − L(b) at the end of training, paired by seed, testable only in the trained, settled regime."""
    traj = gap_trajectory(a, b)
    c = Comparison.by_seed(label, paired(a, b), paper, trajectory=traj)
    c.untestable = regime_problem([*a, *b], traj, min_tpp)
    return c


# -- the claims --------------------------------------------------------------------------------------------------


def _judged(claim: Callable[..., ClaimResult]) -> Callable[..., ClaimResult]:
    """A claim function whose result comes back judged (verdicts and reasons set)."""

    @functools.wraps(claim)
    def wrapper(*args: Any, **kwargs: Any) -> ClaimResult:
        res = claim(*args, **kwargs)
        res.judge()
        return res

    return wrapper


def _baselines(runs: Runs) -> list[tuple[str, dict[str, Any]]]:
    """(claim suffix, selection) of the baseline arms present: emulated saturation first, plain ε beside it."""
    found = [("", EMULATED)] if len(runs.where(EMULATED)) else []
    if len(runs.where(BASELINE)):
        found.append((" (plain ε)" if found else "", BASELINE))
    return found or [("", BASELINE)]


@_judged
def claim_c1(runs: Runs, *, baseline: dict[str, Any] | None = None, suffix: str = "",
             min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
    res = ClaimResult("C1" + suffix, "Without the fixes, γ = 1 beats γ = 0.5 at every size, but the gain shrinks "
                      "with size", "gain ≈ 0.05 at 0.1B → ≈ 0.003 at 1.5B")
    base = runs.where(baseline or _baselines(runs)[0][1])
    gains: dict[tuple, Comparison] = {}
    for n in base.values("size"):
        c = loss_comparison(f"L(γ.5)−L(γ1) @{size_label(n)}", base.where({"model.gamma": 0.5, "size": n}),
                            base.where({"model.gamma": 1.0, "size": n}), "≈ +0.05 … +0.003", min_tpp)
        if c.samples:
            gains[n] = c
            res.comparisons.append(c)
    if len(gains) >= 2:
        lo, hi = min(gains), max(gains)
        shrink = Comparison.difference(f"gain shrink {size_label(lo)}→{size_label(hi)}", gains[lo], gains[hi],
                                       "≈ +0.047")
        if min(gains[lo].mean, gains[hi].mean) <= 0:
            shrink.untestable = (f"γ = 1 is not ahead at both ends ({gains[lo].mean:+.3f} at {size_label(lo)}, "
                                 f"{gains[hi].mean:+.3f} at {size_label(hi)}): there is no gain to shrink")
        elif gains[lo].untestable or gains[hi].untestable:
            shrink.untestable = "the gain at the smallest or largest size is not testable: " + (
                gains[lo].untestable or gains[hi].untestable)
        res.comparisons.append(shrink)
    elif gains:
        res.comparisons.append(Comparison.missing("gain shrink with size", "needs ≥ 2 sizes of baseline runs"))
    else:
        res.comparisons.append(Comparison.missing("L(γ.5)−L(γ1) without fixes", "no baseline runs at γ 0.5 and 1"))
    return res


def measured_factor_at_init(run: Run) -> float | None:
    """The mean measured RMSNorm factor over the model's norms at step 0 (the analysis callback's)."""
    recs = [r for r in run.analysis if r.get("step") == 0 and r.get("norm_factor")]
    return float(np.mean(list(recs[0]["norm_factor"].values()))) if recs else None


def _saturation_problem(analytic: float, measured: float, size: str) -> str:
    """Why C2 cannot be tested at this size ("" if it can): ε must saturate RMSNorm at init, by the formula and as
    measured."""
    if not analytic < SATURATED:
        factor, how = analytic, "by the formula"
    elif not math.isfinite(measured):
        return f"the norm factor at init was not measured at {size} (the analysis callback is off: set analysis.every)"
    elif not measured < SATURATED:
        factor, how = measured, "as measured"
    else:
        return ""
    return (f"norm factor at init {factor:.2f} ≥ {SATURATED} ({how}) at {size}: ε cannot saturate (emulate it with "
            "model.norm_eps_width)")


@_judged
def claim_c2(runs: Runs, *, baseline: dict[str, Any] | None = None, suffix: str = "",
             min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
    res = ClaimResult("C2" + suffix, "ε = 1e-12 instead of 1e-5 lowers the loss at γ = 1 (RMSNorm saturation), "
                      "hardly at γ = 0.5", "−0.038 at γ=1, −0.001 at γ=0.5 (1.5B)")
    fixed_eps = {"model.norm_eps": 1e-12, "model.gate": "none"}
    base, fixd = runs.where(baseline or _baselines(runs)[0][1]), runs.where(fixed_eps)
    for n in sorted(set(base.values("size")) & set(fixd.values("size"))):
        b1, f1 = base.where({"model.gamma": 1.0, "size": n}), fixd.where({"model.gamma": 1.0, "size": n})
        b05, f05 = base.where({"model.gamma": 0.5, "size": n}), fixd.where({"model.gamma": 0.5, "size": n})
        if not (len(b1) and len(f1) and len(b05) and len(f05)):
            continue
        analytic = float(np.mean([relative_factor(1.0, effective_eps(r), n[0]) for r in b1]))
        measured = [m for m in (measured_factor_at_init(r) for r in b1) if m is not None]
        m = float(np.mean(measured)) if measured else math.nan
        res.notes.append(f"γ=1 baseline norm factor at init @{size_label(n)}: analytic {analytic:.3f}, measured "
                         f"{m:.3f} (target {relative_factor(1.0, 1e-5, EMULATED_WIDTH):.3f} at d=2048)")
        problem = _saturation_problem(analytic, m, size_label(n))
        fix1 = loss_comparison(f"ε-fix gain at γ1 @{size_label(n)}", b1, f1, "+0.038", min_tpp)
        fix05 = loss_comparison(f"ε-fix gain at γ.5 @{size_label(n)}", b05, f05, "+0.001", min_tpp)
        diff = Comparison.difference(f"γ1 minus γ.5 ε-fix gain @{size_label(n)}", fix1, fix05, "+0.037")
        for c in (fix1, diff):  # this size's precondition: another size may saturate
            c.untestable = problem or c.untestable
        res.comparisons += [fix1, diff]
    if not res.comparisons:
        res.comparisons.append(Comparison.missing("ε-fix gain", "needs γ {0.5, 1} × ε {1e-5, 1e-12} without gate"))
    return res


def sink_layers(run: Run) -> tuple[list[float], int, int] | None:
    """Per-layer sink scores at the end of training, with the sequences and tokens they were measured on."""
    rec = _last_analysis(run)
    if not rec or "sink" not in rec:
        return None
    layers = [float(rec["sink"][k]) for k in sorted(rec["sink"], key=int)]
    return layers, int(run.config.get("analysis.batch_size", 0)), int(run.config.get("data.seq_len", 0))


def sink_formed(runs: Runs) -> tuple[str, str]:
    """(problem or "", note) for C3's precondition on the no-gate γ = 1 runs."""
    measured = [m for m in (sink_layers(r) for r in runs) if m is not None]
    if not measured:
        return "no sink scores at the end of training (analysis.every was off)", ""
    seqs, tokens = min(m[1] for m in measured), min(m[2] for m in measured)
    per_layer = np.mean([m[0] for m in measured], axis=0)
    uniform = uniform_sink(tokens)
    note = (f"sink per layer, no gate, γ=1 (mean of {len(measured)} runs, {seqs} × {tokens} tokens): "
            + ", ".join(f"{v:.3f}" for v in per_layer) + f"; uniform attention {uniform:.3f}")
    if seqs < SINK_SEQS or tokens < SINK_TOKENS:
        return f"sink measured on {seqs} sequences of {tokens} tokens, needs ≥ {SINK_SEQS} of ≥ {SINK_TOKENS}", note
    if per_layer.max() <= SINK_RATIO * uniform:
        return (f"no sink has formed: largest layer sink {per_layer.max():.3f} ≤ {SINK_RATIO:g} × {uniform:.3f} "
                "(uniform attention)"), note
    return "", note


@_judged
def claim_c3(runs: Runs, *, min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
    res = ClaimResult("C3", "Small init raises the attention sink; the gate removes it and lowers the loss at γ = 1, "
                      "hardly at γ = 0.5", "sink +0.11/layer; gate −0.047 at γ=1, −0.004 at γ=0.5 (1.5B, ε=1e-12)")
    sel = runs.where({"model.norm_eps": 1e-12})
    for n in sel.values("size"):
        at = sel.where(size=n)
        cells = {(g, gate): at.where({"model.gamma": g, "model.gate": gate})
                 for g in (0.5, 1.0) for gate in ("none", "elementwise")}
        if not all(len(c) for c in cells.values()):
            continue
        gate1 = loss_comparison(f"gate gain at γ1 @{size_label(n)}", cells[1.0, "none"], cells[1.0, "elementwise"],
                                "+0.047", min_tpp)
        gate05 = loss_comparison(f"gate gain at γ.5 @{size_label(n)}", cells[0.5, "none"],
                                 cells[0.5, "elementwise"], "+0.004", min_tpp)
        at_size = [gate1, Comparison.difference(f"γ1 minus γ.5 gate gain @{size_label(n)}", gate1, gate05, "+0.043")]
        problem, note = sink_formed(cells[1.0, "none"])
        if note:
            res.notes.append(f"@{size_label(n)}: {note}")
        for label, a, b, paper in (
            (f"sink γ1−γ.5 (no gate) @{size_label(n)}", cells[1.0, "none"], cells[0.5, "none"], "+0.11"),
            (f"sink no gate − gate at γ1 (Fig. 1g) @{size_label(n)}", cells[1.0, "none"],
             cells[1.0, "elementwise"], "> 0"),
        ):
            at_size.append(Comparison.by_seed(label, paired(a, b, sink_mean), paper))
        for c in at_size:  # this size's precondition (the gate's gain is the paper's cure for the sink)
            c.untestable = problem or c.untestable
        res.comparisons += at_size
    if not res.comparisons:
        res.comparisons.append(Comparison.missing("gate gain", "needs γ {0.5, 1} × gate {none, elementwise} at ε 1e-12"))
    return res


def best_lr_comparison(runs: Runs, size: tuple, min_tpp: float) -> tuple[Comparison, str] | None:
    """L(γ.5) − L(γ1) with each γ at its best learning rate (fixed arm), and a note of the rates chosen.

    Each seed's rates are chosen on the other seeds' mean loss, so the seed that is tested did not pick its own
    rate: picking on the same losses that are then tested would favour whichever γ's best run was luckiest.
    """
    at = runs.where(FIXED).where(size=size)
    lrs = at.values("train.lr")
    if len(lrs) < 2:
        return None
    cells = {(g, lr): at.where({"model.gamma": g, "train.lr": lr}) for g in (0.5, 1.0) for lr in lrs}
    loss = {k: cell.by_seed(val_loss) for k, cell in cells.items()}
    by_seed = {k: cell.run_by_seed() for k, cell in cells.items()}
    chosen: dict[float, dict[int, Run]] = {0.5: {}, 1.0: {}}  # each seed's run at the rate the other seeds chose
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
    note = (f"@{size_label(size)}: best lr per seed, chosen on the other seeds (γ.5 / γ1): "
            + ", ".join(f"seed {s} {lr[0.5][s]:g} / {lr[1.0][s]:g}" for s in seeds))
    return loss_comparison(f"L(γ.5)−L(γ1) fixed @{size_label(size)}, each γ at its best lr",
                           Runs(list(chosen[0.5].values())), Runs(list(chosen[1.0].values())), "> 0", min_tpp), note


@_judged
def claim_c4(runs: Runs, *, arm: dict[str, Any] = FIXED, n_boot: int = 1000, all_lrs: Runs | None = None,
             min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
    """With ``arm`` = a baseline the same measurement serves as the contrast without the fixes; ``all_lrs``
    (runs at every learning rate) adds the comparison with each γ at its own best rate."""
    res = ClaimResult("C4", "With both fixes γ = 1 beats γ = 0.5 at every size: ≈ 44 % effective model size",
                      "gain at every size; +44 % effective size")
    fixed = runs.where(arm)
    tag = "fixed" if arm is FIXED else "baseline"
    g05, g1 = fixed.where({"model.gamma": 0.5}), fixed.where({"model.gamma": 1.0})
    for n in fixed.values("size"):
        c = loss_comparison(f"L(γ.5)−L(γ1) {tag} @{size_label(n)}", g05.where(size=n), g1.where(size=n), "> 0",
                            min_tpp)
        if c.samples:
            res.comparisons.append(c)
        best = best_lr_comparison(all_lrs, n, min_tpp) if all_lrs is not None and arm is FIXED else None
        if best is not None:
            res.comparisons.append(best[0])
            res.notes.append(best[1])
    res.comparisons.append(_effective_size(res, g05, g1, n_boot, min_tpp))
    return res


def _effective_size(res: ClaimResult, g05: Runs, g1: Runs, n_boot: int, min_tpp: float) -> Comparison:
    label, paper = "effective size gain", "+0.44"
    sizes = sorted(set(g05.values("size")) & set(g1.values("size")))
    if len(sizes) < 3:
        return Comparison.missing(label, f"needs ≥ 3 sizes with both γ, has {len(sizes)}", paper)
    seeds = min(len(sel.where(size=n).by_seed(val_loss)) for sel in (g05, g1) for n in sizes)
    if seeds < 2:
        return Comparison.missing(label, f"{seeds} seed(s) at some size: needs ≥ 2 per arm and size", paper)
    tpp = [r.tokens_per_param() for r in (*g05, *g1)]
    if min(tpp) < min_tpp:
        return Comparison.missing(label, f"trained to {min(tpp):.2g} tokens per non-embedding parameter < {min_tpp:g}",
                                  paper)
    if max(tpp) > 1.5 * min(tpp):
        return Comparison.missing(label, f"tokens per parameter differ {max(tpp) / min(tpp):.1f}× across sizes: not "
                                  "a scaling law at matched training", paper)
    level = 1 - ALPHA / (res.n_testable + 1)  # Bonferroni within the claim (see smallinit.experiments.verdicts)
    base = [r for r in g05 if r.val_loss and r.size in sizes]
    treat = [r for r in g1 if r.val_loss and r.size in sizes]
    try:
        esg = effective_size_gain(
            [r.params_nonembed for r in base], [r.val_loss for r in base], [r.params_nonembed for r in treat],
            [r.val_loss for r in treat], base_seed=[r.seed for r in base], treat_seed=[r.seed for r in treat],
            n_boot=n_boot, ci=level,
        )
    except ConfigError as e:
        return Comparison.missing(label, f"fit failed: {e}", paper)
    res.extra["effective_size_gain"] = esg.to_dict()
    ratio = 1 + esg.gain
    if not (math.isfinite(ratio) and 1 / MAX_SIZE_RATIO <= ratio <= MAX_SIZE_RATIO) or esg.unbounded:
        return Comparison.missing(label, f"no sane estimate: N_eff/N = {ratio:.3g} from the fit "
                                  f"({'; '.join(esg.notes) or 'outside [0.1, 10]'})", paper)
    return Comparison.interval(f"{label} (bootstrap over seeds)", esg.gain, esg.lo, esg.hi, level, paper)


@_judged
def claim_c5(runs: Runs, flow: dict[str, Any] | None, *, min_tpp: float = MIN_TOKENS_PER_PARAM) -> ClaimResult:
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
                res.comparisons.append(loss_comparison(f"L(γ{g:g})−L(γ1) @{size_label(n)}",
                                                       at.where({"model.gamma": g}), ref, "> 0", min_tpp))
    if len(res.comparisons) == n_loss:
        res.comparisons.append(Comparison.missing("loss best at γ = 1", "needs ≥ 3 γ values with the fixes"))
    return res


def _mean_stable_rank(rec: dict[str, Any]) -> float:
    return float(np.mean(list(rec["stable_rank"].values())))


@_judged
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
            if steps[lowest] > 2 / 3 * steps[k - 1]:
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


@_judged
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


def reference_lr(runs: Runs) -> Runs:
    """The runs at the most common learning rate (the others belong to a learning-rate check)."""
    lrs = Counter(float(r.config.get("train.lr", 0.0)) for r in runs)
    return runs.where({"train.lr": lrs.most_common(1)[0][0]}) if lrs else runs


def judge_all(runs: Runs, flow: dict[str, Any] | None = None, gaps: dict[int, dict[str, Any]] | None = None, *,
              n_boot: int = 1000, min_tpp: float = MIN_TOKENS_PER_PARAM) -> list[ClaimResult]:
    """C1–C7 on ``runs``; C5's exponent needs a residual-flow sweep (``flow``), C7 token comparisons (``gaps``).
    C1 and C2 are judged once per baseline present (emulated saturation, plain ε)."""
    main = reference_lr(runs)
    out = []
    for suffix, arm in _baselines(main):
        out.append(claim_c1(main, baseline=arm, suffix=suffix, min_tpp=min_tpp))
    for suffix, arm in _baselines(main):
        out.append(claim_c2(main, baseline=arm, suffix=suffix, min_tpp=min_tpp))
    out += [claim_c3(main, min_tpp=min_tpp), claim_c4(main, n_boot=n_boot, all_lrs=runs, min_tpp=min_tpp),
            claim_c5(main, flow, min_tpp=min_tpp), claim_c6(main), claim_c7(gaps)]
    return out


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
