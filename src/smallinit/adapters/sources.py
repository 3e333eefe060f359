"""Which rows of which weight matrix each tensor of a forward is made of, followed from the matrix's product, so
that where the queries, keys and values of an attention call are rows of one matrix (a fused qkv, in blocks,
interleaved by head, or parts of unequal size) those rows are known: the matrix's parts. The adapters that read a
model from outside (traced.py, hf.py) feed it the calls of one forward."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode


class Sources:
    """Which rows of which weight matrix (out × in) each tensor of the forward is made of, followed from the
    matrix's product through views (rows read off the strides), splits and element-wise steps (position
    encoding, per-head norms) for a few ops; at an attention call, a matrix whose rows make the queries, keys
    and values alike is a fused one, and its parts are those rows (any layout: blocks or interleaved heads)."""

    DEPTH = 24  # ops a source is followed through: enough for position encoding, not the whole network

    def __init__(self, model: nn.Module, following: bool = True):
        self.model, self.following = model, following
        self.names = {id(p): n for n, p in model.named_parameters()}
        # storage → (matrix name, rows of a product's output (None: read them off the view's strides) or
        # the rows a derived tensor is made of, the product's width, ops since the product)
        self.seen: dict[int, tuple[str, torch.Tensor | None, int, int]] = {}
        self.parts: dict[str, dict[str, torch.Tensor]] = {}
        # matrices that make q, k and v alike, from rows followed as overlapping: recorded whole
        self.unsplit: set[str] = set()
        self.scores: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # matrix → rows of eager q and k
        self.alive: list[torch.Tensor] = []  # what is followed stays alive, so no storage is reused meanwhile

    def follow(self, func, args, kwargs, out) -> None:
        if not self.following:
            return
        weight = None
        if func is F.linear and len(args) > 1:
            weight = args[1]
        elif func is torch.addmm and len(args) > 2:  # GPT-2's Conv1D: x @ W, W stored (in, out)
            weight = args[2]
        elif func in self.MATMUL and len(args) > 1:  # x @ W.T written out (Falcon's FalconLinear)
            weight = transposed_parameter(args[1])
        if isinstance(weight, nn.Parameter) and id(weight) not in self.names:
            # FSDP2 swaps a block's unsharded parameters in for its forward: the names are those of now
            self.names = {id(p): n for n, p in self.model.named_parameters()}
        if (
            isinstance(weight, nn.Parameter)
            and id(weight) in self.names
            and isinstance(out, torch.Tensor)
            and _storage(out) is not None
        ):
            self.seen[_storage(out)] = (self.names[id(weight)], None, int(out.shape[-1]), 0)
            self.alive.append(out)
            return
        found = [src for t in _tensors(args, kwargs) if (src := self.source(t)) is not None]
        if not found or len({name for name, _, _ in found}) != 1 or min(d for *_, d in found) >= self.DEPTH:
            return
        name, depth = found[0][0], min(d for *_, d in found) + 1
        rows = torch.unique(torch.cat([r for _, r, _ in found]))
        of = self.row_of(args[0]) if func in self.SELECT else None
        if of is not None:  # a copy of some elements of a product: the rows of those elements only
            rows = torch.unique(func(of, *args[1:], **kwargs))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and _storage(o) not in self.seen and _storage(o) is not None:
                self.seen[_storage(o)] = (name, rows, 0, depth)
                self.alive.append(o)

    def source(self, t: torch.Tensor) -> tuple[str, torch.Tensor, int] | None:
        """(matrix name, the rows of it ``t`` is made of, ops since its product)."""
        key = _storage(t)
        entry = None if key is None else self.seen.get(key)
        if entry is None:
            return None
        name, rows, width, depth = entry
        if rows is None:  # a view of the product: the rows its elements sit at
            rows = torch.unique(_rows(t, width))
        return name, rows, depth

    def row_of(self, t: torch.Tensor) -> torch.Tensor | None:
        """For a view of a product, the row each element of ``t`` sits at (a tensor shaped as ``t``); None for
        anything else (a derived tensor's rows are known as a set only)."""
        entry = self.seen.get(_storage(t)) if isinstance(t, torch.Tensor) else None
        return None if entry is None or entry[1] is not None else _rows(t, entry[2]).expand(t.shape)

    SELECT = {torch.Tensor.__getitem__, torch.index_select, torch.Tensor.index_select}  # copies of elements
    MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm}
    BADDBMM = {torch.baddbmm, torch.Tensor.baddbmm}  # bias + q·kᵀ in one call (Bloom's ALiBi)

    def products(self, func, args, kwargs) -> None:
        """Eager attention's two products: scores q·kᵀ of one matrix's rows (kept by matrix), then the weights
        times v, whose rows of the same matrix, with the scores', are the attention's inputs."""
        if func in self.BADDBMM:
            operands = [*args[1:3], *(kwargs[k] for k in ("batch1", "batch2") if k in kwargs)]
        else:
            operands = list(args[:2])
        if not self.following or func not in self.MATMUL | self.BADDBMM or len(operands) < 2:
            return
        a, b = (self.source(t) if isinstance(t, torch.Tensor) else None for t in operands)
        if b is not None and b[0] in self.scores:  # the weights (made of the scores) times v
            q, k = self.scores.pop(b[0])
            self._fused(b[0], [q, k, b[1]])
        elif a is not None and b is not None and a[0] == b[0]:
            self.scores[a[0]] = (a[1], b[1])

    def attention_inputs(self, q, k, v) -> None:
        if not self.following:
            return
        found = [self.source(t) if isinstance(t, torch.Tensor) else None for t in (q, k, v)]
        if any(f is None for f in found) or len({f[0] for f in found}) != 1:
            return
        self._fused(found[0][0], [f[1] for f in found])

    def known(self, weight: torch.Tensor, rows: torch.Tensor) -> None:
        """The parts of a fused matrix read off the call that uses it: ``rows`` (3, n), those of q, k and v."""
        if self.following and id(weight) in self.names:
            self._fused(self.names[id(weight)], list(rows))

    def _fused(self, name: str, rows: list[torch.Tensor]) -> None:
        if sum(len(r) for r in rows) == len(torch.unique(torch.cat(rows))):  # disjoint: one fused matrix
            self.parts[name] = dict(zip("qkv", rows))
        else:
            self.unsplit.add(name)


def transposed_parameter(t: Any) -> nn.Parameter | None:
    """The parameter W when ``t`` is W.T (a 2-D transposed view of it), else None."""
    base = getattr(t, "_base", None)
    if not isinstance(base, nn.Parameter) or base.dim() != 2 or t.dim() != 2:
        return None
    same = t.shape == base.shape[::-1] and t.stride() == base.stride()[::-1]
    return base if same and t.data_ptr() == base.data_ptr() else None


def _rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """The row of a product (…, width) that each element of its view ``t`` sits at, read off the strides,
    broadcastable to ``t``: size 1 along a dimension that steps whole rows (tokens, batch), so it stays small."""
    index = torch.tensor(t.storage_offset())
    for size, stride in zip(t.shape, t.stride()):
        index = index[..., None] + (
            torch.arange(size) * stride if stride % width else torch.zeros(1, dtype=torch.long)
        )
    return index % width


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (NotImplementedError, RuntimeError):  # a tensor without storage (vmap's, a fake or sparse one)
        return None


def _tensors(args, kwargs) -> list[torch.Tensor]:
    flat = [*args, *kwargs.values()]
    flat += [x for a in args if isinstance(a, (tuple, list)) for x in a]
    return [t for t in flat if isinstance(t, torch.Tensor)]


class Following(TorchFunctionMode):
    """While inside, the calls of a forward feed ``sources``: its products, what follows from them, and each
    ``scaled_dot_product_attention``'s q, k and v (for an adapter that records attention some other way)."""

    def __init__(self, sources: Sources):
        super().__init__()
        self.sources = sources

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            q, k, v = (*args, *(kwargs.get(n) for n in ("query", "key", "value")[len(args) :]))[:3]
            self.sources.attention_inputs(q, k, v)
        self.sources.products(func, args, kwargs)
        self.sources.follow(func, args, kwargs, out)
        return out


def run_eagerly() -> contextlib.AbstractContextManager:
    """Compiled code run eagerly inside; nothing to do where torch.compile was never imported."""
    return (
        torch.compiler.set_stance("force_eager")
        if "torch._dynamo" in sys.modules
        else contextlib.nullcontext()
    )
