"""Every norm's ε, set in place."""

from __future__ import annotations

from torch import nn

from smallinit.errors import ConfigError
from smallinit.init.roles import is_norm

EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


class NormEpsError(ConfigError):
    """A norm whose ε is not an attribute that can be set (hard-coded in its forward)."""


def norm_layers(module: nn.Module) -> dict[str, nn.Module]:
    """The norm layers of ``module`` by name: a class name that says norm (is_norm) and no parameters in
    submodules. A module that holds norms or other layers is not one, whatever its name: StableLM's per-head
    norm (a list of nn.LayerNorm), roberta-prelayernorm's encoder and attention ("…PreLayerNorm…")."""
    return {
        name: m
        for name, m in module.named_modules()
        if is_norm(m) and not any(True for c in m.children() for _ in c.parameters())
    }


def set_norm_eps_(module: nn.Module, eps: float) -> list[str]:
    """Set ε of every norm layer (ours, torch's, Hugging Face's naming); returns the names touched.

    Raises NormEpsError, naming the modules, when a norm has no ε attribute (its forward hard-codes it):
    setting ε on the others only would give a model that silently runs with two ε."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ConfigError(f"norm eps must be a positive number such as 1e-12, got {eps!r}")
    norms = norm_layers(module)
    if not norms:  # an ε asked for and set nowhere would read as done
        raise NormEpsError(
            f"{type(module).__name__} has no norm layer (no module whose class name says norm), so ε = {eps:g} "
            "has nowhere to go; leave ε unset for this model"
        )
    touched, fixed = [], []
    for name, mod in norms.items():
        for attr in EPS_ATTRS:
            if isinstance(getattr(mod, attr, None), float):
                setattr(mod, attr, float(eps))
                touched.append(name)
                break
        else:
            fixed.append(name)
    if fixed:
        kind = type(module.get_submodule(fixed[0])).__name__
        more = f" and {len(fixed) - 1} more" if len(fixed) > 1 else ""
        raise NormEpsError(
            f"{kind} at {fixed[0] or 'the root'}{more} has no ε attribute (its forward hard-codes ε), so ε = {eps:g} "
            "cannot be set; replace those norms with ones that take ε, or keep the architecture's ε"
        )
    return touched
