"""Every norm's ε, set in place: norm layers by their attribute, norm calls (norm_calls.py) by a hook."""

from __future__ import annotations

from torch import nn

from smallinit.errors import ConfigError
from smallinit.init.norm_calls import FunctionalEps, norm_call_sites
from smallinit.init.roles import norm_layers

EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


class NormEpsError(ConfigError):
    """A norm whose ε is not an attribute that can be set (hard-coded in its forward)."""


def _eps_attr(mod: nn.Module) -> str | None:
    """The attribute that holds the layer's ε: a float, or torch's nn.RMSNorm's None (its default, the input
    dtype's machine epsilon, which its forward reads from that attribute)."""
    for a in EPS_ATTRS:
        value = getattr(mod, a, None)
        if isinstance(value, float) or (value is None and a == "eps" and isinstance(mod, nn.RMSNorm)):
            return a
    return None


def set_norm_eps_(module: nn.Module, eps: float, example_inputs=None) -> list[str]:
    """Set ε of every norm of ``module``: each norm layer's attribute (ours, torch's, Hugging Face's naming),
    and the rms_norm / layer_norm calls its forward makes outside norm layers (found from one forward on
    ``example_inputs``, as for gamma_init_), whose ε a hook on ``module`` passes while it runs
    (smallinit.init.norm_calls.FunctionalEps: not saved with the weights). Returns the names touched: the
    layers' module names, then the call sites' (``h.0:rms_norm#1``).

    Raises NormEpsError, naming them, when a norm's ε cannot be set (a layer without an ε attribute, an
    x·rsqrt(mean(x²) + ε) written out): setting ε on the others only would give a model that silently runs
    with two ε.

    Each call follows the forward again (one forward of the example inputs), rather than keeping a model's
    calls from an earlier one: which norms a forward calls can hang on Python state that no cache key sees (a
    config flag, the inputs' control flow), and a stale list would report ε set where a norm now keeps its
    own."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ConfigError(f"norm eps must be a positive number such as 1e-12, got {eps!r}")
    norms = norm_layers(module)
    # a layer that hard-codes ε is refused before anything runs
    fixed = [name for name, mod in norms.items() if _eps_attr(mod) is None]
    if fixed:
        kind = type(module.get_submodule(fixed[0])).__name__
        more = f" and {len(fixed) - 1} more" if len(fixed) > 1 else ""
        raise NormEpsError(
            f"{kind} at {fixed[0] or 'the root'}{more} has no ε attribute (its forward hard-codes ε), so ε = {eps:g} "
            "cannot be set; replace those norms with ones that take ε, or keep the architecture's ε"
        )
    calls, unknown = norm_call_sites(module, example_inputs)
    if not norms and not calls:  # an ε asked for and set nowhere would read as done
        how = f"; its norm calls are not known: {unknown}" if unknown else " and its forward calls no norm"
        raise NormEpsError(
            f"{type(module).__name__} has no norm layer (no module whose class name says norm){how}, so "
            f"ε = {eps:g} has nowhere to go; leave ε unset for this model"
        )
    written = [c for c in calls.values() if not c.settable]
    if written:
        raise NormEpsError(
            f"{len(written)} norms are written out in the forward as x·rsqrt(mean(x²) + ε) or x / sqrt(…) with "
            f"ε fixed in the source ({', '.join(f'{c.name} at {c.where}' for c in written)}), so ε = {eps:g} cannot be set; "
            "call F.rms_norm(x, shape, eps=...) there instead, or keep the architecture's ε"
        )
    touched = []
    for name, mod in norms.items():
        setattr(mod, _eps_attr(mod), float(eps))
        touched.append(name)
    if calls:
        FunctionalEps.apply(module, eps)
        touched += list(calls)
    return touched
