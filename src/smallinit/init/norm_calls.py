"""Norms that are calls, not modules: ``F.rms_norm`` / ``F.layer_norm`` made outside any norm layer (nanochat
and modded-nanogpt write ``F.rms_norm(x, (x.size(-1),))``: no weight, ε the dtype's default), and
x·rsqrt(mean(x²) + ε) or x / sqrt(mean(x²) + ε) written out in a forward (a hand-written LayerNorm is one on
x − mean(x)), ε a number or a one-element tensor. No module holds them, so they are found from one forward.

A call site is named by the innermost module of the model whose forward makes it and the order in which
that module's sites first run: ``h.0:rms_norm#1`` is the second site of ``h.0``; ``where`` is the line of
that module's forward (and of a helper between). A call inside a norm layer (smallinit.init.eps.norm_layers)
belongs to that layer and is not one of these.

:class:`NormCalls` records the calls of a forward (each row's factor σ/√(σ² + ε) at the ε the call used);
:class:`FunctionalEps` sets the ε of a model's ``rms_norm`` / ``layer_norm`` calls by a forward pre-hook and
a forward hook on the model that keep a torch function mode active while (and only while) that model runs.
Torch function modes are per thread, so another model, or this one in another thread, is untouched. A
hand-written norm's ε is a number in its source, so it cannot be set: set_norm_eps_ refuses, naming it.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from smallinit.init.roles import _example_inputs, norm_layers

RMS_NORMS = {F.rms_norm, torch.rms_norm}
LAYER_NORMS = {F.layer_norm, torch.layer_norm}
_SQUARES = {torch.square, torch.Tensor.square}
_POWS = {torch.pow, torch.Tensor.pow, torch.Tensor.__pow__}
_MULS = {torch.mul, torch.Tensor.mul, torch.Tensor.__mul__}
_MEANS = {torch.mean, torch.Tensor.mean}
_ADDS = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__}
_RSQRTS = {torch.rsqrt, torch.Tensor.rsqrt, torch.sqrt, torch.Tensor.sqrt}  # x·rsqrt(…) or x / sqrt(…)
# frames of these files are not where a call is made: torch's dispatch, and this module
_SKIP = (os.path.dirname(torch.__file__), __file__)


@dataclass(frozen=True)
class NormCall:
    """One call site of a norm that no module holds. ``kind``: "rms_norm", "layer_norm" or "hand-written"
    (x·rsqrt(mean(x²) + ε) or x / sqrt(…)); ``eps`` as the call used it, ``default_eps`` when the call passed none (the
    dtype's machine epsilon, torch's default for rms_norm); ``where``: file:line of the module's forward."""

    name: str
    kind: str
    eps: float
    default_eps: bool
    where: str

    @property
    def centered(self) -> bool:
        return self.kind == "layer_norm"

    @property
    def settable(self) -> bool:
        return self.kind != "hand-written"


def _eps_argument(func, args: tuple, kwargs: dict) -> float | None:
    """The ε a call passes (None: not given)."""
    at = 3 if func in RMS_NORMS else 4
    eps = args[at] if len(args) > at else kwargs.get("eps", None if func in RMS_NORMS else 1e-5)
    return None if eps is None else float(eps)


def _with_eps(func, args: tuple, kwargs: dict, eps: float) -> tuple[tuple, dict]:
    at = 3 if func in RMS_NORMS else 4
    if len(args) > at:
        return (*args[:at], eps, *args[at + 1 :]), kwargs
    return args, {**kwargs, "eps": eps}


class _Sites:
    """Where in a model a call is made: its innermost module (by name) and the lines leading to it."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.names = {id(m): n for n, m in model.named_modules()}
        self.norm_layers = {id(m) for m in norm_layers(model).values()}
        self.order: dict[tuple, str] = {}  # (module, lines) → site name
        self.per_module: dict[str, int] = {}

    def locate(self) -> tuple[str, tuple[str, ...]] | None:
        """(module name, the file:line of each frame from the module's forward to the call), or None when
        the call is made inside a norm layer (or outside the model)."""
        lines: list[str] = []
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if not code.co_filename.startswith(_SKIP):
                lines.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno}")
            # a module's forward, torch's own layers included (nn.RMSNorm calls F.rms_norm in torch's file)
            owner = frame.f_locals.get("self") if code.co_varnames[:1] == ("self",) else None
            if owner is not None and id(owner) in self.names:
                if id(owner) in self.norm_layers:
                    return None
                return self.names[id(owner)], tuple(reversed(lines))
            frame = frame.f_back
        return None

    def name(self, kind: str, module: str, lines: tuple[str, ...]) -> str:
        key = (module, lines, kind)
        if key not in self.order:
            k = self.per_module.get(module, 0)
            self.per_module[module] = k + 1
            self.order[key] = f"{module or '<root>'}:{kind}#{k}"
        return self.order[key]


class NormCalls(TorchFunctionMode):
    """While active (``with NormCalls(model) as calls: model(...)``), every norm call of ``model`` that no
    norm layer makes is recorded: ``sites`` (name → NormCall) and ``factors`` (name → each row's factor
    σ(x)/√(σ²(x) + ε), σ² the mean square, or the variance for layer_norm, over the normalised axes; a call
    site run more than once contributes all its rows). Calls on meta tensors give sites without factors."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.where = _Sites(model)
        self.sites: dict[str, NormCall] = {}
        self.factors: dict[str, torch.Tensor] = {}
        # hand-written: by id, each tensor of an x² → mean → + ε on its way to an rsqrt: (stage, mean(x²) once
        # known, ε, the tensor). The tensors are held by weak references, so that following the forward keeps
        # nothing alive but the mean squares (one number a row): x itself may be a temporary gone by the rsqrt
        # (a hand-written LayerNorm's (x − μ).pow(2))
        self.chain: dict[int, tuple[str, torch.Tensor | None, float | None, weakref.ref]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in RMS_NORMS or func in LAYER_NORMS:
            x, shape = args[0], args[1] if len(args) > 1 else kwargs["normalized_shape"]
            eps = _eps_argument(func, args, kwargs)
            kind = "rms_norm" if func in RMS_NORMS else "layer_norm"
            self._record(kind, x, len(tuple(shape)) if not isinstance(shape, int) else 1, eps)
        elif isinstance(out, torch.Tensor):
            self._follow(func, args, kwargs, out)
        return out

    def _follow(self, func, args, kwargs, out: torch.Tensor) -> None:
        """x², then its mean over the last axis, then + ε, then rsqrt or sqrt: a hand-written RMS norm of x."""
        a = args[0] if args else None
        b = args[1] if len(args) > 1 else None
        if not isinstance(a, torch.Tensor):
            return
        step = self.chain.get(id(a))
        if step is not None and step[3]() is not a:  # an id reused by a tensor of another chain
            step = None
        two = isinstance(b, (int, float)) and b == 2
        if (func in _SQUARES) or (func in _POWS and two) or (func in _MULS and b is a):
            self.chain[id(out)] = ("square", None, None, weakref.ref(out))
        elif func in _MEANS and step is not None and step[0] == "square":
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
            if dims in ((-1,), (a.dim() - 1,)):
                self.chain[id(out)] = ("mean", out.detach(), None, weakref.ref(out))
        elif func in _ADDS and step is not None and step[0] == "mean":
            if isinstance(b, torch.Tensor) and b.numel() == 1 and not b.is_meta:  # ε held in a buffer
                b = float(b)
            if isinstance(b, (int, float)) and not isinstance(b, bool):
                self.chain[id(out)] = ("plus eps", step[1], float(b), weakref.ref(out))
        elif func in _RSQRTS and step is not None and step[0] == "plus eps":
            self._record("hand-written", step[1], 1, step[2], mean_square=True)

    def _record(
        self, kind: str, x: torch.Tensor, axes: int, eps: float | None, mean_square: bool = False
    ) -> None:
        """A call on ``x`` (or, ``mean_square``, on rows whose mean squares ``x`` holds)."""
        found = self.where.locate()
        if found is None:
            return
        name = self.where.name(kind, *found)
        default = eps is None
        if default:  # torch's rms_norm without ε: the machine epsilon of the input's dtype
            eps = float(torch.finfo(x.dtype).eps)
        if name not in self.sites:
            self.sites[name] = NormCall(name, kind, float(eps), default, " → ".join(found[1]))
        if x.is_meta:
            return
        h = x.detach().double().flatten(-axes) if axes > 1 else x.detach().double()
        if mean_square:
            var = h
        else:
            var = h.var(-1, unbiased=False) if kind == "layer_norm" else h.pow(2).mean(-1)
        f = torch.sqrt(var / (var + eps)).flatten()
        prev = self.factors.get(name)
        self.factors[name] = f if prev is None else torch.cat([prev, f])

    def __exit__(self, *exc):
        self.chain.clear()
        return super().__exit__(*exc)


def default_eps_note(sites: dict[str, NormCall]) -> str | None:
    """One line naming the calls that pass no ε, where there are any."""
    default = [s for s in sites.values() if s.default_eps]
    if not default:
        return None
    more = f" and {len(default) - 1} more" if len(default) > 1 else ""
    return (
        f"{default[0].name}{more} call {default[0].kind} with no ε: torch's default, the input dtype's machine "
        f"epsilon ({default[0].eps:.3g})"
    )


class _EpsMode(TorchFunctionMode):
    def __init__(self, sites: _Sites, eps: float):
        super().__init__()
        self.sites, self.eps = sites, eps

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in RMS_NORMS or func in LAYER_NORMS) and self.sites.locate() is not None:
            args, kwargs = _with_eps(func, args, kwargs, self.eps)
        return func(*args, **kwargs)


class FunctionalEps:
    """The ε of ``model``'s rms_norm / layer_norm calls made outside norm layers, set to ``eps`` whenever
    ``model`` runs: a forward pre-hook enters a torch function mode that passes ``eps`` to those calls, and a
    forward hook (run on exceptions too) leaves it. Applying it again replaces the pair. A copy of the model
    (copy.deepcopy, pickle) keeps it: the hooks find the calls of whichever model runs them. It is not saved
    with the weights (state_dict, safetensors): apply it again after loading."""

    def __init__(self, eps: float):
        self.eps = float(eps)
        self._sites: dict[int, _Sites] = {}  # per model running the hooks (by id); rebuilt after a copy
        self._modes: dict[int, list[_EpsMode]] = {}  # per thread, the modes entered, innermost last

    @classmethod
    def apply(cls, model: nn.Module, eps: float) -> FunctionalEps:
        for hooks in (model._forward_pre_hooks, model._forward_hooks):
            for key, fn in list(hooks.items()):
                if isinstance(getattr(fn, "__self__", None), cls):
                    del hooks[key]
                    model._forward_hooks_always_called.pop(key, None)
        new = cls(eps)
        model.register_forward_pre_hook(new._enter)
        model.register_forward_hook(new._leave, always_call=True)
        return new

    def __getstate__(self) -> dict:
        return {"eps": self.eps, "_sites": {}, "_modes": {}}

    def _enter(self, module: nn.Module, _args) -> None:
        sites = self._sites.get(id(module))
        if sites is None or sites.model is not module:
            sites = self._sites[id(module)] = _Sites(module)
        mode = _EpsMode(sites, self.eps)
        mode.__enter__()
        self._modes.setdefault(threading.get_ident(), []).append(mode)

    def _leave(self, _module, _args, _output) -> None:
        modes = self._modes.get(threading.get_ident())
        if modes:
            modes.pop().__exit__(None, None, None)


def _inputs(module: nn.Module, example_inputs) -> tuple[tuple, dict] | None:
    """One forward's (args, kwargs): those given, a Hugging Face model's dummy inputs, or for a model with an
    embedding table a row of token ids (the traced adapter's call)."""
    inputs = _example_inputs(module, example_inputs)
    if inputs is None and any(isinstance(m, nn.Embedding) for m in module.modules()):
        inputs = (torch.zeros(1, 8, dtype=torch.long),), {}
    return inputs


def run_forward(module: nn.Module, example_inputs, mode: TorchFunctionMode) -> str | None:
    """One forward of ``module`` in eval mode with ``mode`` active (on meta inputs for a model on meta); where
    none could be run, why in one line."""
    if any(type(p).__name__ == "DTensor" for p in module.parameters()):
        return "a sharded model's forward needs every rank"
    inputs = _inputs(module, example_inputs)
    if inputs is None:
        return "no forward could be run (pass example_inputs)"
    args, kwargs = inputs
    p = next(module.parameters(), None)
    device = None if p is None else torch.device("meta") if p.is_meta else p.device
    move = lambda x: x.to(device) if isinstance(x, torch.Tensor) and device is not None else x  # noqa: E731
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with mode:
            module(*(move(a) for a in args), **{k: move(v) for k, v in kwargs.items()})
    except Exception as e:  # a forward that needs other inputs: what it does is not known
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
        return f"its forward failed on the example inputs ({type(e).__name__}: {first}; pass example_inputs)"
    finally:
        for m, training in modes.items():
            m.training = training
    return None


@torch.no_grad()
def norm_call_sites(module: nn.Module, example_inputs=None) -> tuple[dict[str, NormCall], str | None]:
    """The norm calls that no norm layer makes, from one forward (``example_inputs`` as for gamma_init_), and
    where no forward could be run, why in one line (then nothing is known of them)."""
    calls = NormCalls(module)
    why = run_forward(module, example_inputs, calls)
    return ({}, why) if why else (calls.sites, None)
