"""The matrices that write into the residual stream (attention and MLP output projections), found from one
forward rather than from names: the product ``x + W(…)`` adds to a tensor of its own shape that no matrix
made. Depth-scaled inits (GPT-2's 0.02/√(2L)) scale exactly these.

Each tensor the forward makes is tagged with the last matrix it came from (any op on a parameter of two or
more axes other than an embedding lookup: F.linear, GPT-2's Conv1D ``addmm``, fused experts), through any op with one tagged input; an addition of a tagged tensor to an untagged one of the
same shape is a residual add, and its result is the stream again (untagged).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from smallinit.init.norm_calls import run_forward

_ADDS = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.__iadd__}
_ADDS |= {torch.Tensor.add_}


class _Writers(TorchFunctionMode):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.tags: dict[int, tuple[str, torch.Tensor]] = {}  # id(tensor) → (matrix, the tensor, kept alive)
        self.found: dict[str, None] = {}
        self.stream: dict[int, torch.Tensor] = {}  # id → tensor (kept alive)

    def tag(self, t) -> str | None:
        entry = self.tags.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[0] if entry is not None and entry[1] is t else None

    def in_stream(self, t) -> bool:
        return isinstance(t, torch.Tensor) and self.stream.get(id(t)) is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            return out
        flat = [x for a in (*args, *kwargs.values()) for x in (a if isinstance(a, (tuple, list)) else (a,))]
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        # a product with a weight matrix (F.linear, Conv1D's addmm, fused experts' matmul); a lookup is not one
        weight = next((t for t in tensors if t.dim() >= 2 and id(t) in self.names), None)
        if func is F.embedding:
            self.stream[id(out)] = out
            return out
        if weight is not None:
            self.tags[id(out)] = (self.names[id(weight)], out)
            return out
        tagged = [(t, name) for t in tensors if (name := self.tag(t)) is not None]
        if func in _ADDS and len(tensors) == 2 and len(tagged) == 1:
            other = tensors[1] if tensors[0] is tagged[0][0] else tensors[0]
            if self.in_stream(other) and other.shape == tagged[0][0].shape == out.shape:
                self.found[tagged[0][1]] = None
                self.tags.pop(id(out), None)
                self.stream[id(out)] = out
                return out
        shaped = {
            name for t, name in tagged if t.shape == out.shape
        }  # a product's tag: the factor of its shape
        if len({name for _, name in tagged}) == 1 or len(shaped) == 1:
            self.tags[id(out)] = (tagged[0][1] if len(shaped) != 1 else shaped.pop(), out)
        elif not tagged and any(self.in_stream(t) for t in tensors):
            self.stream[id(out)] = out
        return out


@torch.no_grad()
def residual_writers(module: nn.Module, example_inputs=None) -> tuple[list[str], str | None]:
    """The names of the matrices whose output is added to the residual stream, in forward order; where no
    forward could be run, none and why in one line."""
    writers = _Writers(module)
    why = run_forward(module, example_inputs, writers)
    return ([], why) if why else (list(writers.found), None)
