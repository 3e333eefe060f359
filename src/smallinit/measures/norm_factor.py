"""The RMSNorm factor: how much of the init scale a norm still sees (the paper's ε trap, Fig. 1c).

RMSNorm multiplies h by (σ²(h) + ε)^(−1/2), σ²(h) = mean(h_i²). The ideal factor is 1/σ(h); the ratio of
the two, σ(h)/√(σ²(h) + ε), is 1.0 while the norm sees the input scale and falls towards 0 once
σ²(h) ≪ ε (the factor saturates at ε^(−1/2)). With γ-init, h_i ~ N(0, d^(−2γ)) at init, so σ² = d^(−2γ).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch import nn

from ..adapters import NormForm, Observed, as_adapter
from ..config import ModelConfig
from ..errors import ModelError

# Warn when the expected σ²(h) at init is within this factor of ε: the factor then starts to saturate.
SATURATION_MARGIN = 10.0


def init_variance(gamma: float | np.ndarray, d: int) -> float | np.ndarray:
    """σ²(h) of a γ-initialised hidden state of width d: d^(−2γ)."""
    return np.power(float(d), -2.0 * np.asarray(gamma, dtype=np.float64))


def rmsnorm_factor(gamma: float | np.ndarray, eps: float, d: int) -> float | np.ndarray:
    """The analytic RMSNorm factor (σ² + ε)^(−1/2) with σ² = d^(−2γ) (scalar or elementwise over γ)."""
    out = np.power(init_variance(gamma, d) + eps, -0.5)
    return float(out) if np.ndim(out) == 0 else out


def relative_factor(gamma: float | np.ndarray, eps: float, d: int) -> float | np.ndarray:
    """The analytic factor relative to the ideal 1/σ: σ/√(σ² + ε) ∈ (0, 1]; 1 = fully sensitive."""
    var = init_variance(gamma, d)
    out = np.sqrt(var / (var + eps))
    return float(out) if np.ndim(out) == 0 else out


def saturation_gamma(eps: float, d: int, margin: float = 1.0) -> float:
    """The γ above which d^(−2γ) < margin·ε (margin 1: σ² = ε, the factor is 1/√2 of ideal)."""
    return math.log(margin * eps) / (-2.0 * math.log(d))


def norm_saturation_message(config: ModelConfig) -> str | None:
    """A one-line warning when the config's expected σ²(h) at init is below 10·ε, else None."""
    var, eps = float(init_variance(config.gamma, config.d_model)), config.effective_norm_eps
    if var >= SATURATION_MARGIN * eps or config.norm_eps_width:  # emulated saturation is asked for
        return None
    return (
        f"RMSNorm saturation: at init σ²(h) = d^(−2γ) = {var:.2g} (d={config.d_model}, γ={config.gamma:g}) is "
        f"below {SATURATION_MARGIN:g}·ε = {SATURATION_MARGIN * eps:.2g}, so the norms barely see the "
        f"init scale (factor at {relative_factor(config.gamma, eps, config.d_model):.0%} of 1/σ); "
        "the paper's fix is model.norm_eps=1e-12"
    )


def check_norm_saturation(config: ModelConfig, logger: logging.Logger | None = None) -> bool:
    """Log one warning (not one per layer) if ``config`` builds a model whose norms saturate at init.

    Called by whoever builds a model for a user (the CLI's train/info/analyze paths, recipes); the model
    itself stays free of logging. Returns whether it warned.
    """
    msg = norm_saturation_message(config)
    if msg is not None:
        (logger or logging.getLogger("smallinit")).warning(msg)
    return msg is not None


@torch.no_grad()
def measured_norm_factors(model, tokens: torch.Tensor) -> dict[str, float]:
    """Per norm layer (by module name), the realised factor relative to the ideal 1/σ(h), for any model an
    adapter reads (smallinit.adapters); a norm that cannot be measured is an error naming it (analyze and
    the monitor, through measure_activations, measure the others and name it).

    For each token, σ(h)/√(σ²(h) + ε); averaged over tokens. 1.0 = the norm sees the input scale, ≪ 1 =
    saturated by ε."""
    adapter = as_adapter(model)
    factors, missing = norm_factors_from_observed(adapter, adapter.observe(tokens, kinds=("norms",)))
    if missing:
        name, why = next(iter(missing.items()))
        more = f" (and {len(missing) - 1} more norms)" if len(missing) > 1 else ""
        raise ModelError(f"norm {name}: {why}{more}")
    return factors


def norm_factors_from_observed(adapter, observed: Observed) -> tuple[dict[str, float], dict[str, str]]:
    """The factor of every norm the forward called, and for each norm that cannot be measured why (one line).

    Where the adapter gives the norms' calls (Hugging Face models) each norm is re-run on them
    (:func:`factor_from_calls`); else the factor comes from its input with its form (``adapter.norms()``)."""
    factors, missing = {}, {k.partition(":")[2]: v for k, v in observed.missing.items() if k.startswith("norms:")}
    if observed.norm_calls:
        for name, calls in observed.norm_calls.items():
            try:
                factors[name] = factor_from_calls(adapter.module.get_submodule(name), calls).mean().item()
            except ModelError as e:
                missing[name] = str(e)
        return factors, missing
    forms = adapter.norms()
    missing.update({name: "its ε or form cannot be read" for name in observed.norm_inputs if name not in forms})
    known = {name: h for name, h in observed.norm_inputs.items() if name in forms}
    return {**factors, **norm_factors_from_inputs(forms, known)}, missing


def norm_factors_from_inputs(forms: dict[str, NormForm], norm_inputs: dict[str, torch.Tensor]) -> dict[str, float]:
    """Measured factors from observed norm inputs (``Observed.norm_inputs``), each with its norm's form."""
    result = {}
    for name, h in norm_inputs.items():
        form = forms[name]
        h = h.double()
        var = h.var(-1, unbiased=False) if form.centered else h.pow(2).mean(-1)
        result[name] = torch.sqrt(var / (var + form.eps)).mean().item()
    return result


@torch.no_grad()
def factor_from_calls(norm: nn.Module, calls: list[tuple[tuple, dict]]) -> torch.Tensor:
    """Per row (token) of each call, the norm's realised factor over the ideal, read from its own forward:
    ‖N(x) − N(0)‖ / ‖N(c·x) − N(0)‖ with c large enough that N no longer changes with it (ε negligible).

    N(0) is the bias; the weight (w or 1 + w) and a gate multiply both sides alike, and ε, its form (RMS,
    LayerNorm, L2, grouped) and what it normalises (a gated norm's x·act(z)) are what the forward makes of
    them, none read from attributes: for an RMSNorm of x this is σ(x)/√(σ²(x) + ε) exactly. A module whose
    output keeps changing with the input's scale is not measured as a norm (ModelError)."""
    rows = []
    for i, (args, kwargs) in enumerate(calls):
        x = args[0] if args else kwargs["hidden_states"]

        def run(h: torch.Tensor, args=args, kwargs=kwargs) -> torch.Tensor:
            if args:
                out = norm(h, *args[1:], **kwargs)
            else:
                out = norm(**{**kwargs, "hidden_states": h})
            out = out[0] if isinstance(out, (tuple, list)) else out
            return out.double()

        rms = x.double().pow(2).mean(-1, keepdim=True).sqrt()
        zero = run(torch.zeros_like(x))
        zero = torch.where(zero.isfinite(), zero, 0.0)
        tol = max(1e-5, 16 * torch.finfo(x.dtype).eps)
        scale = 1e2 / rms.clamp_min(torch.finfo(torch.float64).tiny)
        for _ in range(4):  # ×100 until the output stops moving (a gate can shrink what is normalised)
            ideal, further = (run((x.double() * c * scale).to(x.dtype)) - zero for c in (1.0, 10.0))
            if not (ideal.isfinite().all() and further.isfinite().all()):
                break  # overflow: the dtype ran out before ε became negligible
            if (further - ideal).abs().max() <= tol * ideal.abs().max():
                f = (run(x) - zero).norm(dim=-1) / ideal.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
                rows.append(torch.where(rms.squeeze(-1) > 0, f, 0.0).flatten())
                break
            scale = scale * 1e2
        else:
            raise ModelError(f"the output of {type(norm).__name__} keeps changing with its input's scale, so it is "
                             "not measured as a norm")
        if len(rows) == i:
            raise ModelError(f"{type(norm).__name__} overflows its dtype before ε becomes negligible, so its "
                             "factor cannot be read from its forward")
    return torch.cat(rows)
