"""Condensation (the paper's C6): stable rank and row-wise cosine similarity of weight matrices.

* stable rank ‖W‖_F² / ‖W‖_2² — low when the rows align along few directions.
* row cosine — |cos| between the rows of W in out × in orientation (one row per output neuron, whatever
  the storage: GPT-2's Conv1D is stored in × out, fused experts either way; the orientation comes from the
  same d_in knowledge as γ-init, smallinit.init.param_roles), reordered by hierarchical clustering so
  aligned groups show as blocks; summary: mean |cos| over row pairs.

‖W‖_2 is √λ_max of the Gram matrix of W's smaller side, λ_max by Lanczos (:func:`spectral_norm`), not a
full SVD. Plain power iteration was tried and rejected: at init the top singular values of a random matrix
are nearly degenerate (Marchenko–Pastur edge), so it needs ~40 passes over W and still errs by ~1e-3.
The Lanczos value agrees with ``torch.linalg.svdvals`` to ~1e-6 relative (tests check 1e-4).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.cluster.hierarchy import leaves_list, linkage
from scipy.sparse.linalg import eigsh
from scipy.spatial.distance import squareform
from torch import nn

from smallinit.init import ParamRole, as_out_in, param_roles


@torch.no_grad()
def spectral_norm(W: torch.Tensor, *, tol: float = 1e-8) -> float:
    """Largest singular value of a matrix W: √λ_max of the Gram matrix of W's smaller side, λ_max by Lanczos.

    The Gram matrix costs one BLAS-3 product (fp32, or fp64 for fp64 W); ARPACK's Lanczos (scipy ``eigsh``,
    seeded start vector, so deterministic) then needs only small matrix–vector products. Agrees with
    ``torch.linalg.svdvals`` to ~1e-6 relative in fp32 (the Gram's rounding), several times faster.
    """
    A = W.detach()
    if A.dtype != torch.float64:
        A = A.float()  # a bf16 Gram would lose the top eigenvalue's digits
    if A.shape[0] < A.shape[1]:
        A = A.T  # Gram of the smaller side: (n, n) with n = min(m, n)
    G = (A.T @ A).double().cpu().numpy()
    n = G.shape[0]
    if not G.any():
        return 0.0
    if n <= 32:  # small: the dense solver is cheaper than Lanczos
        return float(np.sqrt(max(np.linalg.eigvalsh(G)[-1], 0.0)))
    v0 = np.random.default_rng(0).standard_normal(n)  # random, so not orthogonal to the top vector
    lam = eigsh(G, k=1, which="LA", tol=tol, v0=v0, return_eigenvectors=False)[0]
    return float(np.sqrt(max(lam, 0.0)))


def frobenius_sq(W: torch.Tensor) -> float:
    return W.detach().double().pow(2).sum().item()


def stable_rank(W: torch.Tensor, *, exact: bool = False) -> float:
    """‖W‖_F² / ‖W‖_2²; ``exact`` takes ‖W‖_2 from torch.linalg.svdvals (slow for large W)."""
    if W.dim() != 2:
        raise ValueError(f"stable_rank needs a matrix, got shape {tuple(W.shape)}")
    top = torch.linalg.svdvals(W.detach().double())[0].item() if exact else spectral_norm(W)
    return frobenius_sq(W) / top**2 if top > 0 else 0.0


@dataclass
class RowCosine:
    matrix: np.ndarray  # |cos| between rows, reordered by ``order`` (float32)
    order: np.ndarray  # row indices (into the rows used) in clustered order
    rows: np.ndarray  # which rows of W were used (all, or a seeded sample of ``max_rows``)
    mean_abs: float  # mean |cos| over pairs of distinct rows


def _abs_cos(W: torch.Tensor) -> torch.Tensor:
    X = W.detach().double()
    X = X / X.norm(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return (X @ X.T).abs()


def mean_abs_cos(C: torch.Tensor) -> float:
    n = C.shape[0]
    if n < 2:
        return float("nan")
    return ((C.sum() - C.diagonal().sum()) / (n * (n - 1))).item()


def _sample_rows(n: int, max_rows: int, seed: int) -> np.ndarray:
    if n <= max_rows:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_rows, replace=False))


def sampled_mean_abs_cos(W: torch.Tensor, *, max_rows: int = 1024, seed: int = 0) -> float:
    """Mean |cos| over row pairs; over a seeded sample of ``max_rows`` rows when W has more."""
    rows = _sample_rows(W.shape[0], max_rows, seed)
    return mean_abs_cos(_abs_cos(W[torch.as_tensor(rows, device=W.device)]))


def row_cosine(W: torch.Tensor, *, max_rows: int = 1024, seed: int = 0, cluster: bool = True) -> RowCosine:
    """|cos| between the rows of W, clustered (average linkage on 1 − |cos|: a row and its negation count
    as aligned). Matrices with more than ``max_rows`` rows use a seeded sample of rows."""
    if W.dim() != 2:
        raise ValueError(f"row_cosine needs a matrix, got shape {tuple(W.shape)}")
    rows = _sample_rows(W.shape[0], max_rows, seed)
    C = _abs_cos(W[torch.as_tensor(rows, device=W.device)])
    mean_abs = mean_abs_cos(C)
    C_np = C.clamp(0.0, 1.0).cpu().numpy()
    order = np.arange(len(rows))
    if cluster and len(rows) > 2:
        dist = 1.0 - C_np
        np.fill_diagonal(dist, 0.0)
        order = leaves_list(linkage(squareform(dist, checks=False), method="average"))
    return RowCosine(
        matrix=C_np[np.ix_(order, order)].astype(np.float32), order=order, rows=rows, mean_abs=mean_abs
    )


def rms(W: torch.Tensor) -> float:
    """The root mean square of W's entries (float64: exact enough for a matrix of any size)."""
    return torch.linalg.vector_norm(W.detach().double()).item() / math.sqrt(W.numel())


@dataclass
class MatrixStat:
    name: str
    shape: tuple[int, ...]
    stable_rank: float
    mean_abs_cos: float | None  # None when not asked for
    rms: float | None = None  # None in files written before it was recorded
    # √(η/λ) of its optimizer (peak rate η, weight decay λ): the scale weight decay drives the weights towards;
    # None where the matrix does not decay or its optimizer is not known
    steady_rms: float | None = None

    @property
    def rms_ratio(self) -> float | None:
        """RMS / √(η/λ): near a constant once weight decay has driven the norm to its steady state."""
        return self.rms / self.steady_rms if self.rms is not None and self.steady_rms else None

    @property
    def stable_rank_fraction(self) -> float | None:
        """Stable rank over its maximum min(m, n) (None where the shape was not recorded: older files)."""
        return self.stable_rank / min(self.shape) if self.shape else None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "stable_rank": self.stable_rank,
            "stable_rank_fraction": self.stable_rank_fraction,
            "mean_abs_cos": self.mean_abs_cos,
            "rms": self.rms,
            "steady_rms": self.steady_rms,
            "rms_ratio": self.rms_ratio,
        }


def named_matrices(
    model: nn.Module, patterns: list[str] | str | None = None, *, roles: dict[str, ParamRole] | None = None
) -> dict[str, torch.Tensor]:
    """Every weight matrix (tied ones once) in out × in orientation, optionally filtered by glob patterns on
    the name. Parameters whose input axis is not established (``unoriented_matrices``) are left out.

    A parameter with batch axes is a batch of matrices (MoE experts: E × out × in); each is listed on its own
    as ``NAME.i`` (e.g. ``blocks.0.mlp.up_proj.3`` is expert 3). ``roles``: the model's ``param_roles``, when
    the caller already traced them.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    params = dict(model.named_parameters())  # named_parameters already skips tied duplicates
    out = {}
    for name, role in (roles or param_roles(model)).items():
        p = params[name]
        if p.dim() < 2 or role.in_dim is None or not role.drawn:
            continue
        W = as_out_in(p, role)
        items = (
            [(name, W)]
            if W.dim() == 2
            else [(f"{name}.{i}", w) for i, w in enumerate(W.reshape(-1, *W.shape[-2:]))]
        )
        for n, w in items:
            if not patterns or any(fnmatch.fnmatchcase(n, pat) for pat in patterns):
                out[n] = w
    return out


def unoriented_matrices(model: nn.Module) -> dict[str, str]:
    """Parameters with ≥ 2 axes whose input axis is not established, with the reason: no statistic is
    computed on them rather than one on a guessed orientation."""
    params = dict(model.named_parameters())
    return {
        name: role.reason or role.kind
        for name, role in param_roles(model).items()
        if params[name].dim() >= 2 and (role.in_dim is None or not role.drawn)
    }


def matrix_stats(
    model: nn.Module, pattern: list[str] | str | None = None, *, cosine: bool = True, max_rows: int = 1024
) -> list[MatrixStat]:
    """Stable rank, RMS (and mean |cos| of rows, sampled above ``max_rows`` rows) of every matrix of ``model``."""
    stats = []
    for name, W in named_matrices(model, pattern).items():
        cos = sampled_mean_abs_cos(W, max_rows=max_rows) if cosine else None
        stats.append(MatrixStat(name, tuple(W.shape), stable_rank(W), cos, rms(W)))
    return stats
