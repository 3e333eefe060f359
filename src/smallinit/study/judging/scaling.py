"""The scaling-law fit: :func:`fit_power_law` fits ``L(N) = a * N**(-b) + c`` to (size, loss) pairs with a
robust loss on log residuals and reports parameter standard errors. The effective model size built on it
is :mod:`smallinit.study.judging.effective_size`.

Plain numpy/scipy; nothing here needs torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from smallinit.errors import ConfigError
from smallinit.fields import to_json

__all__ = ["PowerLawFit", "fit_power_law"]

_ROBUST_LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")
N_PARAMS = 3
# Bounds on the internal parameters: a' (the N-dependent term at N_ref) in [1e-9 min L, 1e6 max L],
# b in [1e-3, 5], c in [1e-6 min L, max L].
_A_MIN_FRAC, _A_MAX_FRAC = 1e-9, 1e6
_B_MIN, _B_MAX = 1e-3, 5.0
_C_MIN_FRAC = 1e-6
# Automatic robust scale: f_scale = _F_SCALE_K * σ̂ (σ̂ from the MAD of first-pass log residuals),
# clipped to [_F_SCALE_MIN, _F_SCALE_MAX]; the first pass uses _F_SCALE_FIRST (1 % of the loss).
_F_SCALE_K = 2.0
_F_SCALE_MIN, _F_SCALE_MAX = 1e-4, 0.1
_F_SCALE_FIRST = 0.01


# --------------------------------------------------------------------------------------------------
# Input checking
# --------------------------------------------------------------------------------------------------


def _as_1d(name: str, values: Any) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be a sequence of numbers ({exc})") from None
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ConfigError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _check_positive(name: str, arr: np.ndarray) -> None:
    if np.isnan(arr).any():
        raise ConfigError(f"{name} contains NaN; drop or fix those runs before fitting")
    if not np.isfinite(arr).all():
        raise ConfigError(f"{name} contains infinite values; drop or fix those runs before fitting")
    if (arr <= 0).any():
        raise ConfigError(f"{name} must be positive, got min {arr.min():g}")


def check_sizes_losses(n_name: str, l_name: str, N: Any, L: Any) -> tuple[np.ndarray, np.ndarray]:
    n_arr = _as_1d(n_name, N)
    l_arr = _as_1d(l_name, L)
    if n_arr.shape != l_arr.shape:
        raise ConfigError(f"{n_name} and {l_name} differ in length ({n_arr.size} vs {l_arr.size})")
    _check_positive(n_name, n_arr)
    _check_positive(l_name, l_arr)
    return n_arr, l_arr


def _check_weights(weights: Any, n: int) -> np.ndarray:
    if weights is None:
        return np.ones(n)
    w = _as_1d("weights", weights)
    if w.size != n:
        raise ConfigError(f"weights has {w.size} entries but there are {n} points")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ConfigError("weights must be finite and non-negative")
    if (w > 0).sum() < N_PARAMS:
        raise ConfigError("at least 3 points need a positive weight")
    return w


# --------------------------------------------------------------------------------------------------
# Power-law fit
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerLawFit:
    """A fitted ``L(N) = a * N**(-b) + c``.

    ``a_err``, ``b_err``, ``c_err`` are approximate standard errors (nan when there are no degrees of
    freedom left, inf when the data do not determine the parameters); ``notes`` says why.
    ``f_scale`` is the robust-loss scale actually used (see :func:`fit_power_law`).
    ``residual_rms`` is the root mean square of the log residuals ``log L_pred - log L`` over all
    points (≈ the typical relative misfit).
    """

    a: float
    b: float
    c: float
    a_err: float
    b_err: float
    c_err: float
    n_points: int
    n_sizes: int
    residual_rms: float
    f_scale: float
    method: str
    notes: tuple[str, ...] = ()

    def predict(self, N: Any) -> np.ndarray | float:
        """Loss at size(s) ``N`` (> 0). Returns a float for a scalar input, else an array."""
        n = np.asarray(N, dtype=float)
        if np.isnan(n).any() or (n <= 0).any():
            raise ConfigError("predict needs positive sizes N")
        with np.errstate(over="ignore"):
            out = np.exp(math.log(self.a) - self.b * np.log(n)) + self.c
        return float(out) if out.ndim == 0 else out

    def inverse(self, L: Any) -> np.ndarray | float:
        """Size ``N`` with ``predict(N) == L``.

        ``inf`` where ``L <= c``: no finite model reaches a loss at or below the fitted asymptote.
        Returns a float for a scalar input, else an array.
        """
        loss = np.asarray(L, dtype=float)
        if np.isnan(loss).any():
            raise ConfigError("inverse needs finite losses L, got NaN")
        excess = loss - self.c
        out = np.full(loss.shape, np.inf)
        ok = excess > 0
        with np.errstate(over="ignore"):
            out[ok] = np.exp((math.log(self.a) - np.log(excess[ok])) / self.b)
        return float(out) if out.ndim == 0 else out

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python view (floats, ints, strings, lists) for JSON output."""
        return to_json(self)


@dataclass
class _Problem:
    """Data and settings of one fit, in the internal parametrisation.

    Internal parameters θ = (u, v, w): ``a' = exp(u)``, ``b = exp(v)``, ``c = exp(w)``, with the model
    ``L = a' * (N / N_ref)**(-b) + c``. ``N_ref`` (geometric mean of the distinct sizes) keeps ``u`` of
    order one; the logs keep a, b, c positive.
    """

    logx: np.ndarray
    logL: np.ndarray
    sw: np.ndarray  # sqrt of the weights
    log_nref: float
    loss: str
    f_scale: float | None
    lower: np.ndarray
    upper: np.ndarray

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        u, v, w = theta
        with np.errstate(over="ignore"):
            pred = np.exp(u - math.exp(v) * self.logx) + math.exp(w)
        return self.sw * (np.log(pred) - self.logL)

    def jacobian(self, theta: np.ndarray) -> np.ndarray:
        u, v, w = theta
        b, c = math.exp(v), math.exp(w)
        with np.errstate(over="ignore"):
            term = np.exp(u - b * self.logx)
        pred = term + c
        jac = np.empty((self.logx.size, N_PARAMS))
        jac[:, 0] = term / pred
        jac[:, 1] = -term * self.logx * b / pred
        jac[:, 2] = c / pred
        return jac * self.sw[:, None]

    def solve(self, theta0: np.ndarray) -> Any:
        theta0 = np.clip(theta0, self.lower + 1e-9, self.upper - 1e-9)
        return least_squares(
            self.residuals,
            theta0,
            jac=self.jacobian,
            bounds=(self.lower, self.upper),
            method="trf",
            loss=self.loss,
            f_scale=self.f_scale,
            x_scale=1.0,
            ftol=1e-10,
            xtol=1e-10,
            gtol=1e-10,
            max_nfev=2000,
        )


def _problem(
    N: np.ndarray, L: np.ndarray, weights: np.ndarray, *, log_nref: float, loss: str, f_scale: float | None
) -> _Problem:
    """The fit in θ = (u, v, w), with bounds on a', b and c set from the range of the losses."""
    min_loss, max_loss = float(L.min()), float(L.max())
    lower = np.array([math.log(_A_MIN_FRAC * min_loss), math.log(_B_MIN), math.log(_C_MIN_FRAC * min_loss)])
    upper = np.array([math.log(_A_MAX_FRAC * max_loss), math.log(_B_MAX), math.log(max_loss)])
    return _Problem(
        logx=np.log(N) - log_nref,
        logL=np.log(L),
        sw=np.sqrt(weights),
        log_nref=log_nref,
        loss=loss,
        f_scale=f_scale,
        lower=lower,
        upper=upper,
    )


def _grid_starts(prob: _Problem, min_loss: float, n_best: int = 3) -> list[np.ndarray]:
    """Starting points: for b on a grid and c a fraction of min(L), ``a'`` from a log-linear fit."""
    b_grid = np.geomspace(0.02, 2.0, 25)
    c_grid = min_loss * np.array([1e-6, 0.3, 0.6, 0.8, 0.9, 0.95, 0.98, 0.995])
    w = prob.sw**2
    loss = np.exp(prob.logL)
    ylog = np.log(loss[None, :] - c_grid[:, None])  # (nc, m)
    # log(L - c) ≈ u - b log x  =>  u = weighted mean of (log(L - c) + b log x)
    u = ((ylog[None, :, :] + b_grid[:, None, None] * prob.logx) * w).sum(-1) / w.sum()  # (nb, nc)
    pred = np.exp(u[..., None] - b_grid[:, None, None] * prob.logx) + c_grid[None, :, None]
    cost = (w * (np.log(pred) - prob.logL) ** 2).sum(-1)
    order = np.argsort(cost, axis=None)[:n_best]
    starts = []
    for flat in order:
        ib, ic = np.unravel_index(flat, cost.shape)
        starts.append(np.array([u[ib, ic], math.log(b_grid[ib]), math.log(c_grid[ic])]))
    return starts


def _solve_multistart(prob: _Problem, starts: list[np.ndarray]) -> Any:
    """Solve from each start and keep the lowest cost (the first of equals)."""
    return min((prob.solve(np.asarray(theta0, dtype=float)) for theta0 in starts), key=lambda res: res.cost)


def _auto_f_scale(residuals: np.ndarray, weights: np.ndarray) -> float:
    """k·σ̂ with σ̂ = 1.4826·MAD of the residuals, inflated by sqrt(n / dof) for the fitted parameters."""
    r = np.abs(residuals[weights > 0])
    dof = max(r.size - N_PARAMS, 1)
    sigma = 1.4826 * float(np.median(r)) * math.sqrt(r.size / dof)
    return float(np.clip(_F_SCALE_K * sigma, _F_SCALE_MIN, _F_SCALE_MAX))


def _choose_f_scale(
    prob: _Problem, starts: list[np.ndarray], weights: np.ndarray
) -> tuple[list[np.ndarray], str]:
    """Fill in ``prob.f_scale`` when it is None (see :func:`fit_power_law`).

    Returns the starts for the final solve and the scale as ``method`` reports it.
    """
    if prob.f_scale is None and prob.loss == "linear":
        prob.f_scale = 1.0  # unused by plain least squares
    if prob.f_scale is not None:
        return starts, f"{prob.f_scale:g}"
    # Auto scale: a first pass at 1 % of the loss, then k·σ̂ from the MAD of its residuals; the final
    # solve starts from the first pass.
    prob.f_scale = _F_SCALE_FIRST
    first = _solve_multistart(prob, starts)
    prob.f_scale = _auto_f_scale(first.fun, weights)
    return [first.x], f"auto={prob.f_scale:.3g}"


def _bound_notes(prob: _Problem, u: float, b: float, c: float, min_loss: float, max_loss: float) -> list[str]:
    """Notes for parameters that ended at (or near) a bound, where the data do not pin them down."""
    notes = []
    if u <= prob.lower[0] + 1e-3:
        notes.append("a ≈ 0 (at its lower bound): the loss does not fall with N")
    if b <= 1.01 * _B_MIN or b >= 0.99 * _B_MAX:
        notes.append(f"b sits at its bound [{_B_MIN:g}, {_B_MAX:g}]; the data barely constrain it")
    if c <= 1e-5 * min_loss:
        notes.append("c ≈ 0 (at its lower bound): the data show no loss floor")
    elif c >= 0.999 * max_loss:
        notes.append("c sits at its upper bound (max L): the data look flat in N")
    return notes


def _psi_parts(z: np.ndarray, loss: str) -> tuple[np.ndarray, np.ndarray]:
    """For scipy's robust losses, z = (r / f_scale)²: ρ'(z) (so ψ(r) = ρ'(z)·r) and ψ'(r)."""
    if loss == "linear":
        return np.ones_like(z), np.ones_like(z)
    if loss == "soft_l1":
        return 1.0 / np.sqrt(1.0 + z), (1.0 + z) ** -1.5
    if loss == "huber":
        inside = z <= 1.0
        return np.where(inside, 1.0, 1.0 / np.sqrt(np.maximum(z, 1.0))), np.where(inside, 1.0, 0.0)
    if loss == "cauchy":
        return 1.0 / (1.0 + z), (1.0 - z) / (1.0 + z) ** 2
    return 1.0 / (1.0 + z * z), (1.0 - 3.0 * z * z) / (1.0 + z * z) ** 2  # arctan


def _huber_cov(prob: _Problem, theta: np.ndarray, r: np.ndarray, dof: int) -> np.ndarray | None:
    """Huber's M-estimator covariance of θ from the residuals ``r`` of the positive-weight points.

    K² · [Σψ²/(n−p)] / mean(ψ')² · (JᵀJ)⁻¹ with K = 1 + (p/n)·var(ψ')/mean(ψ')² (σ² (JᵀJ)⁻¹ for plain
    least squares). None when it does not exist: mean(ψ') ≤ 0, or JᵀJ singular or ill-conditioned.
    """
    rho1, dpsi = _psi_parts((r / prob.f_scale) ** 2, prob.loss)
    psi = rho1 * r
    m = float(dpsi.mean())
    jac = prob.jacobian(theta)
    hess = jac.T @ jac
    if m <= 0:
        return None
    k = 1.0 + N_PARAMS / r.size * float(dpsi.var()) / m**2
    sigma2 = k**2 * float((psi**2).sum() / dof) / m**2
    try:
        cov_theta = sigma2 * np.linalg.inv(hess)
    except np.linalg.LinAlgError:
        return None
    if np.linalg.cond(hess) > 1e14 or not np.isfinite(cov_theta).all():
        return None
    return cov_theta


def _standard_errors(
    prob: _Problem, theta: np.ndarray, weights: np.ndarray, a: float, b: float, c: float
) -> tuple[np.ndarray, str | None]:
    """Standard errors of (a, b, c), and a note when they are nan (no dof) or inf (singular JᵀJ).

    The covariance is evaluated at the solution in (u, log b, log c) and mapped to (a, b, c) by the
    delta method.
    """
    r = prob.residuals(theta)
    pos = weights > 0
    dof = int(pos.sum()) - N_PARAMS
    if dof <= 0:
        note = f"dof = {dof}: as many parameters as points, standard errors undefined (nan)"
        return np.full(N_PARAMS, np.nan), note
    cov_theta = _huber_cov(prob, theta, r[pos], dof)
    if cov_theta is None:
        note = "JᵀJ is singular at the solution: a, b, c are not separately determined (inf)"
        return np.full(N_PARAMS, np.inf), note
    # d(a, b, c) / d(u, log b, log c) with a = exp(u + b · log N_ref), b = exp(v), c = exp(w)
    grad = np.array(
        [
            [a, a * prob.log_nref * b, 0.0],
            [0.0, b, 0.0],
            [0.0, 0.0, c],
        ]
    )
    cov = grad @ cov_theta @ grad.T
    return np.sqrt(np.clip(np.diag(cov), 0.0, None)), None


def _fit_result(
    prob: _Problem,
    solution: Any,
    converged: bool,
    L: np.ndarray,
    weights: np.ndarray,
    n_sizes: int,
    scale_note: str,
) -> PowerLawFit:
    """The PowerLawFit at the solver's solution: a, b, c, their standard errors and notes."""
    u, v, w = (float(t) for t in solution.x)
    b, c = math.exp(v), math.exp(w)
    a = math.exp(u + b * prob.log_nref)
    notes = [] if converged else [f"solver did not converge ({solution.message})"]
    notes += _bound_notes(prob, u, b, c, float(L.min()), float(L.max()))
    errs, err_note = _standard_errors(prob, solution.x, weights, a, b, c)
    if err_note is not None:
        notes.append(err_note)
    if n_sizes <= 5:
        notes.append(
            f"only {n_sizes} distinct sizes: a 3-parameter law is poorly determined; treat errors as rough"
        )
    raw = np.log(np.exp(u - b * prob.logx) + c) - prob.logL
    return PowerLawFit(
        a=a,
        b=b,
        c=c,
        a_err=float(errs[0]),
        b_err=float(errs[1]),
        c_err=float(errs[2]),
        n_points=int(L.size),
        n_sizes=int(n_sizes),
        residual_rms=float(np.sqrt(np.mean(raw**2))),
        f_scale=float(prob.f_scale),
        method=f"least_squares(trf, loss={prob.loss}, f_scale={scale_note}) on log L; a,b,c>0 via logs",
        notes=tuple(notes),
    )


def fit_checked(
    N: np.ndarray,
    L: np.ndarray,
    weights: np.ndarray,
    *,
    loss: str,
    f_scale: float | None,
    start: np.ndarray | None = None,
    log_nref: float | None = None,
) -> tuple[PowerLawFit, np.ndarray, bool]:
    """Core fit on checked arrays. Returns the fit, the internal θ and whether the solver converged.

    ``start`` replaces the grid of starting points and ``log_nref`` the data's own ``log N_ref``: the
    bootstrap refits from the full fit's solution in the same parametrisation.
    """
    sizes = np.unique(N)
    if sizes.size < N_PARAMS:
        raise ConfigError(
            f"a power-law fit needs at least 3 distinct sizes N, got {sizes.size}; add runs at more sizes"
        )
    if log_nref is None:
        log_nref = float(np.mean(np.log(sizes)))
    prob = _problem(N, L, weights, log_nref=log_nref, loss=loss, f_scale=f_scale)
    starts = [start] if start is not None else _grid_starts(prob, float(L.min()))
    starts, scale_note = _choose_f_scale(prob, starts, weights)
    best = _solve_multistart(prob, starts)
    converged = bool(best.status > 0) and bool(np.isfinite(best.cost))
    fit = _fit_result(prob, best, converged, L, weights, int(sizes.size), scale_note)
    return fit, best.x, converged


def check_fit_options(loss: str, f_scale: float | None) -> None:
    if loss not in _ROBUST_LOSSES:
        raise ConfigError(f"loss must be one of {', '.join(_ROBUST_LOSSES)}, got {loss!r}")
    if f_scale is None:
        return
    if isinstance(f_scale, bool) or not (
        isinstance(f_scale, (int, float)) and math.isfinite(f_scale) and f_scale > 0
    ):
        raise ConfigError(f"f_scale must be a positive number, got {f_scale!r}")


def fit_power_law(
    N: Sequence[float] | np.ndarray,
    L: Sequence[float] | np.ndarray,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    loss: str = "soft_l1",
    f_scale: float | None = None,
) -> PowerLawFit:
    """Fit ``L(N) = a * N**(-b) + c`` with ``a, b, c > 0``.

    The residuals are ``log L_pred - log L`` (relative misfit, so small and large models count alike),
    multiplied by ``sqrt(weights)``. ``loss`` is scipy's robust loss (default ``soft_l1``; use
    ``"linear"`` for plain least squares). ``f_scale`` is the residual size where the robust loss stops
    counting quadratically. By default it is set from the data: a first fit at 0.01 (1 % of the loss),
    then ``2 · 1.4826 · MAD`` of its residuals (≈ 2 noise sd), clipped to [1e-4, 0.1], and a refit.
    A fixed 1 % scale would let one bad run pull hard on laws whose N-dependent part is itself only a
    few percent of the loss. ``N`` may repeat (several seeds per size). Starting points come from a
    grid over ``b`` and ``c`` with ``a`` solved log-linearly; the best three are refined.

    Internally the fit runs in ``(log a', log b, log c)`` with ``a' = a · N_ref^-b`` and ``N_ref`` the
    geometric mean of the sizes, which keeps a, b, c positive and the problem well scaled; ``b`` is
    bounded to [1e-3, 5], ``c`` to [1e-6 · min L, max L] and ``a'`` to [1e-9 · min L, 1e6 · max L]
    (``notes`` says when a bound is reached).

    Stability: with only 3–5 distinct sizes the three parameters trade off against each other (a larger
    ``c`` with a larger ``b`` fits nearly as well), so the standard errors are large and ``b`` alone
    should not be over-read. The fit still returns; ``notes`` records this. Standard errors: Huber's
    M-estimator covariance ``K² · Σψ²/(n−3) / mean(ψ')² · (JᵀJ)⁻¹`` at the solution (plain
    ``σ² (JᵀJ)⁻¹``, dof-corrected, for ``loss="linear"``), mapped to a, b, c by the delta method. On
    synthetic data they match the spread of refits to within ~15 %. nan when there are no degrees of
    freedom (3 points), inf when JᵀJ is singular.

    Raises ConfigError for fewer than 3 points or distinct sizes, non-positive or NaN values,
    or mismatched lengths.
    """
    check_fit_options(loss, f_scale)
    n_arr, l_arr = check_sizes_losses("N", "L", N, L)
    if n_arr.size < N_PARAMS:
        raise ConfigError(f"a power-law fit needs at least 3 points, got {n_arr.size}")
    w = _check_weights(weights, n_arr.size)
    fit, _, _ = fit_checked(n_arr, l_arr, w, loss=loss, f_scale=None if f_scale is None else float(f_scale))
    return fit
