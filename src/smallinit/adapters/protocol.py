"""What the measurements need from a model, and the protocol an adapter follows to give it.

An adapter runs one ordinary forward of its model and returns an :class:`Observed`: the logits (and the
loss), the residual stream at the block boundaries, the input of every norm, and for every softmax
attention call the queries and keys after position encoding with the mask and scale it used (or its
probabilities). The measurements (smallinit.analysis) read only these, so they are the same code for
smallinit's Transformer, for Hugging Face causal LMs and for a model of your own.

To measure your own module, give an object with these members (``module`` can be the model itself)::

    class MyAdapter:
        module = my_model                         # parameters (matrix statistics) and the device
        vocab_size = 32000
        def norms(self):                          # {module name: NormForm(eps=..., centered=...)}
            return {"final_norm": NormForm(eps=my_model.final_norm.eps)}
        def observe(self, tokens, targets=None, kinds=()):
            ...                                   # one forward, recording what ``kinds`` asks for
            return Observed(logits=..., loss=..., residual=[e, ..., h_L], norm_inputs={...},
                            attention=[AttentionInputs(name="layers.0.attn", q=q, k=k), ...])
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from smallinit.errors import ModelError
from smallinit.init.eps import EPS_ATTRS, norm_layers

# What observe() can be asked for: the residual stream, the norms' inputs, the attention inputs.
KINDS = ("residual", "norms", "attention")


@dataclass(frozen=True)
class NormForm:
    """How a norm scales its input h: by (σ²(h) + ε)^(−1/2), with σ²(h) = mean(h²) (RMSNorm) or the variance
    about the mean (``centered``: LayerNorm), over the last dimension. The weight (w or 1 + w) multiplies
    afterwards and does not enter the factor."""

    eps: float
    centered: bool = False


@dataclass
class AttentionInputs:
    """One softmax-attention call, as the backend received it: ``q`` (B, H, T, hd) and ``k`` (B, H_kv, S, hd)
    after position encoding (H_kv may divide H: grouped-query attention), or ``probs`` (B, H, T, S) instead.

    ``mask``: None for causal attention (query i sees keys j ≤ i, and with ``window`` only i − j < window); a
    bool tensor (True: may attend) or a float tensor added to the scores, either broadcastable to
    (B, H, T, S). ``scale`` multiplies q·k (None: hd^(−1/2)); ``score_mod`` (flex_attention's) turns a scaled
    score into ``score_mod(score, b, h, q_idx, kv_idx)``, evaluated on index tensors that broadcast to the
    scores; ``softcap`` c turns a score s into c·tanh(s/c) before the mask; ``sink_logits`` (H,) are extra
    logits in each head's softmax denominator (learned sinks) that take weight from every key.
    """

    name: str
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    probs: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    window: int | None = None
    scale: float | None = None
    score_mod: Callable | None = None
    softcap: float | None = None
    sink_logits: torch.Tensor | None = None


def score_modded(score_mod: Callable | None, s: torch.Tensor, lo: int = 0) -> torch.Tensor:
    """Scaled scores ``s`` (B, H, queries lo…, S) after flex_attention's ``score_mod`` (None: as they are)."""
    return s if score_mod is None else score_mod(s, *flex_indices(s.shape, lo, s.device))


def flex_indices(shape: torch.Size, lo: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """flex_attention's (b, h, q_idx, kv_idx) for scores of ``shape`` (B, H, queries lo…, S), each shaped to
    broadcast against them."""
    B, H, n, S = shape
    return (
        torch.arange(B, device=device).view(B, 1, 1, 1),
        torch.arange(H, device=device).view(1, H, 1, 1),
        torch.arange(lo, lo + n, device=device).view(1, 1, n, 1),
        torch.arange(S, device=device).view(1, 1, 1, S),
    )


@dataclass
class Observed:
    """One forward of a model. ``residual``: e (the first block's input: the embedding, plus positions or
    scaling where the model adds them), then each later block's input, then h_L (the final norm's input)."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None  # mean next-token cross-entropy when targets were given
    aux_loss: torch.Tensor | None = None  # what the model adds to the loss in training (MoE router losses)
    residual: list[torch.Tensor] = field(default_factory=list)
    norm_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    # per norm, each row's factor read off the norm's own forward (realised_factor), where the adapter
    # measures it so; the measurements then use it instead of norm_inputs with norms()
    norm_factors: dict[str, torch.Tensor] = field(default_factory=dict)
    attention: list[AttentionInputs] = field(default_factory=list)
    # what was asked for but cannot be observed on this model, with why in one line: a kind ("attention",
    # "residual"), or "norms:NAME" for one norm; and notes on how what was observed was obtained
    missing: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def require(self, kind: str) -> None:
        """Raise the one-line reason when ``kind`` was asked for and could not be observed."""
        if kind in self.missing:
            raise ModelError(self.missing[kind])


@runtime_checkable
class ModelAdapter(Protocol):
    module: nn.Module
    vocab_size: int

    def norms(self) -> dict[str, NormForm]: ...

    def observe(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, kinds: Collection[str] = ()
    ) -> Observed: ...


def check_kinds(kinds: Collection[str]) -> set[str]:
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown observation {sorted(unknown)}; choose from {KINDS}")
    return set(kinds)


def readable_norm_forms(model: nn.Module) -> tuple[dict[str, NormForm], dict[str, str]]:
    """The forms of the norms whose ε and form can be read, and for each other norm why not (one line)."""
    forms, problems = {}, {}
    for name, m in norm_modules(model).items():
        try:
            forms[name] = NormForm(eps=_eps(name, m), centered=_centered(name, m))
        except ModelError as e:
            problems[name] = str(e)
    return forms, problems


def norm_forms(model: nn.Module) -> dict[str, NormForm]:
    """Every norm layer of ``model`` (norm_modules) with its own ε and form.

    ε is read from the module (``eps``, ``variance_epsilon`` or ``epsilon``), else from its forward (a norm
    that hard-codes ε, OLMo's: :func:`probe_eps`); a norm whose ε neither gives is an error, never a guess.
    The form: LayerNorm subtracts the mean, a class named RMS… does not; any other norm is probed (a
    centered norm ignores a shift of its input)."""
    return {
        name: NormForm(eps=_eps(name, m), centered=_centered(name, m))
        for name, m in norm_modules(model).items()
    }


def norm_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The norm layers of ``model`` by name (smallinit.init.eps.norm_layers: a class name that says norm,
    and no parameters in submodules)."""
    return norm_layers(model)


def _eps(name: str, m: nn.Module) -> float:
    for attr in EPS_ATTRS:
        value = getattr(m, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    if isinstance(m, nn.RMSNorm) and m.eps is None:  # torch's default: the machine epsilon of the input
        return float(torch.finfo(m.weight.dtype if m.weight is not None else torch.float32).eps)
    eps = probe_eps(m)
    if eps is None:
        raise ModelError(
            f"cannot read the ε of norm {name} ({type(m).__name__}): it has none of "
            f"{', '.join(EPS_ATTRS)} and its forward does not scale as a norm with an ε; adapt the "
            "model yourself (docs/analysis.md, 'Your own model')"
        )
    return eps


def _probe_input(m: nn.Module) -> tuple[tuple[int, ...], torch.dtype, torch.device]:
    """The shape one row of ``m``'s input has (its weight's, 2-D for per-head norms, or its
    ``normalized_shape``; any width for a weightless norm that keeps neither), and the dtype and device of
    its parameters."""
    weight, p = getattr(m, "weight", None), next(m.parameters(), None)
    dtype, device = (p.dtype, p.device) if p is not None else (torch.float32, torch.device("cpu"))
    if isinstance(weight, torch.Tensor) and weight.dim() >= 1:
        return tuple(weight.shape), weight.dtype, weight.device
    shape = getattr(m, "normalized_shape", None)
    if isinstance(shape, (tuple, list)) and shape and all(isinstance(n, int) for n in shape):
        return tuple(shape), dtype, device
    return (8,), dtype, device


@torch.no_grad()
def probe_eps(m: nn.Module) -> float | None:
    """ε as the norm's forward uses it, or None when the forward does not scale like (σ² + ε)^(−1/2).

    A row u of mean 0 and mean square 1 scaled by a leaves the norm (less its output at 0, the bias) as
    a/√(a² + ε) times what a large scale A gives, so ε = a²(1/f² − 1); a is moved to √ε, where f is most
    sensitive to it. Rounded to 4 significant digits: the probe runs in the norm's dtype."""
    shape, dtype, device = _probe_input(m)
    width = shape[-1]
    u = torch.tensor([(-1.0) ** i for i in range(width)], dtype=torch.float64)
    if width % 2:
        u[-1] = 0.0
    u = (u / u.pow(2).mean().sqrt()).expand(1, *shape).to(device=device, dtype=dtype)
    try:
        zero = m(torch.zeros_like(u)).double()
        zero = torch.where(zero.isfinite(), zero, 0.0)
        big, a, eps = 1e2, 1e-3, None
        ref = (m(big * u).double() - zero).norm().item()
        for _ in range(6):
            f = (m(a * u).double() - zero).norm().item() / ref
            if not 0 < f <= 1 + 1e-3:
                return None
            if f >= 1 - 1e-6:  # ε ≪ a², below what the dtype resolves: try a smaller a
                a *= 1e-3
                continue
            eps = a * a * (1 / (f * f) - 1)
            a = eps**0.5
        if eps is None:
            return 0.0 if a < 1e-12 else None
        # the reference at scale A assumes ε ≪ A²: a module that only scales has no ε
        if eps > 1e-4 * big * big:
            return None
        f = (
            m(3 * a * u).double() - zero
        ).norm().item() / ref  # the form holds at another scale, or it is no such norm
        if abs(f - 3 * a / (9 * a * a + eps) ** 0.5) > 1e-2 * f:
            return None
    except (TypeError, RuntimeError, ValueError):
        return None
    return float(f"{eps:.4g}")


@torch.no_grad()
def _centered(name: str, m: nn.Module) -> bool:
    if isinstance(m, nn.LayerNorm):
        return True
    if isinstance(m, nn.RMSNorm) or "rms" in type(m).__name__.lower():
        return False
    shape, dtype, device = _probe_input(m)
    try:
        x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        x = x.to(device=device, dtype=dtype)
        return bool(torch.allclose(m(x), m(x + 1.0), atol=1e-4))
    except (TypeError, RuntimeError, AttributeError) as exc:
        raise ModelError(
            f"cannot tell whether norm {name} ({type(m).__name__}) subtracts the mean: probing it "
            f"failed ({exc}); adapt the model yourself (docs/analysis.md, 'Your own model')"
        ) from None


@torch.no_grad()
def realised_factor(norm: nn.Module, args: tuple, kwargs: dict, output) -> torch.Tensor:
    """Per row (token) of one call, the norm's realised factor over the ideal, read from its own forward: the f
    that makes N(x) − N(0) = f·(N(c·x) − N(0)) in least squares, with c large enough that N no longer changes with
    it (ε negligible). A norm over each group of channels on its own (Mamba-2's gated norm with n_groups > 1)
    gives the mean of its groups' factors, as the heads of a per-head norm count (exactly while its weight is
    the same in every group, as at init; a trained weight weighs each group by its share of ‖N(c·x) − N(0)‖²).

    ``output`` is N(x) as the forward made it; the others re-run ``norm.forward`` (no hooks) on the same
    call, so this runs inside the forward (a forward hook), where a sharded model's parameters are whole.
    N(0) is the bias; the weight (w or 1 + w) and a gate multiply both sides alike, and ε, its form (RMS,
    LayerNorm, L2, grouped) and what it normalises (a gated norm's x·act(z)) are what the forward makes of
    them, none read from attributes: for an RMSNorm of x this is σ(x)/√(σ²(x) + ε) exactly.

    A norm that returns its scale rather than the scaled row (one number per row, as HY-V4's hyper-connection
    ``input_norm``: rsqrt(mean(x²) + ε)) is read as the scale it returns times σ(x), over the same at c·x:
    σ(x)/√(σ²(x) + ε) again. A module whose output keeps changing with the input's scale is not measured as
    a norm (ModelError)."""
    key = None if args else next(k for k in ("hidden_states", "x", "h", "input") if k in kwargs)
    x = args[0] if args else kwargs[key]

    def first(out) -> torch.Tensor:
        return (out[0] if isinstance(out, (tuple, list)) else out).double()

    def run(h: torch.Tensor) -> torch.Tensor:
        return first(norm.forward(h, *args[1:], **kwargs) if args else norm.forward(**{**kwargs, key: h}))

    rms = x.double().pow(2).mean(-1, keepdim=True).sqrt()
    tiny = torch.finfo(torch.float64).tiny
    given = first(output)
    if x.shape[-1] > 1 and given.shape[-1] == 1 and given.numel() == rms.numel():  # it returns its scale
        zero = torch.zeros((), dtype=torch.float64)

        def scaled(out: torch.Tensor, h_rms: torch.Tensor) -> torch.Tensor:
            return out.reshape(h_rms.shape) * h_rms

    else:
        zero = run(torch.zeros_like(x))
        zero = torch.where(zero.isfinite(), zero, 0.0)

        def scaled(out: torch.Tensor, h_rms: torch.Tensor) -> torch.Tensor:
            return out - zero

    tol = max(1e-5, 16 * torch.finfo(x.dtype).eps)
    scale = 1e2 / rms.clamp_min(tiny)
    for _ in range(4):  # ×100 until the output stops moving (a gate can shrink what is normalised)
        ideal, further = (
            scaled(run((x.double() * c * scale).to(x.dtype)), rms * c * scale) for c in (1.0, 10.0)
        )
        if not (ideal.isfinite().all() and further.isfinite().all()):
            raise ModelError(
                f"{type(norm).__name__} overflows its dtype before ε becomes negligible, so its "
                "factor cannot be read from its forward"
            )
        if (further - ideal).abs().max() <= tol * ideal.abs().max():
            # least squares, so that a grouped norm gives the mean of its groups' factors, not their rms
            f = (scaled(given, rms) * ideal).sum(-1) / ideal.pow(2).sum(-1).clamp_min(tiny)
            return torch.where(rms.squeeze(-1) > 0, f, 0.0).flatten()
        scale = scale * 1e2
    raise ModelError(
        f"the output of {type(norm).__name__} keeps changing with its input's scale, so it is not "
        "measured as a norm"
    )
