"""Every norm's ε, set in place."""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError
from .roles import is_norm

EPS_ATTRIBUTES = ("eps", "variance_epsilon", "epsilon")  # what torch, Hugging Face and others call a norm's ε


def set_norm_eps_(module: nn.Module, eps: float) -> list[str]:
    """Set ε of every norm layer (ours, torch's, Hugging Face's naming); returns the names touched."""
    if not eps > 0:
        raise ConfigError(f"norm eps must be positive, got {eps}")
    touched = []
    for name, mod in module.named_modules():
        if not is_norm(mod):
            continue
        for attr in EPS_ATTRIBUTES:
            if isinstance(getattr(mod, attr, None), float):
                setattr(mod, attr, float(eps))
                touched.append(name)
                break
    return touched
