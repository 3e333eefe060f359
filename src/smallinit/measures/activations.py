"""All activation measurements of one model from one forward pass, through its adapter."""

from __future__ import annotations

import torch

from ..adapters import as_adapter
from .norm_factor import norm_factors_from_inputs
from .residual_flow import flow_from_hidden
from .sink import sink_from_attention


@torch.no_grad()
def measure_activations(
    model, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, chunk: int = 256
) -> dict:
    """Sink scores, residual flow and measured norm factors of ``model`` (any model an adapter reads) on
    ``tokens`` (one forward; with ``targets`` also the loss)."""
    adapter = as_adapter(model)
    out = adapter.observe(tokens, targets, kinds=("residual", "norms", "attention"))
    result = {
        "sink": sink_from_attention(out.attention, chunk=chunk).to_dict(),
        "residual_flow": flow_from_hidden(out.residual),
        "norm_factor": norm_factors_from_inputs(adapter.norms(), out.norm_inputs),
    }
    if out.loss is not None:
        result["loss"] = out.loss.item()
    return result
