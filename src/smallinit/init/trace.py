"""How one forward uses each parameter: which of its axes a matmul, linear, conv or grouped matmul
contracts with the input, whether it is looked up (an embedding), added (a bias) or only used
element-wise (a parameter of its own kind), recorded op by op at the ATen level.

A tensor is followed back to its parameter by its storage: a view (transpose, reshape, select, expand,
a slice of a fused tensor) shares it, and its strides say which parameter axis each of its dimensions
is. Copies (casts, clone, gathers of experts) are followed explicitly. The forward runs on the meta
device for a model on meta; a materialised model runs its real forward on a few tokens with every
matmul and conv replaced by zeros of its output's shape, so the cost does not grow with the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


@dataclass
class Use:
    """What the forward did with one parameter."""

    contracted: set[tuple[int, ...]] = field(default_factory=set)  # parameter axes contracted together
    lookup: bool = False  # rows gathered by integer indices (an embedding table)
    added: bool = False  # a bias: added to a matmul's or a conv's output, or passed as its bias
    ops: set[str] = field(default_factory=set)  # every other op it flowed into


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _map_axes(t: torch.Tensor, base: torch.Tensor, base_axes: list[int | None]) -> list[int | None]:
    """For each dim of ``t`` (a view of ``base``'s storage) the parameter axis it runs along, or None."""
    axes: list[int | None] = []
    for d in range(t.dim()):
        size, stride = t.shape[d], t.stride(d)
        hits = [j for j in range(base.dim()) if base.stride(j) == stride and base.shape[j] > 1]
        if size == 1 or stride == 0 or len(hits) != 1 or size > base.shape[hits[0]]:
            axes.append(None)  # broadcast, merged with another axis or ambiguous: not one parameter axis
        else:
            axes.append(base_axes[hits[0]])
    return axes


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

    def __init__(self, params: dict[str, torch.Tensor], skip_products: bool = False):
        super().__init__()
        self.skip_products = skip_products
        # storage → (name, the tensor whose strides define the axes, its parameter axes)
        self.bases: dict[int, tuple[str, torch.Tensor, list[int | None]]] = {
            _key(t): (name, t, list(range(t.dim()))) for name, t in params.items()}
        self.uses = {name: Use() for name in params}
        self.products: set[int] = set()  # storages of matmul / conv outputs

    def axes(self, t) -> tuple[str, list[int | None]] | None:
        if not isinstance(t, torch.Tensor):
            return None
        found = self.bases.get(_key(t))
        if found is None:
            return None
        name, base, base_axes = found
        return name, _map_axes(t, base, base_axes)

    def _product(self, func, args, kwargs):
        """Zeros shaped like a matmul's or conv's output: the record needs which axes are contracted, not
        the values, so a real forward on a large model costs no more than its elementwise ops."""
        if func not in self.CONTRACT and func not in (aten.linear.default, aten.convolution.default):
            return None
        try:
            shape = func(*_to_meta(args), **_to_meta(kwargs))
        except Exception:  # no meta kernel: compute it
            return None
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        return torch.zeros(shape.shape, dtype=shape.dtype, device=device)

    def _contract(self, t, dim: int) -> None:
        got = self.axes(t)
        if got is not None and t.dim() >= 2:
            name, axes = got
            axis = axes[dim % t.dim()]
            self.uses[name].contracted.add(() if axis is None else (axis,))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self._product(func, args, kwargs) if self.skip_products else None
        if out is None:
            out = func(*args, **kwargs)
        # tensors sit at the top level of an op's arguments or in one list (cat, stack, index)
        flat = [b for a in (*args, *kwargs.values()) for b in (a if isinstance(a, (list, tuple)) else (a,))]
        tracked = [a for a in flat if isinstance(a, torch.Tensor) and self.axes(a) is not None]
        if func in self.CONTRACT or func in (aten.linear.default, aten.convolution.default):
            if isinstance(out, torch.Tensor):
                self.products.add(_key(out))
        if not tracked:
            return out
        if func in self.CONTRACT:
            for i, dim in self.CONTRACT[func]:
                self._contract(args[i], dim)
            bias = self.BIAS_ARG.get(func)
            if bias is not None and self.axes(args[bias]) is not None:
                self.uses[self.axes(args[bias])[0]].added = True
        elif func is aten.linear.default:
            self._contract(args[1], -1)
            if len(args) > 2 and self.axes(args[2]) is not None:
                self.uses[self.axes(args[2])[0]].added = True
        elif func is aten.convolution.default:
            w = self.axes(args[1])
            if w is not None:  # (out, in / groups, *kernel); transposed: no one input axis
                name, axes = w
                ins = () if args[6] else tuple(a for a in axes[1:] if a is not None)
                self.uses[name].contracted.add(ins)
            if args[2] is not None and self.axes(args[2]) is not None:
                self.uses[self.axes(args[2])[0]].added = True
        elif func is aten.embedding.default:
            got = self.axes(args[0])
            if got is not None:
                self.uses[got[0]].lookup = True
        elif func in self.COPIES or func in (aten.index.Tensor, aten.index_select.default):
            got = self.axes(args[0])
            if got is not None and isinstance(out, torch.Tensor) and _key(out) not in self.bases:
                name, axes = got
                if func not in self.COPIES:
                    self.uses[name].lookup = True
                if func is aten.index.Tensor:  # w[idx] (experts gathered per token): idx's dims, then the rest
                    idx = args[1]
                    one = len(idx) == 1 and idx[0] is not None
                    axes = [None] * idx[0].dim() + axes[1:] if one else [None] * out.dim()
                self.bases[_key(out)] = (name, out, axes if len(axes) == out.dim() else [None] * out.dim())
        elif func in (aten.add.Tensor, aten.add_.Tensor) and len(tracked) == 1 and any(
                isinstance(a, torch.Tensor) and _key(a) in self.products for a in args):
            self.uses[self.axes(tracked[0])[0]].added = True  # a bias added to a matmul's output
        elif not func._schema.is_mutable and not _is_view(func):
            for a in tracked:
                self.uses[self.axes(a)[0]].ops.add(func.__name__.split(".")[0])
        return out


def _is_view(func) -> bool:
    return any(r.alias_info is not None for r in func._schema.returns)


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x, device="meta")
    if isinstance(x, dict):
        return {k: _to_meta(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(v) for v in x)
    return x


class TraceError(Exception):
    """The forward could not be run (neither on meta nor for real)."""


def trace_uses(
    module: nn.Module, names: Callable[[], dict[str, torch.Tensor]], args: tuple, kwargs: dict
) -> dict[str, Use]:
    """One forward of ``module(*args, **kwargs)``; for each parameter (``names()``: name → parameter,
    ties once) what it did. Runs on meta, or for real when values steer the forward."""
    params = names()
    if not any(p.is_meta for p in params.values()):
        return _run(module, _Recorder(params, skip_products=True), args, kwargs)
    meta = {id(p): torch.empty_like(p, device="meta") for p in params.values()}
    state = {n: meta[id(p)] for n, p in module.named_parameters(remove_duplicate=False)}
    state.update({n: _to_meta(b) for n, b in module.named_buffers(remove_duplicate=False)})
    recorder = _Recorder({n: meta[id(p)] for n, p in params.items()})
    try:
        with torch.no_grad(), recorder:
            functional_call(module, state, _to_meta(args), _to_meta(kwargs), tie_weights=False, strict=False)
    except Exception as e:  # control flow that needs values (a mask check, token routing)
        raise TraceError(f"the forward cannot run on the meta device ({_line(e)})") from None
    return recorder.uses


def _line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:100]}" if str(e) else type(e).__name__


def _run(module: nn.Module, recorder: _Recorder, args: tuple, kwargs: dict) -> dict[str, Use]:
    """The real forward, in eval mode (restored after), matmuls replaced by zeros of their shape."""
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with torch.no_grad(), recorder:
            module(*args, **kwargs)
        return recorder.uses
    except Exception as e:
        raise TraceError(f"the forward failed ({_line(e)})") from None
    finally:
        for m, training in modes.items():
            m.training = training
