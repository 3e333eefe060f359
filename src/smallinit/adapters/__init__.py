"""Model adapters: what the measurements need from a model (smallinit.analysis), obtained from any model.

``as_adapter(model)`` returns the object itself when it already follows the protocol (protocol.py:
``module``, ``vocab_size``, ``norms()``, ``observe(tokens, targets, kinds)``), the adapter of smallinit's
Transformer or of a Hugging Face causal LM, and for any other nn.Module the adapter found from its own
forward (traced.py), which names what it cannot find.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from smallinit.adapters.hf import HFAdapter, is_hf_causal_lm, recording_attention
from smallinit.adapters.hf_folder import HFModel, HFTokenizer, hf_folder_problem, load_hf_folder
from smallinit.adapters.protocol import (
    AttentionInputs,
    ModelAdapter,
    NormForm,
    Observed,
    norm_forms,
    norm_modules,
    realised_factor,
)
from smallinit.adapters.traced import TracedAdapter
from smallinit.adapters.transformer import TransformerAdapter
from smallinit.errors import ModelError
from smallinit.model import Transformer


def as_adapter(model: Any) -> ModelAdapter:
    """The adapter through which the measurements read ``model``."""
    if isinstance(model, ModelAdapter):
        return model
    if isinstance(model, Transformer):
        return TransformerAdapter(model)
    if is_hf_causal_lm(model):
        return HFAdapter(model)
    if isinstance(model, nn.Module):
        return TracedAdapter(model)
    raise ModelError(
        f"smallinit cannot observe a {type(model).__name__}: pass an nn.Module whose forward takes token "
        "ids, or an adapter of your own (docs/analysis.md, 'Your own model')"
    )


def has_own_adapter(model: Any) -> bool:
    """Whether ``model`` is read by an adapter made for it (its own, smallinit's or Hugging Face's) rather
    than one found from its forward."""
    return isinstance(model, (ModelAdapter, Transformer)) or is_hf_causal_lm(model)


__all__ = [
    "AttentionInputs",
    "HFAdapter",
    "HFModel",
    "HFTokenizer",
    "ModelAdapter",
    "NormForm",
    "Observed",
    "TracedAdapter",
    "TransformerAdapter",
    "as_adapter",
    "has_own_adapter",
    "hf_folder_problem",
    "is_hf_causal_lm",
    "load_hf_folder",
    "norm_forms",
    "norm_modules",
    "realised_factor",
    "recording_attention",
]
