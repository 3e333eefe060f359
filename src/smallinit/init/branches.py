"""What each branch adds to the residual stream, found from one forward rather than from module names: the
matrices whose output is added (the output projections, which per-role scales and the audit address), the
norms whose output is added (Gemma 2/3's sandwich norms, OLMo 2's post-norms) and how many additions the
forward makes.

The γ rule balances the residual stream by the scale of what each branch adds: at γ = 1 a branch's
output is about as large as the embedding. A norm right before the residual add renormalises that output
to its weight's scale (1 at init) whatever γ, so the balance the rule sets is undone there.

The forward is followed call by call (a torch function mode, so a norm the forward calls as ``F.rms_norm`` is
a call like any other): each tensor it makes is tagged with the matrices it last came from (any op on a parameter
of two or more axes other than an embedding lookup or an addition: F.linear, GPT-2's Conv1D ``addmm``, a fused
expert's slice; a fused experts' bias, GPT-OSS's ``down_proj_bias[e]`` of shape (1, d), is added, not contracted),
through any op: those of its inputs of the output's shape (a norm's rsqrt or a router's weight only scales it;
a sum of routed and shared experts is made by both), or of all its inputs where none has that shape (a
reduction, a scatter). The residual stream starts at the embedding lookup's output and goes on
through every op with no tagged input (a cast, Gemma's √d, nanochat's norm of the embedding); an addition of a
tagged tensor to the stream, of the same shape, is a branch's output written into it, and its result is the
stream again, unless it is known to come from other lookups than the stream: each tensor carries the lookups it
comes from (where an op returning several tensors leaves that unknown), so a matrix applied to one lookup and added
to another (OPT's project_in of the token embedding plus the position embedding) makes the stream's start, not a
branch. A norm module's output so added is a renormalised branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from smallinit.init.norm_calls import run_forward
from smallinit.init.roles import is_norm

_ADDS = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.__iadd__}
_ADDS |= {torch.Tensor.add_}


@dataclass(frozen=True)
class StreamTrace:
    """What one forward adds to the residual stream."""

    renormalised: list[str]  # norms whose output a branch adds, in forward order
    writers: list[str]  # weights whose contraction a branch adds (the output projections), in forward order
    additions: int  # the branch outputs added to the stream: 2 per block of a transformer


class _Stream(TorchFunctionMode):
    def __init__(self, model: nn.Module):
        super().__init__()
        # id → (the parameter's name, the tensor): each parameter (tied ones under their first name), and the
        # views, casts and slices of it the forward takes (a fused expert's w[e], its transpose)
        self.weights: dict[int, tuple[str, torch.Tensor]] = {
            id(p): (n, p) for n, p in model.named_parameters()
        }
        # id(tensor) → (the matrices that made it, the tensor, kept alive)
        self.tags: dict[int, tuple[frozenset[str], torch.Tensor]] = {}
        self.stream: dict[int, torch.Tensor] = {}  # id → tensor (kept alive)
        # id → (the embedding lookups, by number, a stream or tagged tensor comes from; the tensor)
        self.lookups: dict[int, tuple[frozenset[int], torch.Tensor]] = {}
        self.norm_outputs: dict[int, tuple[str, torch.Tensor]] = {}  # id → (norm module, its output)
        self.writers: dict[str, None] = {}
        self.renormalised: dict[str, None] = {}
        self.additions = 0

    def tag(self, t) -> frozenset[str]:
        entry = self.tags.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[0] if entry is not None and entry[1] is t else frozenset()

    def weight(self, t) -> str | None:
        entry = self.weights.get(id(t)) if isinstance(t, torch.Tensor) else None
        return entry[0] if entry is not None and entry[1] is t else None

    def in_stream(self, t) -> bool:
        return isinstance(t, torch.Tensor) and self.stream.get(id(t)) is t

    def origins(self, tensors) -> frozenset[int]:
        found = [
            entry[0] for t in tensors if (entry := self.lookups.get(id(t))) is not None and entry[1] is t
        ]
        return frozenset().union(*found)

    def made(self, out: torch.Tensor, lookups: frozenset[int], *, stream: bool) -> None:
        """``out`` is the stream (or a branch's tensor, tagged by the caller), from ``lookups``."""
        if stream:
            self.stream[id(out)] = out
        self.lookups[id(out)] = (lookups, out)

    def norm_output(self, name: str):
        def record(_mod, _args, out):
            t = out[0] if isinstance(out, (tuple, list)) and out else out
            if isinstance(t, torch.Tensor):
                self.norm_outputs[id(t)] = (name, t)

        return record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            return out
        flat = [x for a in (*args, *kwargs.values()) for x in (a if isinstance(a, (tuple, list)) else (a,))]
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        if func is F.embedding:
            self.made(out, frozenset({len(self.lookups)}), stream=True)
            return out
        floats = [self.weight(t) for t in tensors if t.is_floating_point()]
        if floats and all(floats):  # a view, cast or slice of a weight is that weight
            self.weights[id(out)] = (floats[0], out)
            return out
        # a product with a weight matrix (F.linear, Conv1D's addmm, a fused expert's w[e]); a lookup is not one,
        # nor a bias added
        weight = next((name for t in tensors if t.dim() >= 2 and (name := self.weight(t))), None)
        weight = None if func in _ADDS else weight
        lookups = self.origins(tensors)
        if weight is not None:
            self.tags[id(out)] = (frozenset({weight}), out)
            self.made(out, lookups, stream=False)
            return out
        tagged = [(t, made) for t in tensors if (made := self.tag(t))]
        if func in _ADDS and len(tensors) == 2 and len(tagged) == 1:
            branch, made = tagged[0]
            other = tensors[1] if tensors[0] is branch else tensors[0]
            if self.in_stream(other) and other.shape == branch.shape == out.shape:
                self.tags.pop(id(out), None)
                self.made(out, lookups, stream=True)
                made_from = self.origins([branch])  # empty where a tuple-valued op (split, chunk) lost them
                if not made_from or made_from & self.origins([other]):  # x + f(x): a branch writes into x
                    self.writers.update(dict.fromkeys(sorted(made)))
                    self.additions += 1
                    norm = self.norm_outputs.get(id(branch))
                    if norm is not None and norm[1] is branch:
                        self.renormalised[norm[0]] = None
                return out  # else a projection of one lookup added to another: the stream's start
        shaped = [made for t, made in tagged if t.shape == out.shape] or [made for _, made in tagged]
        if shaped:
            self.tags[id(out)] = (frozenset().union(*shaped), out)
            self.made(out, lookups, stream=False)
        elif any(self.in_stream(t) for t in tensors):
            self.made(out, lookups, stream=True)
        return out


@torch.no_grad()
def stream_trace(module: nn.Module, example_inputs=None) -> tuple[StreamTrace | None, str | None]:
    """What the branches of ``module`` add to its residual stream, from one forward (``example_inputs`` as for
    gamma_init_; a model with an embedding table is otherwise given a row of token ids); where no forward could
    be run, None and why in one line."""
    recorder = _Stream(module)
    handles = [
        m.register_forward_hook(recorder.norm_output(n))
        for n, m in module.named_modules()
        if is_norm(m) and n
    ]
    try:
        why = run_forward(module, example_inputs, recorder)
    finally:
        for h in handles:
            h.remove()
    if why:
        return None, why
    return StreamTrace(list(recorder.renormalised), list(recorder.writers), recorder.additions), None


def trace_stream(module: nn.Module, example_inputs=None) -> StreamTrace | None:
    """:func:`stream_trace` without the why: None when no forward could be run."""
    return stream_trace(module, example_inputs)[0]


def residual_writers(module: nn.Module, example_inputs=None) -> tuple[list[str], str | None]:
    """The names of the matrices whose output is added to the residual stream, in forward order; where no
    forward could be run, none and why in one line."""
    trace, why = stream_trace(module, example_inputs)
    return ([], why) if trace is None else (trace.writers, None)


def branch_note(norms: list[str]) -> str:
    """The one line the init report and ``init-hf`` print."""
    return (
        f"note: {len(norms)} norms (first: {norms[0]}) renormalise a branch's output right before it is added "
        "to the residual stream: each layer adds a scale-1 update whatever γ, so γ sets the embedding's scale "
        "but not the layers' updates (docs/choosing-gamma.md, 'Architectures that renormalise each branch')"
    )
