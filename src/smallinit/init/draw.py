"""The γ rule applied to a model: matrices drawn, norms set to scale 1, biases 0, the rest kept.

Scope (ours: the paper does not say what d_in is for each kind of parameter): d_in is the dimension the
forward contracts with the input (``roles``), the embedding dimension for embedding tables. Draws are in
fp32 on the CPU from one seeded generator in ``named_modules`` order, so the weights do not depend on
dtype, device or parallel layout; a sharded (DTensor) parameter gets its shard of the full draw, a ZeRO-3
partitioned one is drawn whole and partitioned back (``partitioned``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from smallinit.errors import ConfigError
from smallinit.init.branches import StreamTrace, branch_note, trace_stream
from smallinit.init.own import own_buffers_, own_init_, uninitialised
from smallinit.init.partitioned import full_shape, gathered
from smallinit.init.roles import ParamRole, head_weights, named_parameters_once, resolve_roles
from smallinit.init.scales import SCALE_ROLES, InitScaleError, RoleScale, parse_scales


class MetaDeviceError(ConfigError):
    """Parameters on the meta device hold no values, so there is nothing to draw into."""


def gamma_std(fan_in: int, gamma: float) -> float:
    """σ = d_in^(−γ)."""
    return float(fan_in) ** (-gamma)


def _check_gamma(gamma: float) -> None:
    if (
        isinstance(gamma, bool)
        or not isinstance(gamma, (int, float))
        or gamma <= 0
        or not math.isfinite(gamma)
    ):
        raise ConfigError(f"gamma must be a positive number such as 1.0, got {gamma!r}")


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


@torch.no_grad()
def gamma_normal_(
    tensor: torch.Tensor, gamma: float, fan_in: int | None = None, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Fill ``tensor`` in place from N(0, fan_in^(−2γ)); fan_in defaults to the last (input) dimension.

    The full tensor is drawn in fp32 on the CPU; a DTensor keeps its shard of it, so every layout gets
    the values the unsharded tensor gets (one full tensor in memory at a time)."""
    _check_gamma(gamma)
    if fan_in is None:
        if tensor.dim() < 2:
            raise ConfigError(f"gamma_normal_ needs fan_in for a {tensor.dim()}-d tensor")
        fan_in = tensor.shape[-1]
    return _normal_(tensor, gamma_std(fan_in, gamma), generator)


def _normal_(tensor: torch.Tensor, std: float, generator: torch.Generator | None) -> torch.Tensor:
    if tensor.is_meta:
        raise MetaDeviceError("the tensor is on the meta device: nothing to draw into; materialise it first")
    if (
        tensor.dtype == torch.float32
        and tensor.device.type == "cpu"
        and tensor.is_contiguous()
        and not _is_dtensor(tensor)
    ):
        return tensor.normal_(0.0, std, generator=generator)  # the same numbers as a fresh fp32 draw
    sample = torch.empty(tensor.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
    if _is_dtensor(tensor):
        from torch.distributed.tensor import distribute_tensor

        # every rank drew the same full tensor: each keeps its shard, without communication
        shard = distribute_tensor(sample, tensor.device_mesh, tensor.placements, src_data_rank=None)
        tensor.to_local().copy_(shard.to_local())
        return tensor
    return tensor.copy_(sample)


def _fill_(tensor: torch.Tensor, value: float) -> None:
    (tensor.to_local() if _is_dtensor(tensor) else tensor).fill_(value)


@dataclass(frozen=True)
class InitRow:
    name: str
    shape: tuple[int, ...]
    rule: str  # "normal", "ones", "zeros" or "kept"
    fan_in: int | None
    std: float | None
    reason: str = ""  # what the parameter is (kept: why it is kept)
    kind: str = ""  # its ParamRole kind
    role: str = ""  # drawn ones: embedding | head | output | hidden (init/scales.py), "matrix" if not traced


@dataclass
class InitReport:
    """What gamma_init_ set, one row per parameter; ``str(report)`` is a table."""

    gamma: float
    rows: list[InitRow]
    notes: list[str] = field(default_factory=list)
    renormalised: list[str] = field(default_factory=list)  # norms whose output a branch adds to the residual
    scales: list[str] = field(default_factory=list)  # the per-role scales applied (ROLE=RULE, init/scales.py)

    @property
    def title(self) -> str:
        return f"γ-init, γ = {self.gamma:g}" + (
            f", per-role scales {', '.join(self.scales)}" if self.scales else ""
        )

    def __str__(self) -> str:
        header = f"{'parameter':<48} {'shape':<18} {'role':<9} {'rule':<6} {'d_in':>6} {'std':>10}  note"
        lines = [self.title, header, "-" * len(header)]
        for r in self.rows:
            fan = "" if r.fan_in is None else str(r.fan_in)
            std = "" if r.std is None else f"{r.std:.4g}"
            lines.append(
                f"{r.name:<48} {str(tuple(r.shape)):<18} {r.role:<9} {r.rule:<6} {fan:>6} {std:>10}  "
                f"{r.reason}".rstrip()
            )
        counts = {
            rule: sum(r.rule == rule for r in self.rows) for rule in ("normal", "ones", "zeros", "kept")
        }
        lines.append(
            f"{counts['normal']} drawn, {counts['ones']} set to 1, {counts['zeros']} set to 0, "
            f"{counts['kept']} kept as they were"
        )
        lines += self.notes
        return "\n".join(lines)

    def by_name(self) -> dict[str, InitRow]:
        return {r.name: r for r in self.rows}

    def summary(self) -> str:
        """The table with the layers folded: one row per parameter of a block (blocks.*.), with its count."""
        groups: dict[tuple, int] = {}
        for r in self.rows:
            name = re.sub(r"\.\d+\.", ".*.", r.name)
            key = (name, tuple(r.shape), r.role, r.rule, r.fan_in, r.std, r.reason)
            groups[key] = groups.get(key, 0) + 1
        header = f"{'parameter':<40} {'count':>5} {'shape':<18} {'role':<9} {'rule':<6} {'d_in':>6} {'std':>10}  note"
        lines = [
            f"{self.title} ({len(self.rows)} parameters; --layers lists each)",
            header,
            "-" * len(header),
        ]
        for (name, shape, role, rule, fan, std, reason), n in groups.items():
            lines.append(
                f"{name:<40} {n:>5} {str(shape):<18} {role:<9} {rule:<6} {'' if fan is None else fan:>6} "
                f"{'' if std is None else f'{std:.4g}':>10}  {reason}".rstrip()
            )
        return "\n".join(lines + self.notes)


def _check_materialised(module: nn.Module) -> None:
    meta = [n for n, p in module.named_parameters() if p.is_meta]
    if meta:
        raise MetaDeviceError(
            f"{len(meta)} parameters (first: {meta[0]}) are on the meta device and hold no values; materialise "
            "the model first (model.to_empty(device=...), then recompute its buffers) and call gamma_init_ again"
        )


def _restore_ties(module: nn.Module) -> list[str]:
    """A Hugging Face model that declares tied embeddings but has them untied (``to_empty`` copies each
    name into its own storage) is tied again before drawing, so the tie is drawn once."""
    get_in, get_out = (
        getattr(module, "get_input_embeddings", None),
        getattr(module, "get_output_embeddings", None),
    )
    config = getattr(module, "config", None)
    if not (callable(get_in) and callable(get_out) and hasattr(config, "get_text_config")):
        return []
    if not getattr(
        config.get_text_config(), "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)
    ):
        return []
    inp, out = get_in(), get_out()
    if inp is None or out is None or getattr(out, "weight", None) is None or out.weight is inp.weight:
        return []
    module.tie_weights()
    if out.weight is not inp.weight:
        return [
            "note: the config ties the output embeddings to the input embeddings but they are separate "
            "tensors, and tie_weights() did not tie them: both are drawn"
        ]
    return [
        "note: the output embeddings were not tied to the input embeddings although the config ties them "
        "(to_empty breaks ties): tied again, drawn once"
    ]


def _rule(role: ParamRole, gamma: float) -> tuple[str, int | None, float | None]:
    if role.kind in ("matrix", "embedding"):
        return "normal", role.fan_in, gamma_std(role.fan_in, gamma)
    if role.kind == "norm":
        return ("zeros" if role.norm_offset else "ones"), None, None
    if role.kind == "bias":
        return "zeros", None, None
    return "kept", None, None


def _describe(role: ParamRole) -> str:
    if role.kind == "norm":
        return "norm x̂·(1 + w): scale 1 at w = 0" if role.norm_offset else "norm"
    return role.reason if role.kind in ("own", "unknown") else ""


def init_plan(
    module: nn.Module,
    gamma: float = 1.0,
    *,
    example_inputs=None,
    roles: dict[str, ParamRole] | None = None,
    scales=None,
) -> InitReport:
    """What ``gamma_init_`` would set, without touching a parameter (works on the meta device)."""
    _check_gamma(gamma)
    by_role = parse_scales(scales)
    notes: list[str] = []
    if roles is None:
        roles, notes = resolve_roles(module, example_inputs)
    trace = trace_stream(module, example_inputs)
    heads = head_weights(module)
    rows: list[InitRow] = []
    for name, _, _, p in named_parameters_once(module):
        role = roles.get(name) or ParamRole("unknown", reason="no role given")
        rule, fan, std = _rule(role, gamma)
        row = InitRow(name, tuple(full_shape(p)), rule, fan, std, _describe(role), role.kind)
        rows.append(_scaled(row, _scale_role(row, id(p) in heads, trace), by_role, gamma, trace))
    _check_scales(by_role, rows, trace)
    unknown = [
        r for r in rows if r.rule == "kept" and roles.get(r.name, ParamRole("unknown")).kind == "unknown"
    ]
    if unknown:
        notes.append(
            f"warning: {len(unknown)} parameters kept because their role is not established "
            f"(first: {unknown[0].name}: {unknown[0].reason})"
        )
    renormalised = trace.renormalised if trace is not None else []
    if renormalised:  # the rule's balance of the residual stream does not hold there: say so
        notes.append(branch_note(renormalised))
    return InitReport(
        gamma=gamma,
        rows=rows,
        notes=notes,
        renormalised=renormalised,
        scales=[str(s) for s in by_role.values()],
    )


def _scale_role(row: InitRow, head: bool, trace: StreamTrace | None) -> str:
    """The row's role for per-role scales (init/scales.py); "matrix" where no forward told output from hidden."""
    if row.kind == "embedding":
        return "embedding"
    if row.kind != "matrix":
        return ""
    if head:
        return "head"
    if trace is None:
        return "matrix"
    return "output" if row.name in trace.writers else "hidden"


def _scaled(
    row: InitRow, role: str, by_role: dict[str, RoleScale], gamma: float, trace: StreamTrace | None
) -> InitRow:
    scale = by_role.get(role)
    if scale is None:
        return replace(row, role=role)
    std = scale.std(row.fan_in, gamma, trace.additions if trace is not None else 0)
    note = f"{scale}" + (f" (÷√{trace.additions})" if scale.rule == "depth" and trace is not None else "")
    reason = f"{row.reason}; {note}" if row.reason else note
    if std == 0:
        return replace(row, role=role, rule="zeros", std=None, reason=reason)
    return replace(row, role=role, std=std, reason=reason)


def _check_scales(by_role: dict[str, RoleScale], rows: list[InitRow], trace: StreamTrace | None) -> None:
    """Each scale's role must name some drawn parameter: one line saying which roles there are."""
    counts: dict[str, int] = {}
    for r in rows:
        if r.role:
            counts[r.role] = counts.get(r.role, 0) + 1
    for role, scale in by_role.items():
        if counts.get(role):
            continue
        if role in ("output", "hidden") and trace is None:
            raise InitScaleError(
                f"init scale {scale}: telling output projections from hidden matrices needs one forward of the "
                "model, and none ran (no example_inputs given, or the forward failed on this device); pass "
                "example_inputs of a forward that runs"
            )
        here = ", ".join(f"{n} {r}" for r, n in counts.items()) or "none"
        why = " (the head is tied to the embedding: scale embedding)" if role == "head" else ""
        raise InitScaleError(
            f"init scale {scale}: no parameter has role {role}{why}; this model's roles: {here} "
            f"(of {', '.join(SCALE_ROLES)})"
        )
    if (
        trace is not None
        and "output" in by_role
        and by_role["output"].rule == "depth"
        and not trace.additions
    ):
        raise InitScaleError(
            f"init scale {by_role['output']}: the forward made no residual addition to count"
        )


def _own_init(module: nn.Module, report: InitReport, generator: torch.Generator | None) -> None:
    """A model whose architecture has not initialised it (built on meta, then ``to_empty``) gets the
    architecture's own init first: what γ-init keeps and the buffers never hold leftover memory. The rows
    and a note say so."""
    fresh = uninitialised(module)
    if not fresh:
        return
    kept = [r.name for r in report.rows if r.rule == "kept" and r.name in fresh]
    # sharded: every parameter is the rule's
    if not kept and any(_is_dtensor(p) for p in module.parameters()):
        buffers = own_buffers_(module)
        if buffers:
            report.notes.append(
                f"note: not initialised by its architecture (as after building on the meta device): "
                f"the buffers of {', '.join(buffers)} got {type(module).__name__}'s own init"
            )
        return
    own_init_(module, kept, generator)
    done = set(kept)
    report.rows = [
        replace(
            r,
            reason=f"{r.reason}; not initialised (as built on meta): the architecture's init"
            if r.reason
            else "not initialised (as built on meta): the architecture's init",
        )
        if r.name in done
        else r
        for r in report.rows
    ]
    what = f"{len(kept)} kept parameters (first: {kept[0]}) and the buffers" if kept else "the buffers"
    report.notes.append(
        f"note: not initialised by its architecture (as after building on the meta device): {what} got "
        f"{type(module).__name__}'s own init (_init_weights) first"
    )


@torch.no_grad()
def gamma_init_(
    module: nn.Module,
    gamma: float = 1.0,
    *,
    generator: torch.Generator | None = None,
    example_inputs=None,
    roles: dict[str, ParamRole] | None = None,
    scales=None,
) -> InitReport:
    """Apply the γ rule to every parameter of ``module`` (ours or any other nn.Module) and report it.

    Weight matrices and embedding tables ~ N(0, d_in^(−2γ)); norm weights to their scale-1 value (1, or 0
    for the (1 + w) form); biases 0; everything else kept, with the reason (see ``param_roles``, which
    ``example_inputs`` is passed to; ``roles`` skips it). Parameters are drawn in ``named_modules`` order
    so a seeded ``generator`` gives the same weights on every run and every parallel layout. A model on
    the meta device is refused (``init_plan`` shows what would be set); after ``to_empty``, what is kept but
    its architecture never initialised gets the architecture's own init first (``own``).

    ``scales`` overrides the rule by role (init/scales.py): ``{"embedding": "std:1", "output": "zero"}`` or
    ``["output=depth", "head=gamma:0.5"]``; the report shows each parameter's role and σ.
    """
    _check_gamma(gamma)
    _check_materialised(module)
    ties = _restore_ties(module)
    report = init_plan(module, gamma, example_inputs=example_inputs, roles=roles, scales=scales)
    _own_init(module, report, generator)
    params = {name: p for name, _, _, p in named_parameters_once(module)}
    for row in report.rows:
        p = params[row.name]
        if row.rule == "kept":
            continue
        # a ZeRO-3 partitioned parameter is drawn whole, one at a time, and rank 0's draw partitioned back:
        # every rank draws the same numbers, so the generators stay in step
        with gathered([p], modifier_rank=0):
            if row.rule == "normal":
                _normal_(p, row.std, generator)
                owner = module.get_submodule(row.name.rpartition(".")[0])
                if getattr(owner, "undrawn", None):  # an attention gate added on meta waits for no other draw
                    owner.undrawn = None
            else:
                _fill_(p, 1.0 if row.rule == "ones" else 0.0)
    report.notes[:0] = ties
    return report
