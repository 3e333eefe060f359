"""Norms whose output is what a branch adds to the residual stream (Gemma 2/3's sandwich norms, OLMo 2's
post-norms), found from one forward rather than from module names.

The γ rule balances the residual stream by the scale of what each branch adds: at γ = 1 a branch's
output is about as large as the embedding. A norm right before the residual add renormalises that output
to its weight's scale (1 at init) whatever γ, so the balance the rule sets is undone there.

The forward is followed op by op: the residual stream starts at the embedding lookup's output and goes on
through every addition it takes part in (and casts, copies and scalings by one number, such as Gemma's √d);
a norm's output that is added to it, while not itself the stream, is a branch's renormalised output.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode

from smallinit.init.roles import _example_inputs, is_norm

aten = torch.ops.aten
_ADDS = {aten.add.Tensor, aten.add_.Tensor}
_SAME = {aten._to_copy.default, aten.clone.default, aten.mul.Tensor, aten.div.Tensor}


def _key(t) -> int | None:
    return t.untyped_storage()._cdata if isinstance(t, torch.Tensor) else None


class _Stream(TorchDispatchMode):
    def __init__(self, norm_outputs: dict[int, str]):
        super().__init__()
        self.norm_outputs = norm_outputs
        self.stream: set[int] = set()
        self.alive: list[torch.Tensor] = []  # storages stay allocated, so their ids are not reused
        self.found: dict[str, None] = {}

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
            self.mark(out)
        elif (
            func in _SAME
            and keys[0] in self.stream
            and (len(args) < 2 or not isinstance(args[1], torch.Tensor) or args[1].numel() == 1)
        ):
            self.mark(out)
        return out


@torch.no_grad()
def renormalised_branches(module: nn.Module, example_inputs=None) -> list[str] | None:
    """Names of the norms whose output a branch adds to the residual stream, in forward order; None when no
    forward could be run (no inputs known, or it failed)."""
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
    recorder = _Stream(norm_outputs)
    try:
        module.eval()
        with recorder:
            if any(p.is_meta for p in module.parameters()):
                state = {
                    n: torch.empty_like(t, device="meta")
                    for named in (module.named_parameters, module.named_buffers)
                    for n, t in named(remove_duplicate=False)
                }
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
    return list(recorder.found)


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
