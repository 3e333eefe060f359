"""Effective model size: :func:`effective_size_gain` fits the scaling law
(:func:`smallinit.study.judging.scaling.fit_power_law`) to baseline runs and asks, for each treated run, how
large a baseline model would have to be to reach the treated loss: ``N_eff / N - 1``, with a bootstrap interval
over seeds.

Plain numpy/scipy; nothing here needs torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtri, stdtrit

from smallinit.errors import ConfigError
from smallinit.fields import to_json
from smallinit.study.judging.scaling import (
    N_PARAMS,
    PowerLawFit,
    check_fit_options,
    check_sizes_losses,
    fit_checked,
)

__all__ = ["EffectiveSizeGain", "SizeGain", "effective_size_gain"]


def _check_seeds(name: str, seeds: Any, n: int) -> np.ndarray | None:
    if seeds is None:
        return None
    arr = np.asarray(seeds)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or arr.size != n:
        raise ConfigError(f"{name} must give one seed per run ({n}), got shape {arr.shape}")
    if arr.dtype == object:
        raise ConfigError(f"{name} must hold plain integers or strings, one per run")
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise ConfigError(f"{name} contains NaN; give every run a seed")
    return arr


@dataclass(frozen=True)
class SizeGain:
    """Effective-size gain at one treated size."""

    N: float
    treated_loss: float  # mean treated loss over the runs (seeds) at this size
    n_runs: int
    N_eff: float  # baseline size that reaches treated_loss on the fitted baseline law (inf: never)
    gain: float  # N_eff / N - 1
    lo: float  # bootstrap interval of gain (widened like the overall one)
    hi: float
    unbounded: bool  # treated_loss <= fitted asymptote c
    extrapolated: bool  # N_eff lies outside the range of baseline sizes

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


@dataclass(frozen=True)
class EffectiveSizeGain:
    """How much larger a baseline model must be to match the treated runs.

    ``gain`` is the overall estimate ``geomean_sizes(N_eff / N) - 1``; ``(lo, hi)`` its bootstrap
    interval at level ``ci``: the percentile interval ``(pct_lo, pct_hi)`` widened about the bootstrap
    median by ``widen`` = t(dof)/z quantile ratio (1 when the small-sample correction is off);
    ``dof`` is the resampling degrees of freedom of both arms together. ``per_size`` holds one
    :class:`SizeGain` per treated size (its interval is widened the same way).
    ``unbounded`` is set (and ``gain`` is inf) when some treated loss lies at or below the baseline's
    fitted asymptote, where no finite baseline reaches it.
    """

    gain: float
    lo: float
    hi: float
    ci: float
    pct_lo: float
    pct_hi: float
    dof: float
    widen: float
    per_size: tuple[SizeGain, ...]
    base_fit: PowerLawFit
    n_boot: int
    n_boot_ok: int
    bootstrap: str  # how the replicates were drawn
    unbounded: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def _effective_dof(
    bN: np.ndarray,
    bL: np.ndarray,
    b_seeds: np.ndarray | None,
    tN: np.ndarray,
    tL: np.ndarray,
    t_seeds: np.ndarray | None,
    sizes: np.ndarray,
    mean_loss: np.ndarray,
    base_fit: PowerLawFit,
    theta: np.ndarray,
    log_nref: float,
    loss: str,
    fallback: float,
) -> float:
    """Satterthwaite degrees of freedom of the overall gain's seed-to-seed variance.

    The gain is linearised in the mean loss at each (arm, size): analytically for the treated arm,
    by central differences of the refitted baseline law for the baseline arm. Each arm's variance
    contribution carries its own dof (see :func:`_arm_components`); ``fallback`` is returned when
    a refit fails.
    """
    ratios = _size_ratios(base_fit, sizes, mean_loss)
    g_overall = _overall(ratios)
    excess = mean_loss - base_fit.c
    grad_t = {float(n): -(1.0 + g_overall) / (sizes.size * base_fit.b * e) for n, e in zip(sizes, excess)}
    grad_b: dict[float, float] = {}
    delta = 1e-4
    ones = np.ones(bN.size)
    for size in np.unique(bN):
        at = bN == size
        vals = []
        for sign in (1.0, -1.0):
            Lp = bL.copy()
            Lp[at] *= 1.0 + sign * delta
            fit, _, ok = fit_checked(
                bN, Lp, ones, loss=loss, f_scale=base_fit.f_scale, start=theta, log_nref=log_nref
            )
            if not ok:
                return fallback
            vals.append(_overall(_size_ratios(fit, sizes, mean_loss)))
        if not all(math.isfinite(v) for v in vals):
            return fallback
        grad_b[float(size)] = (vals[0] - vals[1]) / (2.0 * delta * float(bL[at].mean()))
    comps = _arm_components(bN, bL, b_seeds, grad_b) + _arm_components(tN, tL, t_seeds, grad_t)
    return _satterthwaite(comps)


def _size_ratios(fit: PowerLawFit, sizes: np.ndarray, mean_loss: np.ndarray) -> np.ndarray:
    return np.asarray(fit.inverse(mean_loss), dtype=float).reshape(-1) / sizes


def _overall(ratios: np.ndarray) -> float:
    if np.isinf(ratios).any():
        return math.inf
    return float(np.exp(np.mean(np.log(ratios))) - 1.0)


def _groups(keys: np.ndarray) -> list[np.ndarray]:
    _, inverse = np.unique(keys, return_inverse=True)
    return [np.flatnonzero(inverse == k) for k in range(int(inverse.max()) + 1)]


def _n_draws(n: int) -> int:
    """Draws per resample: n − 1 (not n) so that the bootstrap variance of a mean is unbiased.

    The mean of m draws with replacement from n values has variance σ̂²/m with σ̂² = (n−1)/n · s²;
    m = n − 1 gives s²/n, the usual unbiased estimate. With 3 seeds, m = n would shrink the interval
    by a factor sqrt(2/3).
    """
    return max(n - 1, 1)


def _resampler(sizes: np.ndarray, seeds: np.ndarray | None):
    """Index sampler for one arm (whole seeds, or runs within each size) and its degrees of freedom.

    The degrees of freedom count independent resampling units minus the strata they sit in:
    seeds − 1 for the cluster bootstrap, Σ_sizes (runs − 1) otherwise.
    """
    if seeds is not None:
        clusters = _groups(seeds)
        m = _n_draws(len(clusters))

        def draw(rng: np.random.Generator) -> np.ndarray:
            pick = rng.integers(0, len(clusters), size=m)
            return np.concatenate([clusters[k] for k in pick])

        return draw, len(clusters) - 1
    strata = _groups(sizes)

    def draw(rng: np.random.Generator) -> np.ndarray:
        return np.concatenate([g[rng.integers(0, g.size, size=_n_draws(g.size))] for g in strata])

    return draw, sum(g.size - 1 for g in strata)


def _widening(dof: float, alpha: float) -> float:
    """Student-t over normal quantile at ``dof`` degrees of freedom (1 when there is no spread)."""
    if not dof > 0:
        return 1.0
    return float(stdtrit(max(dof, 1.0), 1.0 - alpha) / ndtri(1.0 - alpha))


def _arm_components(
    N: np.ndarray, L: np.ndarray, seeds: np.ndarray | None, grad: dict[float, float]
) -> list[tuple[float, float]]:
    """(variance contribution to the gain, degrees of freedom) of one arm, linearised by ``grad``.

    ``grad`` maps each size to d gain / d (mean loss at that size). Without seed labels every size
    is its own component (n − 1 dof); with them the arm is one component whose variance comes from
    the per-seed linear scores, with seeds − 1 dof.
    """
    by_size = {float(n): np.flatnonzero(N == n) for n in np.unique(N)}
    if seeds is None:
        out = []
        for size, idx in by_size.items():
            if idx.size > 1:
                out.append((grad[size] ** 2 * float(np.var(L[idx], ddof=1)) / idx.size, idx.size - 1.0))
        return out
    clusters = _groups(seeds)
    if len(clusters) < 2:
        return []
    scores = []
    for members in clusters:
        z = 0.0
        for size, idx in by_size.items():
            mine = np.intersect1d(idx, members, assume_unique=True)
            if mine.size == 0:  # a seed without runs at every size: no linear score, count it plainly
                total = sum(
                    grad[sz] ** 2 * float(np.var(L[ix], ddof=1)) / ix.size
                    for sz, ix in by_size.items()
                    if ix.size > 1
                )
                return [(total, len(clusters) - 1.0)]
            z += grad[size] * float(L[mine].mean())
        scores.append(z)
    return [(float(np.var(scores, ddof=1)) / len(clusters), len(clusters) - 1.0)]


def _satterthwaite(components: list[tuple[float, float]]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of independent variance estimates."""
    parts = [(v, d) for v, d in components if v > 0 and d > 0]
    total = sum(v for v, _ in parts)
    if total <= 0:
        return 0.0
    return float(total**2 / sum(v * v / d for v, d in parts))


def _interval(values: np.ndarray, alpha: float, widen: float) -> tuple[float, float, float, float]:
    """(lo, hi) widened about the bootstrap median by ``widen``, and the raw percentile (lo, hi)."""
    lo, hi = _quantile(values, alpha), _quantile(values, 1.0 - alpha)
    if not (np.isfinite(values).all() and values.size):
        return lo, hi, lo, hi
    mid = float(np.median(values))
    return mid - widen * (mid - lo), mid + widen * (hi - mid), lo, hi


def _quantile(values: np.ndarray, q: float) -> float:
    if values.size == 0:
        return math.nan
    if np.isinf(values).any():
        # interpolation across inf gives nan; pick an actual replicate instead
        return float(np.quantile(values, q, method="inverted_cdf"))
    return float(np.quantile(values, q))


def _estimate_notes(
    sizes: np.ndarray, unbounded: np.ndarray, extrapolated: np.ndarray, c: float
) -> list[str]:
    """Notes on treated sizes whose N_eff is unbounded, or lies outside the baseline sizes."""
    notes = []
    if unbounded.any():
        listed = ", ".join(f"{s:g}" for s in sizes[unbounded])
        notes.append(
            f"treated loss at or below the baseline asymptote c = {c:.4g} at N = {listed}: "
            "gain unbounded (inf)"
        )
    if extrapolated.any():
        listed = ", ".join(f"{s:g}" for s in sizes[extrapolated])
        notes.append(f"N_eff lies outside the baseline sizes at N = {listed}: extrapolated from the fit")
    return notes


def _replicate_ratios(
    bN: np.ndarray,
    bL: np.ndarray,
    tN: np.ndarray,
    tL: np.ndarray,
    sizes: np.ndarray,
    base_fit: PowerLawFit,
    theta: np.ndarray,
    log_nref: float,
    loss: str,
) -> np.ndarray | None:
    """``N_eff / N`` per treated size for one bootstrap replicate (the runs drawn from each arm).

    The baseline is refitted from the full fit's θ, ``N_ref`` and ``f_scale``. None when the
    replicate fails: the refit raises or does not converge, or a treated size has no run drawn.
    """
    try:
        fit, _, ok = fit_checked(
            bN, bL, np.ones(bN.size), loss=loss, f_scale=base_fit.f_scale, start=theta, log_nref=log_nref
        )
    except ConfigError:
        return None
    if not ok:
        return None
    t_idx = np.searchsorted(sizes, tN)
    counts = np.bincount(t_idx, minlength=sizes.size)
    if (counts == 0).any():
        return None
    mean_loss = np.bincount(t_idx, weights=tL, minlength=sizes.size) / counts
    return _size_ratios(fit, sizes, mean_loss)


def _bootstrap_summary(
    boot: list[np.ndarray], n_boot: int, n_sizes: int, alpha: float, widen: float
) -> tuple[tuple[float, float, float, float], list[tuple[float, float]], list[str]]:
    """Bootstrap intervals and notes from the replicates' ``N_eff / N``.

    Returns (lo, hi, pct_lo, pct_hi) of the overall gain and (lo, hi) per treated size, all nan
    without replicates, and notes on unbounded and failed replicates.
    """
    notes = []
    if boot:
        bo = np.asarray([_overall(r) for r in boot])
        bs = np.vstack([r - 1.0 for r in boot])
        overall_iv = _interval(bo, alpha, widen)
        size_iv = [_interval(bs[:, k], alpha, widen)[:2] for k in range(n_sizes)]
        n_inf = int(np.isinf(bo).sum())
        if n_inf:
            notes.append(f"{n_inf} of {len(boot)} bootstrap replicates had an unbounded gain")
    else:
        overall_iv = (math.nan, math.nan, math.nan, math.nan)
        size_iv = [(math.nan, math.nan)] * n_sizes
        if n_boot > 0:
            notes.append("no bootstrap replicate succeeded: interval is nan")
    if n_boot - len(boot) > 0:
        notes.append(f"{n_boot - len(boot)} of {n_boot} bootstrap replicates failed and were dropped")
    return overall_iv, size_iv, notes


def effective_size_gain(
    base_N: Sequence[float] | np.ndarray,
    base_L: Sequence[float] | np.ndarray,
    treat_N: Sequence[float] | np.ndarray,
    treat_L: Sequence[float] | np.ndarray,
    *,
    base_seed: Sequence[Any] | np.ndarray | None = None,
    treat_seed: Sequence[Any] | np.ndarray | None = None,
    n_boot: int = 1000,
    rng_seed: int = 0,
    ci: float = 0.9,
    loss: str = "soft_l1",
    f_scale: float | None = None,
    small_sample_correction: bool = True,
) -> EffectiveSizeGain:
    """Effective model-size gain of treated runs over a baseline scaling law.

    1. Fit ``L_base(N) = a N^-b + c`` to the baseline runs (:func:`fit_power_law`, same ``loss`` and
       ``f_scale``).
    2. For each distinct treated size N, average the treated losses over its runs and solve
       ``L_base(N_eff) = mean treated loss``; the per-size gain is ``N_eff / N - 1``.
    3. The overall gain is the geometric mean of ``N_eff / N`` over sizes, minus 1. Size ratios are
       multiplicative, so the geometric mean treats a 2x and a 0.5x symmetrically and is what a
       constant multiplicative shift ``L_treat(N) = L_base(k N)`` returns exactly (``k - 1``).
    4. Bootstrap (``n_boot`` replicates, ``rng_seed``): each arm is resampled independently. With seed
       labels, whole seeds are drawn with replacement (cluster bootstrap: a seed's runs at all sizes
       move together); without them, runs are drawn with replacement within each size. The baseline
       is refitted and steps 2–3 repeated; the interval comes from the percentiles at level ``ci``.
       Each resample draws n − 1 units out of n (seeds, or runs at a size), which makes the bootstrap
       variance of a mean unbiased; a plain n-out-of-n bootstrap with 3 seeds is too narrow by
       sqrt(2/3). With few seeds the spread itself is uncertain, so by default
       (``small_sample_correction``) the percentile interval is widened about the bootstrap median by
       t_dof/z, where dof is the Welch–Satterthwaite degrees of freedom of the gain's variance: the
       gain is linearised in the mean loss of each (arm, size), and each arm contributes seeds − 1
       dof (cluster bootstrap) or each of its sizes runs − 1 (within-size bootstrap). On synthetic
       data with 3 seeds per arm the raw percentile interval at nominal 90 % covers ~80 %, the
       widened one ~90 %; ``(pct_lo, pct_hi)`` keep the raw percentiles. Replicates
       whose fit fails (e.g. a draw left fewer than 3 baseline sizes, or a treated size went missing)
       are dropped and counted in ``n_boot - n_boot_ok``.

    A treated loss at or below the fitted asymptote ``c`` has no finite ``N_eff``: that size's gain and
    the overall gain are reported as inf, ``unbounded`` is set and ``notes`` says where. ``N_eff``
    beyond the largest baseline size is an extrapolation of the fit and flagged as such.
    """
    check_fit_options(loss, f_scale)
    bN, bL = check_sizes_losses("base_N", "base_L", base_N, base_L)
    tN, tL = check_sizes_losses("treat_N", "treat_L", treat_N, treat_L)
    if bN.size < N_PARAMS:
        raise ConfigError(f"the baseline fit needs at least 3 runs, got {bN.size}")
    if tN.size < 1:
        raise ConfigError("treat_N is empty; give at least one treated run")
    b_seeds = _check_seeds("base_seed", base_seed, bN.size)
    t_seeds = _check_seeds("treat_seed", treat_seed, tN.size)
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 0:
        raise ConfigError(f"n_boot must be a non-negative integer, got {n_boot!r}")
    if not (isinstance(ci, (int, float)) and 0.0 < ci < 1.0):
        raise ConfigError(f"ci must be a level strictly between 0 and 1, got {ci!r}")
    base_fit, theta, _ = fit_checked(
        bN, bL, np.ones(bN.size), loss=loss, f_scale=None if f_scale is None else float(f_scale)
    )
    log_nref = float(np.mean(np.log(np.unique(bN))))

    # Point estimate from the mean treated loss at each size.
    sizes, t_inv = np.unique(tN, return_inverse=True)
    counts = np.bincount(t_inv, minlength=sizes.size)
    mean_loss = np.bincount(t_inv, weights=tL, minlength=sizes.size) / counts
    ratios = _size_ratios(base_fit, sizes, mean_loss)
    overall = _overall(ratios)
    unbounded_sizes = np.isinf(ratios)
    n_eff = ratios * sizes
    extrapolated = np.isfinite(n_eff) & ((n_eff > bN.max()) | (n_eff < bN.min()))
    notes = _estimate_notes(sizes, unbounded_sizes, extrapolated, base_fit.c)

    # Bootstrap: each arm resampled on its own; dof sets how far the interval widens for few seeds.
    draw_b, dof_b = _resampler(bN, b_seeds)
    draw_t, dof_t = _resampler(tN, t_seeds)
    dof = float(dof_b + dof_t)
    if small_sample_correction and n_boot > 0 and math.isfinite(overall) and dof > 0:
        dof = _effective_dof(
            bN, bL, b_seeds, tN, tL, t_seeds, sizes, mean_loss, base_fit, theta, log_nref, loss, dof
        )
    if n_boot > 0 and dof_b + dof_t == 0:
        notes.append("a single seed (or run per size) in both arms: the bootstrap sees no seed spread")
    rng = np.random.default_rng(rng_seed)
    boot: list[np.ndarray] = []  # N_eff / N per treated size, one entry per replicate that succeeded
    for _ in range(int(n_boot)):
        ib = draw_b(rng)
        it = draw_t(rng)
        r = _replicate_ratios(bN[ib], bL[ib], tN[it], tL[it], sizes, base_fit, theta, log_nref, loss)
        if r is not None:
            boot.append(r)
    alpha = (1.0 - ci) / 2.0
    widen = _widening(dof, alpha) if small_sample_correction else 1.0
    (lo, hi, pct_lo, pct_hi), size_iv, boot_notes = _bootstrap_summary(boot, n_boot, sizes.size, alpha, widen)
    notes += boot_notes

    per_size = tuple(
        SizeGain(
            N=float(sizes[k]),
            treated_loss=float(mean_loss[k]),
            n_runs=int(counts[k]),
            N_eff=float(n_eff[k]),
            gain=float(ratios[k] - 1.0),
            lo=float(size_iv[k][0]),
            hi=float(size_iv[k][1]),
            unbounded=bool(unbounded_sizes[k]),
            extrapolated=bool(extrapolated[k]),
        )
        for k in range(sizes.size)
    )
    return EffectiveSizeGain(
        gain=overall,
        lo=lo,
        hi=hi,
        ci=float(ci),
        pct_lo=pct_lo,
        pct_hi=pct_hi,
        dof=float(dof),
        widen=float(widen),
        per_size=per_size,
        base_fit=base_fit,
        n_boot=int(n_boot),
        n_boot_ok=len(boot),
        bootstrap=(
            f"baseline: {'whole seeds' if b_seeds is not None else 'runs within each size'}; "
            f"treated: {'whole seeds' if t_seeds is not None else 'runs within each size'}; "
            "arms resampled independently"
        ),
        unbounded=bool(unbounded_sizes.any()),
        notes=tuple(notes),
    )
