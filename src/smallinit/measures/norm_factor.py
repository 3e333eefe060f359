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

from smallinit.adapters import NormForm, Observed, as_adapter
from smallinit.config import ModelConfig
from smallinit.errors import ModelError

# Warn when the expected σ²(h) at init is within this factor of ε: the factor then starts to saturate.
SATURATION_MARGIN = 10.0
# A norm whose measured factor is below this is saturated (σ² < ε/3): ε, not the input, sets its scale. The
# monitor's warning, the share of a run spent saturated and the claims' preconditions all read this one.
SATURATED = 0.5


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

    Where the adapter read the factors off the norms' own forward (Hugging Face models:
    smallinit.adapters.realised_factor) those; else the factor comes from its input with its form
    (``adapter.norms()``)."""
    missing = {k.partition(":")[2]: v for k, v in observed.missing.items() if k.startswith("norms:")}
    if observed.norm_factors:
        return {name: f.double().mean().item() for name, f in observed.norm_factors.items()}, missing
    forms = adapter.norms()
    missing.update(
        {name: "its ε or form cannot be read" for name in observed.norm_inputs if name not in forms}
    )
    known = {name: h for name, h in observed.norm_inputs.items() if name in forms}
    return norm_factors_from_inputs(forms, known), missing


def norm_factors_from_inputs(
    forms: dict[str, NormForm], norm_inputs: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Measured factors from observed norm inputs (``Observed.norm_inputs``), each with its norm's form."""
    result = {}
    for name, h in norm_inputs.items():
        form = forms[name]
        h = h.double()
        var = h.var(-1, unbiased=False) if form.centered else h.pow(2).mean(-1)
        result[name] = torch.sqrt(var / (var + form.eps)).mean().item()
    return result
