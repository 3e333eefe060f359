"""What each branch adds to the residual stream, found from one forward rather than from module names: the
norms whose output is added (Gemma 2/3's sandwich norms, OLMo 2's post-norms), the matrices whose output is
added (the output projections, which per-role scales address) and how many additions the forward makes.

The γ rule balances the residual stream by the scale of what each branch adds: at γ = 1 a branch's
output is about as large as the embedding. A norm right before the residual add renormalises that output
to its weight's scale (1 at init) whatever γ, so the balance the rule sets is undone there.

The forward is followed op by op: the residual stream starts at the embedding lookup's output and goes on
through every addition it takes part in (and casts, copies and scalings by one number, such as Gemma's √d);
a norm's output that is added to it, while not itself the stream, is a branch's renormalised output.
Beside it, every activation carries the matrices that made it: a contraction with a weight (or a view, cast
or slice of one) is made by that weight; an op of one operand (a view, a sum) passes on what made it; an op
of several passes on what made those of its own shape (a broadcast factor, such as a norm's rsqrt or a
router's weight, only scales it), and scatters pass on what made each part. What made an addend of the
stream writes into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from smallinit.init.roles import _example_inputs, is_norm

aten = torch.ops.aten
_ADDS = {aten.add.Tensor, aten.add_.Tensor}
_SAME = {aten._to_copy.default, aten.clone.default, aten.mul.Tensor, aten.div.Tensor}
_CONTRACTIONS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.convolution.default,
    aten._grouped_mm.default,
}
_SCATTERS = {
    aten.index_copy.default,
    aten.index_copy_.default,
    aten.index_add.default,
    aten.index_add_.default,
    aten.scatter_add.default,
    aten.scatter_add_.default,
    aten.index_put.default,
    aten.index_put_.default,
}


def _key(t) -> int | None:
    return t.untyped_storage()._cdata if isinstance(t, torch.Tensor) else None


@dataclass(frozen=True)
class StreamTrace:
    """What one forward adds to the residual stream."""

    renormalised: list[str]  # norms whose output a branch adds, in forward order
    writers: list[str]  # weights whose contraction a branch adds (the output projections), in forward order
    additions: int  # the branch outputs added to the stream: 2 per block of a transformer


class _Stream(TorchDispatchMode):
    def __init__(self, norm_outputs: dict[int, str], weights: dict[int, str]):
        super().__init__()
        self.norm_outputs = norm_outputs
        self.weights = dict(weights)  # storage → the parameter it is (or a view, cast or slice of)
        self.made_by: dict[int, frozenset[str]] = {}
        self.stream: set[int] = set()
        self.alive: list[torch.Tensor] = []  # storages stay allocated, so their ids are not reused
        self.found: dict[str, None] = {}
        self.writers: dict[str, None] = {}
        self.additions = 0

    def mark(self, t) -> None:
        if isinstance(t, torch.Tensor):
            self.stream.add(_key(t))
            self.alive.append(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        keys = [_key(a) for a in args[:2]]
        if func is aten.embedding.default:
            self.mark(out)
        elif func in _ADDS and any(k in self.stream for k in keys):
            other = keys[1] if keys[0] in self.stream else keys[0]
            if other not in self.stream and other in self.norm_outputs:
                self.found[self.norm_outputs[other]] = None
            if other not in self.stream and self.made_by.get(other):
                self.writers.update(dict.fromkeys(sorted(self.made_by[other])))
                self.additions += 1
            self.mark(out)
            return out
        elif (
            func in _SAME
            and keys[0] in self.stream
            and (len(args) < 2 or not isinstance(args[1], torch.Tensor) or args[1].numel() == 1)
        ):
            self.mark(out)
            return out
        self.trace(func, args, kwargs or {}, out)
        return out

    def trace(self, func, args, kwargs, out) -> None:
        """Which weights made ``out``: see the module docstring."""
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        values = [a for a in ins if a.is_floating_point()]
        if not outs or not values:
            return
        weights = [self.weights[_key(a)] for a in values if _key(a) in self.weights]
        if len(weights) == len(values):  # a view, cast or slice of a weight is that weight
            for o in outs:
                self.weights[_key(o)] = weights[0]
                self.alive.append(o)
            return
        if func in _CONTRACTIONS and any(a.dim() >= 2 and _key(a) in self.weights for a in values):
            made = frozenset(
                self.weights[_key(a)] for a in values if a.dim() >= 2 and _key(a) in self.weights
            )
        else:
            shape = outs[0].shape
            made = frozenset().union(
                *(
                    self.made_by.get(_key(a), frozenset())
                    for a in values
                    if func in _SCATTERS or a.shape == shape or len(values) == 1
                )
            )
        if made:
            for o in outs:
                self.made_by[_key(o)] = made
                self.alive.append(o)


@torch.no_grad()
def trace_stream(module: nn.Module, example_inputs=None) -> StreamTrace | None:
    """What the branches of ``module`` add to its residual stream, from one forward; None when no forward could
    be run (no inputs known, or it failed)."""
    inputs = _example_inputs(module, example_inputs)
    if inputs is None or any(type(p).__name__ == "DTensor" for p in module.parameters()):
        return None  # a sharded forward would need every rank: not run
    args, kwargs = inputs
    norm_outputs: dict[int, str] = {}
    keep: list[torch.Tensor] = []

    def hook(name):
        def record(_mod, _args, out):
            t = out[0] if isinstance(out, (tuple, list)) and out else out
            if isinstance(t, torch.Tensor):
                norm_outputs[_key(t)] = name
                keep.append(t)

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in module.named_modules() if is_norm(m) and n]
    modes = {m: m.training for m in module.modules()}
    meta = any(p.is_meta for p in module.parameters())
    state = {
        n: torch.empty_like(t, device="meta") if meta else t
        for named in (module.named_parameters, module.named_buffers)
        for n, t in named(remove_duplicate=False)
    }
    names = dict(module.named_parameters())  # tied parameters under their first name
    first = {id(p): n for n, p in reversed(list(names.items()))}
    params = dict(module.named_parameters(remove_duplicate=False))
    weights = {_key(state[n]): first[id(p)] for n, p in params.items()}
    recorder = _Stream(norm_outputs, weights)
    try:
        module.eval()
        with recorder:
            if meta:
                functional_call(module, state, _meta(args), _meta(kwargs), tie_weights=False, strict=False)
            else:
                module(*args, **kwargs)
    except Exception:  # a forward that needs values, or inputs this model does not take: not known
        return None
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    return StreamTrace(list(recorder.found), list(recorder.writers), recorder.additions)


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x, device="meta")
    if isinstance(x, dict):
        return {k: _meta(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_meta(v) for v in x)
    return x


def branch_note(norms: list[str]) -> str:
    """The one line the init report and ``init-hf`` print."""
    return (
        f"note: {len(norms)} norms (first: {norms[0]}) renormalise a branch's output right before it is added "
        "to the residual stream: each layer adds a scale-1 update whatever γ, so γ sets the embedding's scale "
        "but not the layers' updates (docs/choosing-gamma.md, 'Architectures that renormalise each branch')"
    )
