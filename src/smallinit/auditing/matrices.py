"""Each weight matrix as its values stand: σ, its d_in (smallinit.init.param_roles, the d_in γ-init draws by),
the γ that σ implies (smallinit.init.measure_gamma), the truncation its draw had (max|w|/σ), the names it is
tied under, and whether it still looks freshly drawn.

Fresh-random: every entry drawn independently, as an init draws them, leaves the matrix's spectrum inside the
random-matrix (Marchenko–Pastur) bulk: its largest singular value is σ(√m + √n) up to finite-size
fluctuations, whatever the entries' distribution (normal, truncated normal, torch's uniform default). Training
adds structure that stands out of the bulk (outlier singular values) and heavy tails; a matrix with neither,
on a checkpoint that claims to be trained, was drawn again and never trained (a silent re-init on load).
A fused tensor of experts (E, out, in) is E matrices: each is judged on its own (stacked, one trained expert
hides in the taller stack's wider bulk), and the tensor is fresh-random where every expert is; the experts that
are, where not all, are named (an expert no token was routed to stays as drawn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from smallinit.fields import to_json
from smallinit.init import ParamRole, as_out_in, measure_gamma
from smallinit.init.roles import head_weights, named_parameters_once

# the top singular value over the bulk edge σ(√m + √n) stays below 1 + EDGE_SLACK + 1.5·min(m, n)^(−2/3)
# for an i.i.d. matrix (Tracy–Widom fluctuations shrink as min(m, n)^(−2/3); the largest of 200 normal, uniform
# or truncated draws of 32×64 … 300×64, and of 20 at 512×512 and 8192×64, reached 1 + 0.74·min(m, n)^(−2/3));
# trained ones exceed it
EDGE_SLACK = 0.02
# the excess kurtosis of a drawn matrix is at most 0 (normal) and −1.2 (uniform); heavier tails are trained
KURTOSIS_SLACK = 0.5
POWER_STEPS = 30  # power iterations for the top singular value: it converges fast where an outlier stands out


@dataclass(frozen=True)
class MatrixRow:
    """One weight matrix (or embedding table). ``sigma`` None where the values cannot be read (meta);
    ``gamma`` = −ln σ / ln d_in; ``truncation`` = max|w − mean|/σ (≈ 2.27 for trunc_normal_ at ±2σ, whose σ is
    0.88 of its std; ≈ √3 for a uniform draw, 4–6 for an untruncated normal of this size); ``edge`` = top singular value over σ(√m + √n)
    (of a fused tensor, its experts' largest, each over its own σ); ``fresh_random`` None where not judged (meta, zero, too small); ``writes_residual``: its output is added
    to the residual stream (found from the forward)."""

    name: str
    kind: str  # "matrix" or "embedding"
    shape: tuple[int, ...]
    d_in: int | None
    sigma: float | None = None
    mean: float | None = None
    gamma: float | None = None
    truncation: float | None = None
    kurtosis: float | None = None  # excess kurtosis of the entries
    edge: float | None = None
    fresh_random: bool | None = None
    fresh_parts: tuple[int, ...] = ()  # a fused tensor's experts that look freshly drawn, where not all do
    tied: tuple[str, ...] = ()  # the other names the same tensor has
    writes_residual: bool = False
    head: bool = False  # the model's output head (get_output_embeddings or lm_head), tied or not
    not_read: str = ""

    @property
    def zero(self) -> bool:
        return self.sigma == 0.0 and self.mean == 0.0

    def to_dict(self) -> dict:
        return to_json(self)


def _top_singular(w: torch.Tensor) -> torch.Tensor:
    """The largest singular value of each matrix of ``w`` (..., m, n), by power iteration from a seeded start."""
    v = torch.randn(w.shape[-1], generator=torch.Generator().manual_seed(0), dtype=w.dtype)
    v = (v / v.norm()).expand(*w.shape[:-2], -1).unsqueeze(-1)
    for _ in range(POWER_STEPS):
        u = w @ v
        v = w.mT @ u
        v = v / v.norm(dim=-2, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    return (w @ v).norm(dim=-2).squeeze(-1)


def edge_limit(m: int, n: int) -> float:
    """The most the top singular value of an i.i.d. m × n matrix exceeds σ(√m + √n) by, relatively."""
    return 1.0 + EDGE_SLACK + 1.5 * min(m, n) ** (-2.0 / 3.0)


def _values(name: str, p: torch.Tensor, role: ParamRole, gamma: float | None) -> dict:
    w = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
    if w.is_meta or w.numel() < 2:
        return {"not_read": "not materialised here (meta)"}
    n = w.numel()
    c = w.to(torch.float64, copy=True)  # centred in place below: never the parameter itself
    mean = float(c.mean())
    c -= mean
    sq = c * c
    second = float(sq.mean())
    sigma = (second * n / (n - 1)) ** 0.5  # torch's std (unbiased)
    out: dict = {"sigma": sigma, "mean": mean, "gamma": gamma}
    if sigma == 0.0 or not math.isfinite(sigma):
        return out
    out["truncation"] = float(c.abs().max()) / sigma
    out["kurtosis"] = float(sq.square_().mean()) / (second * second) - 3.0
    try:  # the centred matrix, out × in
        mat = as_out_in(c, role) if role.in_dim is not None else c.reshape(-1, role.fan_in)
    except (ValueError, RuntimeError):
        return out
    parts = mat.reshape(-1, *mat.shape[-2:])  # one matrix, or a fused tensor's experts
    m, n = parts.shape[-2:]
    if min(m, n) < 8:  # too small for the bulk edge to mean anything
        return out
    if parts.shape[0] == 1:  # one matrix: centred, its moments known
        centred = parts
        sigmas = torch.tensor([second**0.5], dtype=torch.float64)
        kurtoses = torch.tensor([out["kurtosis"]], dtype=torch.float64)
    else:  # each expert on its own mean and σ
        centred = parts - parts.mean(dim=(-2, -1), keepdim=True)
        seconds = centred.square().mean(dim=(-2, -1))
        sigmas = seconds.sqrt()
        if not bool((sigmas > 0).all()):
            return out  # an expert of zeros: not judged
        kurtoses = centred.pow(4).mean(dim=(-2, -1)) / seconds.square() - 3.0
    edges = _top_singular(centred) / (sigmas * (math.sqrt(m) + math.sqrt(n)))
    fresh = (edges <= edge_limit(m, n)) & (kurtoses <= KURTOSIS_SLACK)
    out["edge"] = float(edges.max())
    out["fresh_random"] = bool(fresh.all())
    if parts.shape[0] > 1 and bool(fresh.any()) and not out["fresh_random"]:
        out["fresh_parts"] = tuple(int(i) for i in fresh.nonzero().flatten())
    return out


@torch.no_grad()
def matrix_rows(model: nn.Module, roles: dict[str, ParamRole], writers: set[str]) -> list[MatrixRow]:
    """A row per drawn parameter (matrix or embedding) of ``model``, in named_modules order."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    gammas = measure_gamma(model, roles)
    heads = head_weights(model)
    rows = []
    for name, _, _, p in named_parameters_once(model):
        role = roles.get(name)
        if role is None or not role.drawn:
            continue
        values = _values(name, p, role, gammas.per_matrix.get(name))
        if "not_read" not in values and name in gammas.not_read and values.get("sigma"):
            values["not_read"] = gammas.not_read[name]
        rows.append(
            MatrixRow(
                name=name,
                kind=role.kind,
                shape=tuple(p.shape),
                d_in=role.fan_in,
                tied=tuple(n for n in names[id(p)] if n != name),
                writes_residual=name in writers,
                head=id(p) in heads,
                **values,
            )
        )
    return rows
