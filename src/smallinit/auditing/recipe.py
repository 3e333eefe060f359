"""The init recipe a model's weights look like, from each matrix's σ and d_in, with how well each rule fits.

The candidates: a fixed std (σ the same whatever d_in: 0.02, most libraries' default), fan-in γ (σ =
d_in^(−γ): one γ in every matrix), torch's default (nn.Linear's kaiming_uniform_(a=√5): uniform entries in
±1/√d_in, σ = 1/√(3·d_in): γ = 0.5 with the constant factor 1/√3, which read as fan-in γ looks like a γ near
0.65 that drifts with d_in), output projections depth-scaled below that rule (σ times 1/√(k·L), GPT-2's
k = 2), zero-init, and mixes of these by role. The roles: embedding tables, the head (the model's own,
else the matrix whose output has the vocabulary's size), the output projections (the matrices that write into the residual stream,
found from the forward) and the other matrices. Each role is fitted on its own; where roles follow different
rules, the recipe says which.

A rule fits a role where the matrices' ln σ (fixed std) or γ (fan-in) spread by less than SPREAD, plus what
sampling alone spreads a small matrix's σ by, and a real difference of recipe (d_in from 64 to 4096 moves a fixed std's γ by 0.5)
far above. With one d_in in a role the two rules cannot be told apart, and both are named. Torch's default is
named where every matrix of a role has σ·√(3·d_in) = 1 to the same tolerance and uniform entries (excess
kurtosis below UNIFORM), whatever its d_in: no other recipe draws uniform entries at exactly that σ.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field, replace

from smallinit.auditing.matrices import MatrixRow
from smallinit.fields import to_json
from smallinit.init.scale import ONE_GAMMA

SPREAD = ONE_GAMMA  # in γ for fan-in, in ln σ for a fixed std
# excess kurtosis below this: uniform entries (−1.2; a normal truncated at ±2σ has −0.63, a normal 0)
UNIFORM = -0.9
TORCH_DEFAULT = "torch default"
ROLES = ("embedding", "head", "output projections", "matrices")


@dataclass(frozen=True)
class RoleFit:
    """How one role's matrices were drawn: ``rule`` ("fixed std", "fan-in γ", "either" (one d_in), "torch
    default" (uniform, σ = 1/√(3·d_in)), "zero",
    "depth-scaled", "none"), its number (σ or γ), and the spreads each candidate leaves (ln σ and γ)."""

    role: str
    matrices: int
    rule: str
    value: float | None = None
    sigma: float | None = None  # the median σ
    gamma: float | None = None  # the median γ
    sigma_spread: float | None = None  # max − min of ln σ
    gamma_spread: float | None = None  # max − min of γ
    describe: str = ""

    def to_dict(self) -> dict:
        return to_json(self)


@dataclass(frozen=True)
class Recipe:
    """The whole model: ``summary`` in words, each role's fit, the depth scaling of the output projections
    where there is one (σ over the other matrices' rule, and k in 1/√(k·L)), and the roles that disagree."""

    summary: str
    roles: dict[str, RoleFit] = field(default_factory=dict)
    depth_ratio: float | None = None
    depth_k: float | None = None
    layers: int | None = None
    disagree: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return to_json(self)


def role_of(row: MatrixRow, vocab: int | None, heads_known: bool) -> str:
    """The row's role; the head is the model's own where it names one, else the matrix whose output has the
    vocabulary's size (an MLP as wide as the vocabulary is not a head where the model names its head)."""
    if row.kind == "embedding":
        return "embedding"
    if row.writes_residual:
        return "output projections"
    if row.head or (not heads_known and vocab is not None and row.shape and row.shape[0] == vocab):
        return "head"
    return "matrices"


def fit_role(role: str, rows: list[MatrixRow]) -> RoleFit:
    read = [r for r in rows if r.sigma is not None]
    if not read:
        return RoleFit(role, len(rows), "not read", describe="values not read (meta)")
    if all(r.zero for r in read):
        return RoleFit(role, len(rows), "zero", 0.0, describe="zero-init")
    if any(r.zero for r in read):
        zero = sum(r.zero for r in read)
        return RoleFit(role, len(rows), "none", describe=f"{zero} of {len(read)} zero, the others drawn")
    ln = [math.log(r.sigma) for r in read]
    gammas = [r.gamma for r in read if r.gamma is not None]
    s_spread = max(ln) - min(ln)
    g_spread = max(gammas) - min(gammas) if len(gammas) == len(read) else None
    sigma = math.exp(statistics.median(ln))
    gamma = statistics.median(gammas) if gammas else None
    one_d_in = len({r.d_in for r in read}) == 1
    slack = max(map(_noise, read))  # the spread sampling alone gives small matrices
    fits_std = s_spread < SPREAD + slack
    fits_gamma = g_spread is not None and g_spread < SPREAD + slack / math.log(min(r.d_in or 2 for r in read))
    n = len(rows)
    if _torch_default(read, slack):
        return RoleFit(
            role, n, TORCH_DEFAULT, 0.5, sigma, gamma, s_spread, g_spread,
            "torch default: uniform ±1/√d_in, σ = 1/√(3·d_in) (γ = 0.5 × 1/√3; nn.Linear's own init)",
        )  # fmt: skip
    if fits_std and fits_gamma and one_d_in:
        return RoleFit(
            role, n, "either", sigma, sigma, gamma, s_spread, g_spread,
            f"σ = {sigma:.3g}, γ = {gamma:.3f} at d_in {read[0].d_in} (fixed std or fan-in γ: one d_in cannot tell)",
        )  # fmt: skip
    if fits_gamma and (not fits_std or g_spread <= s_spread):
        return RoleFit(
            role, n, "fan-in γ", gamma, sigma, gamma, s_spread, g_spread, f"fan-in γ = {gamma:.3f}"
        )
    if fits_std:
        return RoleFit(
            role, n, "fixed std", sigma, sigma, gamma, s_spread, g_spread, f"fixed std {sigma:.3g}"
        )
    shown = f"σ {min(r.sigma for r in read):.3g}–{max(r.sigma for r in read):.3g}"
    if gammas:
        shown += f", γ {min(gammas):.3f}–{max(gammas):.3f}"
    return RoleFit(role, n, "none", None, sigma, gamma, s_spread, g_spread, f"no one rule ({shown})")


def _torch_default(read: list[MatrixRow], slack: float) -> bool:
    """Every matrix drawn as nn.Linear draws by default: uniform entries with σ = 1/√(3·d_in)."""
    return all(
        r.d_in
        and r.kurtosis is not None
        and r.kurtosis < UNIFORM
        and abs(math.log(r.sigma * math.sqrt(3 * r.d_in))) < SPREAD + slack
        for r in read
    )


def _noise(row: MatrixRow) -> float:
    """Twice the range in ln σ that sampling alone gives a role's matrices: ln σ of n entries has standard
    error 1/√(2n), and a handful of matrices spans about ±3 of them."""
    return 6.0 / math.sqrt(2.0 * math.prod(row.shape))


def _layers(rows: list[MatrixRow]) -> int | None:
    """The number of blocks: the distinct stack indices in the output projections' names."""
    found = {m.group(1) for r in rows if r.writes_residual and (m := re.search(r"\.(\d+)\.", r.name))}
    return len(found) or None


def _predictions(fit: RoleFit, row: MatrixRow) -> list[float]:
    """The σ each reading of ``fit``'s rule gives a matrix of ``row``'s d_in."""
    out = []
    if fit.rule in ("fixed std", "either") and fit.sigma:
        out.append(fit.sigma)
    if fit.rule in ("fan-in γ", "either") and row.d_in and fit.gamma is not None:
        out.append(row.d_in ** (-fit.gamma))
    if fit.rule == TORCH_DEFAULT and row.d_in:
        out.append((3 * row.d_in) ** -0.5)
    return out


def follows(fit: RoleFit, rows: list[MatrixRow]) -> bool:
    """Whether every read matrix of ``rows`` has the σ one reading of ``fit``'s rule gives it (to SPREAD)."""
    read = [r for r in rows if r.sigma]
    for reading in range(2):
        sigmas = [
            (r.sigma, p[reading] if len(p) > reading else None) for r in read if (p := _predictions(fit, r))
        ]
        if (
            read
            and len(sigmas) == len(read)
            and all(e is not None and abs(math.log(s / e)) < SPREAD for s, e in sigmas)
        ):
            return True
    return False


def fit_recipe(rows: list[MatrixRow], vocab: int | None) -> Recipe:
    """The recipe of a model's matrices (rows from smallinit.auditing.matrices.matrix_rows)."""
    by_role: dict[str, list[MatrixRow]] = {}
    heads_known = any(r.head for r in rows)
    for r in rows:
        by_role.setdefault(role_of(r, vocab, heads_known), []).append(r)
    fits = {role: fit_role(role, by_role[role]) for role in ROLES if role in by_role}
    base = fits.get("matrices")
    ratio = k = None
    layers = _layers(rows)
    out = fits.get("output projections")
    if (
        base is not None
        and base.rule in ("fixed std", "fan-in γ", "either", TORCH_DEFAULT)
        and out is not None
    ):
        writers = [r for r in by_role["output projections"] if r.sigma]
        # the ratios spread by what sampling gives the writers' σ as well as the rule's SPREAD
        slack = max(map(_noise, writers), default=0.0)
        for reading in (0, 1):  # σ over one reading of the matrices' rule (fixed std, then fan-in γ)
            ratios = [r.sigma / p[min(reading, len(p) - 1)] for r in writers if (p := _predictions(base, r))]
            if (
                out.rule not in ("zero", "not read")
                and ratios
                and max(ratios) / min(ratios) < math.exp(SPREAD + slack)
            ):
                ratio = statistics.median(ratios)
                break
        if ratio is not None and ratio < math.exp(-SPREAD) and layers:
            k = 1.0 / (ratio * ratio * layers)
            fits["output projections"] = replace(
                out, rule="depth-scaled", value=ratio,
                describe=f"depth-scaled: {ratio:.3g} × the matrices' σ = 1/√({k:.2f}·L), L = {layers}",
            )  # fmt: skip
    agree = {role: base is not None and follows(base, by_role[role]) for role in fits}
    disagree = tuple(
        f"{role}: {fits[role].describe}" for role in fits if role != "matrices" and not agree[role]
    )
    if base is None:
        summary = "; ".join(f"{role}: {f.describe}" for role, f in fits.items()) or "no weight matrix"
    elif not disagree:  # one rule: fitted on every matrix at once, where more d_in tell the readings apart
        summary = f"{fit_role('every role', [r for r in rows if r.sigma]).describe} in every role"
    else:
        same = [role for role in fits if agree[role] and role != "matrices"]
        summary = f"matrices{' and ' + ', '.join(same) if same else ''}: {base.describe}; " + "; ".join(
            disagree
        )
    return Recipe(summary, fits, ratio, k, layers, disagree)
