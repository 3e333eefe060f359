"""What each parameter is to the γ rule, and which of its axes the forward contracts with the input.

A weight matrix ("matrix") is drawn from N(0, d_in^(−2γ)) with d_in the size of the axis the forward
contracts with the input (times the kernel for convolutions); an embedding table ("embedding") uses its
embedding dimension. A norm weight ("norm") is set to what means scale 1 in its form: 1 for x̂·w, 0 for
x̂·(1 + w) (``norm_offset``); a bias ("bias") to 0. Everything else is kept as the architecture made it:
parameters with an initialisation of their own ("own": state-space, recurrence, sink logits) and
parameters whose role could not be established ("unknown"), each with its reason.

Known module types answer at once (nn.Linear, nn.Embedding, convolutions, GPT-2's Conv1D, norms); a
module may also declare the input axis of its own parameters in a ``gamma_in_dim`` dict attribute
(name → axis) or their fan-in in ``gamma_fan_in`` (name → d_in, the input axis being the last).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.func import functional_call

from smallinit.init.arch import architecture_inits
from smallinit.init.partitioned import full_shape
from smallinit.init.trace import Contraction, TraceError, Use, trace_uses

KINDS = ("matrix", "embedding", "norm", "bias", "own", "unknown")
NORM_WEIGHTS = ("weight", "scale", "gamma", "g")
NORM_BIASES = ("bias", "beta", "b")


@dataclass(frozen=True)
class ParamRole:
    """What a parameter is to the γ rule.

    ``in_dim`` is the axis contracted with the input (leading axes, such as experts, are batch axes);
    ``kernel_dims`` are further axes contracted with it (a convolution's kernel), so that
    d_in = ``fan_in`` = the product of their sizes. Both count axes of ``view`` when the forward sees the
    parameter in another shape than it is stored in (DBRX's (experts · ffn, d) seen as (experts, ffn, d),
    heads merged); ``in_dim`` is None when d_in is established but is no one axis of a reshape.
    ``norm_offset`` is True for norms of the (1 + w) form, whose scale-1 value is 0. ``reason`` says why a
    parameter is kept ("own", "unknown") and ``source`` where the role came from ("module type",
    "declared", "forward", "architecture init").
    """

    kind: str
    fan_in: int | None = None
    in_dim: int | None = None
    norm_offset: bool = False
    reason: str = ""
    kernel_dims: tuple[int, ...] = ()
    source: str = ""
    view: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ParamRole kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def drawn(self) -> bool:
        return self.kind in ("matrix", "embedding")


def matrix(p: torch.Tensor, in_dim: int, source: str, kernel_dims: tuple[int, ...] = ()) -> ParamRole:
    shape = full_shape(p)
    in_dim = in_dim % len(shape)
    fan_in = shape[in_dim] * math.prod(shape[d] for d in kernel_dims)
    return ParamRole("matrix", int(fan_in), in_dim, kernel_dims=kernel_dims, source=source)


def kept(kind: str, reason: str, source: str) -> ParamRole:
    return ParamRole(kind, reason=reason, source=source)


def as_out_in(tensor: torch.Tensor, role: ParamRole) -> torch.Tensor:
    """The matrix in (..., out, in) orientation: batch axes first, then the output axis, then the input
    axis (with a convolution's kernel axes flattened into it, so its size is d_in), in the shape the forward
    sees it in (``role.view``). A view where possible."""
    if role.in_dim is None or role.kind not in ("matrix", "embedding"):
        raise ValueError(f"as_out_in needs a matrix or embedding role with an input axis, got {role.kind!r}")
    if role.view is not None:
        tensor = tensor.reshape(role.view)
    ins = (role.in_dim, *role.kernel_dims)
    rest = [d for d in range(tensor.dim()) if d not in ins]
    if not rest:
        raise ValueError(f"a {tensor.dim()}-d tensor has no output axis besides its input axes {ins}")
    moved = tensor.permute(*rest, *ins)
    return moved.flatten(len(rest)) if role.kernel_dims else moved


def head_weights(model: nn.Module) -> set[int]:
    """The id of the output head's weight: a Hugging Face model's output embeddings, or an ``lm_head``'s."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else getattr(model, "lm_head", None)
    w = getattr(head, "weight", None)
    return {id(w)} if isinstance(w, torch.Tensor) else set()


def is_norm(module: nn.Module) -> bool:
    """Norm layers of any library (ours, torch, Hugging Face) by class name: RMSNorm, LayerNorm, ..."""
    return "norm" in type(module).__name__.lower()


def norm_layers(module: nn.Module) -> dict[str, nn.Module]:
    """The norm layers of ``module`` by name: a class name that says norm (is_norm) and no parameters in
    submodules. A module that holds norms or other layers is not one, whatever its name: StableLM's per-head
    norm (a list of nn.LayerNorm), roberta-prelayernorm's encoder and attention ("…PreLayerNorm…")."""
    return {
        name: m
        for name, m in module.named_modules()
        if is_norm(m) and not any(True for c in m.children() for _ in c.parameters())
    }


def _first_tensor(out) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


@torch.no_grad()
def norm_role(module: nn.Module, wname: str, w: torch.Tensor) -> ParamRole:
    """The form of a norm's weight, probed on its own forward rather than guessed from the class name:
    with bias 0, x̂·w gives 0 at w = 0 and x̂·(1 + w) gives 0 at w = −1. Works on any weight shape (2-D
    per-head norms too) and on meta or sharded models (the probe runs on plain CPU copies)."""
    x = torch.randn(4, *full_shape(w), generator=torch.Generator().manual_seed(0))
    # further required inputs (the gate of a gated norm) get ones: they scale the output, never zero it
    params = list(inspect.signature(module.forward).parameters.values())[1:]
    extra = [torch.ones_like(x) for q in params if q.default is q.empty and q.kind is q.POSITIONAL_OR_KEYWORD]

    def out(value: float) -> torch.Tensor:
        state = {n: torch.zeros(full_shape(p)) for n, p in module.named_parameters()}
        state[wname] = torch.full(full_shape(w), value)
        y = _first_tensor(functional_call(module, state, (x, *extra), strict=False))
        if y is None:
            raise TypeError("its forward returns no tensor")
        return y.float()

    try:
        at0, at1, atm1 = out(0.0), out(1.0), out(-1.0)
    except Exception as e:  # a norm whose forward wants other inputs: its form stays unknown
        return kept(
            "unknown",
            f"norm form not probed ({type(e).__name__}: {str(e).splitlines()[0][:80]})",
            "module type",
        )
    scale = at1.abs().max()
    if not torch.isfinite(scale) or scale == 0:
        return kept("unknown", "norm form not probed (its output at w = 1 is 0 or not finite)", "module type")
    if at0.abs().max() <= 1e-6 * scale:
        return ParamRole("norm", source="module type")
    if atm1.abs().max() <= 1e-6 * scale:
        return ParamRole("norm", norm_offset=True, source="module type")
    return kept(
        "unknown", "norm weight is neither x̂·w nor x̂·(1 + w) (probed at w = 0 and w = −1)", "module type"
    )


def _is_hf_conv1d(module: nn.Module) -> bool:
    """GPT-2's Conv1D: weight stored (in, out), applied as x @ W."""
    w = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(w, torch.Tensor)
        and w.dim() == 2
        and tuple(full_shape(w)) == (getattr(module, "nx", None), getattr(module, "nf", None))
    )


def module_roles(module: nn.Module) -> dict[str, ParamRole]:
    """Roles of ``module``'s own parameters that its type (or its declaration) establishes."""
    own = dict(module.named_parameters(recurse=False))
    roles: dict[str, ParamRole] = {}
    in_dims = getattr(module, "gamma_in_dim", None)
    fans = getattr(module, "gamma_fan_in", None)
    keep = getattr(module, "gamma_keep", None)
    for name, p in own.items():
        if isinstance(keep, dict) and name in keep:
            roles[name] = kept("own", str(keep[name]), "declared")
        elif isinstance(in_dims, dict) and name in in_dims:
            roles[name] = matrix(p, int(in_dims[name]), "declared")
        elif isinstance(fans, dict) and name in fans:
            roles[name] = ParamRole("matrix", int(fans[name]), len(full_shape(p)) - 1, source="declared")
    w, b = own.get("weight"), own.get("bias")
    if isinstance(module, nn.Linear) and w is not None:
        roles.setdefault("weight", matrix(w, 1, "module type"))
    elif isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and w is not None:
        roles.setdefault("weight", ParamRole("embedding", module.embedding_dim, 1, source="module type"))
    elif isinstance(module, nn.modules.conv._ConvNd) and w is not None:
        if module.transposed:
            roles.setdefault(
                "weight",
                kept(
                    "unknown",
                    "transposed convolution: each output sums a stride-"
                    "dependent share of the kernel, so d_in is not one axis",
                    "module type",
                ),
            )
        else:  # (out, in / groups, *kernel): d_in = in_channels / groups × kernel
            roles.setdefault("weight", matrix(w, 1, "module type", tuple(range(2, w.dim()))))
    elif _is_hf_conv1d(module) and w is not None:
        roles.setdefault("weight", matrix(w, 0, "module type"))
    elif is_norm(module):
        for name, p in own.items():
            if name in NORM_WEIGHTS:
                roles.setdefault(name, norm_role(module, name, p))
            elif name in NORM_BIASES:
                roles.setdefault(name, ParamRole("bias", source="module type"))
        return roles
    if b is not None and (isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)) or _is_hf_conv1d(module)):
        roles.setdefault("bias", ParamRole("bias", source="module type"))
    return roles


def named_parameters_once(module: nn.Module):
    """(name, module, attribute name, parameter) in ``named_modules`` order, each parameter once (ties
    under the first name): the order in which a seeded generator draws them."""
    seen: set[int] = set()
    for mname, mod in module.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            yield (f"{mname}.{pname}" if mname else pname), mod, pname, p


def _example_inputs(module: nn.Module, example_inputs) -> tuple[tuple, dict] | None:
    """(args, kwargs) for one forward: those given, or a Hugging Face model's own dummy inputs."""
    if example_inputs is not None:
        if isinstance(example_inputs, dict):
            return (), dict(example_inputs)
        return (tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)), {}
    try:
        dummy = getattr(module, "dummy_inputs", None)
    except Exception:  # a property that cannot be built for this config
        return None
    if not isinstance(dummy, dict) or not isinstance(dummy.get("input_ids"), torch.Tensor):
        return None
    kwargs: dict = {"input_ids": dummy["input_ids"][:1]}
    if "use_cache" in inspect.signature(module.forward).parameters:
        kwargs["use_cache"] = False
    return (), kwargs


def _from_contractions(p: torch.Tensor, cs: set[Contraction | None]) -> ParamRole:
    """d_in from how the forward contracts it: the size every use agrees on."""
    if None in cs:
        return kept(
            "unknown", "the forward contracts it along something that is not a part of its axes", "forward"
        )
    sizes = sorted({c.size for c in cs})
    if len(sizes) > 1:
        shown = ", ".join(map(str, sizes))
        return kept(
            "unknown",
            f"the forward contracts it at different sizes ({shown}): d_in not one number",
            "forward",
        )
    if len(cs) > 1:
        return ParamRole(
            "matrix", sizes[0], source=f"forward (used in {len(cs)} shapes, each contracting {sizes[0]})"
        )
    (c,) = cs
    return ParamRole(
        "matrix", c.size, c.ins[0] if c.ins else None, kernel_dims=c.ins[1:], source="forward", view=c.view
    )


def _from_use(p: torch.Tensor, use: Use | None, why_not: str) -> ParamRole:
    """The role the forward gives a parameter no known module type covers."""
    if use is None:
        return kept("unknown", why_not, "forward")
    if use.contracted:
        return _from_contractions(p, use.contracted)
    if use.added:
        return ParamRole("bias", source="forward")
    if use.lookup and not use.ops:
        shape = full_shape(p)
        if len(shape) == 2:
            return ParamRole("embedding", int(shape[1]), 1, source="forward")
        return kept(
            "unknown", f"a {len(shape)}-d lookup table: its embedding axis is not established", "forward"
        )
    if use.ops:
        ops = ", ".join(sorted(use.ops)[:4])
        return kept("own", f"not a weight matrix: the forward uses it only in {ops}", "forward")
    return kept("unknown", "the forward did not use it", "forward")


def _checked(fast: ParamRole, p: torch.Tensor, use: Use | None) -> ParamRole:
    """A module-type role checked against the forward; where they differ the forward's d_in is the truth."""
    if use is None or fast.kind != "matrix" or not use.contracted:
        return fast
    want = Contraction(
        tuple(a for a in (fast.in_dim, *fast.kernel_dims) if full_shape(p)[a] > 1), fast.fan_in
    )
    if use.contracted == {want}:
        return replace(fast, source=f"{fast.source}, checked by the forward")
    seen = _from_contractions(p, use.contracted)
    if seen.kind == "matrix":
        return replace(seen, source=f"forward (its module type says d_in {fast.fan_in})")
    return replace(seen, reason=f"{seen.reason} (its module type says d_in {fast.fan_in})")


def resolve_roles(
    module: nn.Module, example_inputs=None, *, forward: bool = True
) -> tuple[dict[str, ParamRole], list[str]]:
    """``param_roles`` and notes on how the forward check went."""
    entries = list(named_parameters_once(module))
    known: dict[int, dict[str, ParamRole]] = {}
    fast: dict[str, ParamRole | None] = {}
    for name, mod, pname, _ in entries:
        if id(mod) not in known:
            known[id(mod)] = module_roles(mod)
        fast[name] = known[id(mod)].get(pname)

    notes: list[str] = []
    uses: dict[str, Use] | None = None
    why_not = "d_in not established: not a parameter of a known module type, and no forward was run"
    inputs = _example_inputs(module, example_inputs) if forward else None
    if forward and inputs is None:
        why_not += " (pass example_inputs)"
    elif forward:
        try:
            uses = trace_uses(module, lambda: {n: p for n, _, _, p in entries}, *inputs)
        except TraceError as e:
            why_not = (
                f"d_in not established: not a parameter of a known module type, and the forward failed ({e})"
            )
            notes.append(f"forward check failed: {e}")
    declared = architecture_inits(module)
    some_trained = any(p.requires_grad for *_, p in entries)  # a wholly frozen model says nothing
    roles: dict[str, ParamRole] = {}
    for name, _, _, p in entries:
        use = uses.get(name) if uses is not None else None
        role = _checked(fast[name], p, use) if fast[name] is not None else _from_use(p, use, why_not)
        how = declared.get(name)
        if some_trained and not p.requires_grad and role.kind != "own":
            role = kept(
                "own",
                "frozen (requires_grad=False): a fixed table or constant of the architecture",
                role.source,
            )
        elif how is not None and role.kind in ("bias", "embedding"):
            # a matrix is drawn whatever its architecture's init; a bias or table it computes is its own
            role = kept("own", f"its architecture initialises it with {how}", "architecture init")
        roles[name] = role
    return roles, notes


def param_roles(module: nn.Module, example_inputs=None, *, forward: bool = True) -> dict[str, ParamRole]:
    """The role of every parameter of ``module``, keyed by name (tied parameters once, under the first).

    Known module types answer first; one forward (``example_inputs``: a tensor, a tuple of arguments or a
    dict of keyword arguments; a Hugging Face model's dummy inputs when not given) checks them and gives
    the role of every other parameter from how it is used. What neither establishes is "unknown", with
    its reason; parameters the architecture initialises in a way of its own (``_init_weights`` of a
    Hugging Face model, or a module's ``gamma_keep`` dict: name → reason) are "own".
    """
    return resolve_roles(module, example_inputs, forward=forward)[0]
