"""All activation measurements of one model from one forward pass, through its adapter."""

from __future__ import annotations

import torch

from smallinit.adapters import as_adapter
from smallinit.measures.norm_factor import norm_factors_from_observed
from smallinit.measures.residual_flow import flow_from_hidden
from smallinit.measures.sink import sink_from_attention

# the observation each measurement is made from
MEASURED_FROM = {"sink": "attention", "residual_flow": "residual", "norm_factor": "norms"}


@torch.no_grad()
def measure_activations(
    model, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, chunk: int = 256
) -> dict:
    """Sink scores, residual flow and measured norm factors of ``model`` (any model an adapter reads) on
    ``tokens`` (one forward; with ``targets`` also the loss).

    Each measurement stands on its own: one that does not apply to the model (no softmax attention, no
    decoder layers to read the residual stream at, a norm that cannot be run) is left out of the result and
    named in ``"not_measured"`` with why, in one line (``"norm_factor:NAME"`` for one norm); ``"notes"``
    says how a measurement was obtained where it is not the usual way (h_L taken as the last layer's output,
    attention read from eager probabilities)."""
    adapter = as_adapter(model)
    out = adapter.observe(tokens, targets, kinds=tuple(MEASURED_FROM.values()))
    result: dict = {}
    not_measured = {key: out.missing[kind] for key, kind in MEASURED_FROM.items() if kind in out.missing}
    if "sink" not in not_measured:
        if out.attention:
            result["sink"] = sink_from_attention(out.attention, chunk=chunk).to_dict()
        else:
            not_measured["sink"] = (
                f"no softmax attention: {type(adapter.module).__name__} made no attention call"
            )
    if "residual_flow" not in not_measured:
        if out.residual:
            result["residual_flow"] = flow_from_hidden(out.residual)
        else:
            not_measured["residual_flow"] = (
                f"the adapter of {type(adapter.module).__name__} observed no residual stream"
            )
    factors, unmeasured = norm_factors_from_observed(adapter, out)
    if factors:
        result["norm_factor"] = factors
    elif "norm_factor" not in not_measured and not unmeasured:
        not_measured["norm_factor"] = "no norm layer ran in the forward"
    not_measured.update({f"norm_factor:{name}": why for name, why in unmeasured.items()})
    if out.loss is not None:
        result["loss"] = out.loss.item()
    result["not_measured"] = not_measured
    notes = [f"{key}: {out.notes[kind]}" for key, kind in MEASURED_FROM.items() if kind in out.notes]
    if notes:
        result["notes"] = notes
    return result
