"""How one forward uses each parameter: which of its axes a matmul, linear, conv or grouped matmul
contracts with the input and at what size, whether it is looked up (an embedding), added (a bias) or only
used element-wise (a parameter of its own kind), recorded op by op at the ATen level.

No value of a parameter is read: every parameter (and buffer) stands in as a meta tensor of its shape and
strides, so a model on the CPU, on an accelerator, on meta or sharded (DTensor) gives the same record. An
op that reads a parameter runs on meta and yields zeros of its output's shape on the CPU; everything else
runs for real on the CPU, so control flow that needs values (token routing, masks) runs on those zeros,
the same way whatever the weights are.

A tensor is followed back to its parameter by its storage: a view (transpose, reshape, select, expand, a
slice of a fused tensor) shares it, and its strides say which part of which parameter axis each of its
dimensions runs along: a whole axis, a part of a split one (DBRX's experts · ffn axis seen as ffn) or
several merged. Copies (casts, clone, gathers of experts) are followed explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from smallinit.init.partitioned import full_shape, is_partitioned

aten = torch.ops.aten

# one dimension of a tensor seen in a parameter: (parameter axis, size, stride within that axis) pieces,
# outer to inner; a whole axis j is ((j, shape[j], 1),)
Pieces = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Contraction:
    """One contraction of a parameter with the input, as the forward sees the parameter.

    ``size`` is d_in: the size of what is contracted. ``ins`` are the axes contracted together, of ``view``
    (the shape the forward gives the parameter, when that is not the stored one: a split or merged axis)
    or of the stored shape; empty when d_in is known but is no one axis of a reshape of the parameter."""

    ins: tuple[int, ...]
    size: int
    view: tuple[int, ...] | None = None


@dataclass
class Use:
    """What the forward did with one parameter."""

    contracted: set[Contraction | None] = field(default_factory=set)  # None: along no part of its axes
    lookup: bool = False  # rows gathered by integer indices (an embedding table)
    added: bool = False  # a bias: added to a contraction's output, or passed as its bias
    ops: set[str] = field(default_factory=set)  # every other op it flowed into


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _sub(pieces: Pieces, size: int, inner: int) -> Pieces | None:
    """The part of a dimension made of ``pieces`` that has ``size`` and runs with stride ``inner`` inside it."""
    out = []
    for j, n, step in reversed(pieces):  # innermost first
        if size == 1:
            break
        if inner >= n:
            if inner % n:
                return None
            inner //= n
            continue
        if n % inner:
            return None
        avail = n // inner
        take = min(avail, size)
        if (avail % take) or (size % take):
            return None
        out.append((j, take, step * inner))
        size //= take
        inner = 1
    return tuple(reversed(out)) if size == 1 and out else None


def _map_axes(t: torch.Tensor, base: torch.Tensor, descs: list[Pieces | None]) -> list[Pieces | None]:
    """For each dim of ``t`` (a view of ``base``'s storage) the parameter pieces it runs along, or None."""
    dims = [j for j in range(base.dim()) if base.shape[j] > 1 and base.stride(j) > 0]
    out: list[Pieces | None] = []
    for d in range(t.dim()):
        size, stride = t.shape[d], t.stride(d)
        below = [j for j in dims if base.stride(j) <= stride and stride % base.stride(j) == 0]
        if size == 1 or stride == 0 or not below:
            out.append(None)  # broadcast or not a part of the parameter's layout
            continue
        i = max(below, key=base.stride)
        chain = [i]  # dim i, then the outer dims laid out contiguously after it (a merge)
        while descs[chain[-1]] is not None:
            nxt = [j for j in dims if base.stride(j) == base.stride(chain[-1]) * base.shape[chain[-1]]]
            if len(nxt) != 1 or descs[nxt[0]] is None:
                break
            chain.append(nxt[0])
        if descs[i] is None:
            out.append(None)
            continue
        pieces = tuple(p for j in reversed(chain) for p in descs[j])
        out.append(_sub(pieces, size, stride // base.stride(i)))
    return out


def _contraction(shape: tuple[int, ...], pieces: list[Pieces | None], sizes: list[int]) -> Contraction | None:
    """The contraction of dims seen as ``pieces`` (of a parameter of ``shape``), of sizes ``sizes``."""
    if any(p is None for p, s in zip(pieces, sizes) if s > 1):
        return None
    flat = [q for p, s in zip(pieces, sizes) if s > 1 for q in p]
    size = math.prod(sizes)
    if not flat:
        return Contraction((), size)
    whole = all(n == shape[j] and step == 1 for j, n, step in flat)
    axes = [j for j, _, _ in flat]
    if whole and len(pieces) > 1:  # a convolution: channel and kernel axes, each whole
        return Contraction(tuple(axes), size)
    if whole and axes == list(range(axes[0], axes[0] + len(axes))):
        if len(axes) == 1:
            return Contraction((axes[0],), size)
        return Contraction((axes[0],), size, shape[: axes[0]] + (size,) + shape[axes[-1] + 1 :])  # merged
    if len(flat) == 1:  # a part of one axis: that axis seen as (outer, size, inner)
        j, n, step = flat[0]
        parts = (shape[j] // (n * step), n, step)
        kept = [k for k, x in enumerate(parts) if x > 1 or k == 1]
        view = shape[:j] + tuple(parts[k] for k in kept) + shape[j + 1 :]
        return Contraction((j + kept.index(1),), size, view)
    return Contraction((), size)


class _Recorder(TorchDispatchMode):
    # contraction ops: (index of the operand, which of its dims is contracted, counted from the end)
    CONTRACT = {
        aten.mm.default: ((0, -1), (1, -2)),
        aten.addmm.default: ((1, -1), (2, -2)),
        aten.bmm.default: ((0, -1), (1, -2)),
        aten.baddbmm.default: ((1, -1), (2, -2)),
        aten.matmul.default: ((0, -1), (1, -2)),
        aten._grouped_mm.default: ((0, -1), (1, -2)),
    }
    BIAS_ARG = {aten.addmm.default: 0, aten.baddbmm.default: 0}
    COPIES = {aten.clone.default, aten._to_copy.default, aten.lift_fresh_copy.default}
    # what stays linear in a contraction's output: routing weights, expert outputs combined, casts
    LINEAR = {
        aten.mul.Tensor,
        aten.div.Tensor,
        aten.index_add.default,
        aten.index_add_.default,
        aten.index_put.default,
        aten.index_put_.default,
        aten.scatter_add.default,
        aten.scatter_add_.default,
        aten.cat.default,
        aten.stack.default,
        aten.sum.dim_IntList,
        aten._to_copy.default,
        aten.clone.default,
        aten._unsafe_view.default,
        aten.neg.default,
    }

    def __init__(self, params: dict[str, torch.Tensor]):
        super().__init__()
        # storage → (name, the tensor whose strides define the axes, the parameter pieces of each of its dims)
        self.bases: dict[int, tuple[str, torch.Tensor, list[Pieces | None]]] = {
            _key(t): (name, t, [((j, n, 1),) for j, n in enumerate(t.shape)]) for name, t in params.items()
        }
        self.shapes = {name: tuple(t.shape) for name, t in params.items()}
        self.uses = {name: Use() for name in params}
        self.products: set[int] = set()  # storages of tensors linear in a contraction's output
        # every tensor whose storage is a key above, kept alive so that no later tensor reuses its address
        self.alive: list[torch.Tensor] = list(params.values())

    def axes(self, t) -> tuple[str, list[Pieces | None]] | None:
        if not isinstance(t, torch.Tensor):
            return None
        found = self.bases.get(_key(t))
        if found is None:
            return None
        name, base, descs = found
        return name, _map_axes(t, base, descs)

    def _contract(self, t, dims: list[int]) -> None:
        got = self.axes(t)
        if got is not None and t.dim() >= 2:
            name, pieces = got
            dims = [d % t.dim() for d in dims]
            self.uses[name].contracted.add(
                _contraction(self.shapes[name], [pieces[d] for d in dims], [t.shape[d] for d in dims])
            )

    def _mark(self, out) -> None:
        for o in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(o, torch.Tensor):
                self.products.add(_key(o))
                self.alive.append(o)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(kwargs.get("device"), torch.device) and kwargs["device"].type == "meta":
            kwargs = {**kwargs, "device": torch.device("cpu")}  # made "on the parameters' device": real
        # tensors sit at the top level of an op's arguments or in one list (cat, stack, index)
        flat = [b for a in (*args, *kwargs.values()) for b in (a if isinstance(a, (list, tuple)) else (a,))]
        tracked = [a for a in flat if isinstance(a, torch.Tensor) and self.axes(a) is not None]
        keys = {_key(a) for a in tracked}
        # any other tensor on meta (a buffer) stands for zeros of its shape on the CPU
        args, kwargs = tree_map(
            lambda a: _zeros(a) if isinstance(a, torch.Tensor) and a.is_meta and _key(a) not in keys else a,
            (args, kwargs),
        )
        contraction = func in self.CONTRACT or func in (aten.linear.default, aten.convolution.default)
        if tracked:
            self._record(func, args, flat)
        linear = contraction or (
            func in self.LINEAR
            and any(isinstance(a, torch.Tensor) and _key(a) in self.products for a in flat)
        )
        if not tracked:
            out = func(*args, **kwargs)
            if linear:
                self._mark(out)
            return out
        if func._schema.is_mutable and not any(
            a.alias_info is not None
            and a.alias_info.is_write
            and isinstance(v, torch.Tensor)
            and _key(v) in keys
            for a, v in zip(func._schema.arguments, args)
        ):
            return args[0]  # an in-place op on an activation that reads a parameter: its values do not matter
        margs, mkwargs = tree_map(_meta, (args, kwargs))
        if mkwargs.get("device") is not None:
            mkwargs["device"] = torch.device("meta")  # a parameter moved or cast stays a stand-in
        try:
            out = func(*margs, **mkwargs)
        except RuntimeError as e:
            out = _meta_bf16(func, margs, mkwargs, e)
        aliased = isinstance(out, torch.Tensor) and _key(out) in self.bases  # _unsafe_view and the like
        if (
            aliased
            or _is_view(func)
            or func in self.COPIES
            or func in (aten.index.Tensor, aten.index_select.default)
        ):
            if not (aliased or _is_view(func)):
                self._copied(func, args, out)
            return out
        out = tree_map(lambda o: _zeros(o) if isinstance(o, torch.Tensor) else o, out)
        if linear:
            self._mark(out)
        return out

    def _copied(self, func, args, out) -> None:
        """A copy or gather of a tracked tensor: tracked in turn, its dims mapped to the source's pieces."""
        got = self.axes(args[0])
        if got is None:
            return
        name, pieces = got
        if func is aten.index.Tensor:  # w[idx] (experts gathered per token): idx's dims, then the rest
            idx = args[1]
            one = len(idx) == 1 and idx[0] is not None
            pieces = [None] * idx[0].dim() + pieces[1:] if one else [None] * out.dim()
        elif func is aten.index_select.default:
            pieces = [None if d == args[1] % out.dim() else p for d, p in enumerate(pieces)]
        self.bases[_key(out)] = (name, out, pieces if len(pieces) == out.dim() else [None] * out.dim())
        self.alive.append(out)

    def _record(self, func, args, flat) -> None:
        if func in self.CONTRACT:
            for i, dim in self.CONTRACT[func]:
                self._contract(args[i], [dim])
            bias = self.BIAS_ARG.get(func)
            if bias is not None and self.axes(args[bias]) is not None:
                self.uses[self.axes(args[bias])[0]].added = True
        elif func is aten.linear.default:
            self._contract(args[1], [-1])
            if len(args) > 2 and self.axes(args[2]) is not None:
                self.uses[self.axes(args[2])[0]].added = True
        elif func is aten.convolution.default:
            w = self.axes(args[1])
            if w is not None:  # (out, in / groups, *kernel); transposed: no one input axis
                name, _ = w
                if args[6]:
                    self.uses[name].contracted.add(None)
                else:
                    self._contract(args[1], list(range(1, args[1].dim())))
            if args[2] is not None and self.axes(args[2]) is not None:
                self.uses[self.axes(args[2])[0]].added = True
        elif func is aten.embedding.default:
            got = self.axes(args[0])
            if got is not None:
                self.uses[got[0]].lookup = True
        elif func in (aten.index.Tensor, aten.index_select.default):
            got = self.axes(args[0])
            if got is not None:
                self.uses[got[0]].lookup = True
        elif func in self.COPIES:
            pass
        elif (
            func in (aten.add.Tensor, aten.add_.Tensor)
            and sum(self.axes(a) is not None for a in args) == 1
            and any(isinstance(a, torch.Tensor) and _key(a) in self.products for a in args)
        ):
            name = next(self.axes(a)[0] for a in args if self.axes(a) is not None)
            self.uses[name].added = True  # a bias added to a contraction's output
        elif not func._schema.is_mutable and not _is_view(func):
            for a in flat:
                got = self.axes(a)
                if got is not None:
                    self.uses[got[0]].ops.add(func.__name__.split(".")[0])


def _meta_bf16(func, args, kwargs, error: RuntimeError):
    """The output of a meta kernel stricter than the real one about dtypes (``_grouped_mm`` on meta takes
    only bfloat16, on the CPU float32 too): computed in bfloat16, given the inputs' dtype."""
    floats = [
        a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor) and a.is_floating_point()
    ]
    if not floats:
        raise error
    cast = tree_map(
        lambda a: a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a,
        (args, kwargs),
    )
    out = func(*cast[0], **cast[1])
    return tree_map(
        lambda o: o.to(floats[0].dtype) if isinstance(o, torch.Tensor) and o.is_floating_point() else o, out
    )


def _is_view(func) -> bool:
    return any(r.alias_info is not None for r in func._schema.returns)


def _meta(x):
    return (
        torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        if isinstance(x, torch.Tensor) and not x.is_meta
        else x
    )


def _zeros(x: torch.Tensor) -> torch.Tensor:
    return (
        torch.zeros(x.shape, dtype=x.dtype).as_strided(x.shape, x.stride())
        if _dense(x)
        else torch.zeros(x.shape, dtype=x.dtype)
    )


def _dense(x: torch.Tensor) -> bool:
    """Strides of a tensor that owns exactly its elements (so zeros can be laid out the same way)."""
    dims = sorted((x.stride(d), x.shape[d]) for d in range(x.dim()) if x.shape[d] > 1)
    expect = 1
    for stride, size in dims:
        if stride != expect:
            return False
        expect *= size
    return True


def _to_cpu(x):
    return tree_map(lambda a: a.to("cpu") if isinstance(a, torch.Tensor) and not a.is_meta else a, x)


def _stand_in(p: torch.Tensor) -> torch.Tensor:
    """A meta tensor with the parameter's shape and strides (a sharded or partitioned one's global shape)."""
    if type(p).__name__ == "DTensor" or is_partitioned(p) or not _dense(p):
        return torch.empty(full_shape(p), dtype=p.dtype, device="meta")
    return torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="meta")


class TraceError(Exception):
    """The forward could not be run."""


def trace_uses(
    module: nn.Module, names: Callable[[], dict[str, torch.Tensor]], args: tuple, kwargs: dict
) -> dict[str, Use]:
    """One forward of ``module(*args, **kwargs)`` on stand-ins that hold no values (see the module's
    docstring); for each parameter (``names()``: name → parameter, ties once) what it did."""
    params = names()
    meta = {id(p): _stand_in(p) for p in params.values()}
    state = {
        n: meta.setdefault(id(p), _stand_in(p)) for n, p in module.named_parameters(remove_duplicate=False)
    }
    state.update({n: _stand_in(b) for n, b in module.named_buffers(remove_duplicate=False)})
    recorder = _Recorder({n: meta[id(p)] for n, p in params.items()})
    modes = {m: m.training for m in module.modules()}
    # forward hooks (FSDP's gathers, a monitor's records) are not part of what the parameters are
    hooks = {m: _take_hooks(m) for m in module.modules()}
    try:
        module.eval()
        with torch.no_grad(), recorder:
            functional_call(module, state, _to_cpu(args), _to_cpu(kwargs), tie_weights=False, strict=False)
    except Exception as e:  # a forward that needs what zeros cannot give
        raise TraceError(f"the forward failed on value-free stand-ins ({_line(e)})") from None
    finally:
        for m, training in modes.items():
            m.training = training
        for m, saved in hooks.items():
            for attr, value in saved.items():
                setattr(m, attr, value)
    return recorder.uses


_HOOKS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def _take_hooks(m: nn.Module) -> dict:
    saved = {attr: getattr(m, attr) for attr in _HOOKS if hasattr(m, attr)}
    for attr, value in saved.items():
        setattr(m, attr, type(value)())
    return saved


def _line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:100]}" if str(e) else type(e).__name__
