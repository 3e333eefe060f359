"""Model adapters: what the measurements need from a model (smallinit.analysis), obtained from any model.

``as_adapter(model)`` returns the adapter of smallinit's Transformer or of a Hugging Face causal LM, or the
object itself when it already follows the protocol (protocol.py: ``module``, ``vocab_size``, ``norms()``,
``observe(tokens, targets, kinds)``), which is how a model of your own is measured.
"""

from __future__ import annotations

from typing import Any

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
    raise ModelError(
        f"smallinit cannot observe a {type(model).__name__}: pass a smallinit Transformer, a Hugging "
        "Face causal LM, or an adapter of your own (docs/analysis.md, 'Your own model')"
    )


__all__ = [
    "AttentionInputs",
    "HFAdapter",
    "HFModel",
    "HFTokenizer",
    "ModelAdapter",
    "NormForm",
    "Observed",
    "TransformerAdapter",
    "as_adapter",
    "hf_folder_problem",
    "is_hf_causal_lm",
    "load_hf_folder",
    "norm_forms",
    "norm_modules",
    "realised_factor",
    "recording_attention",
]
