"""The paper's attention output gate on a user's model, and a gated Hugging Face model saved and loaded with it.

    report = add_attention_gate_(model, "elementwise", gamma=1.0)   # in place; print(report)
    model.save_pretrained(folder)                                   # W_θ and a marker in config.json
    model = load_gated(folder)                                      # the same logits

The gate itself is smallinit.init.gate (any nn.Module). A Hugging Face model's config is marked so that
``save_pretrained`` writes the gate's kind, γ and blocks and ships the code that re-applies it
(export/remote/smallinit_gate.py): plain ``AutoModelForCausalLM.from_pretrained`` then asks for
``trust_remote_code=True`` rather than loading the architecture without its gate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smallinit.errors import ModelError
from smallinit.init.gate import GateError, GateReport, gate_attention_
from smallinit.io import read_json


def _is_hf(model: nn.Module) -> bool:
    return any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__)


def add_attention_gate_(
    model: nn.Module,
    kind: str = "elementwise",
    gamma: float = 1.0,
    *,
    generator: torch.Generator | None = None,
    example_inputs: Any = None,
) -> GateReport:
    """Add the output gate Y ⊙ σ(X W_θ) to every softmax-attention block of ``model``, in place, W_θ drawn
    with σ = d_model^(−γ); see :func:`smallinit.init.gate.gate_attention_` for what it gates and refuses. A
    Hugging Face model saves with it (``save_pretrained``) and loads back with :func:`load_gated`."""
    hf = _is_hf(model)
    if hf and getattr(model.config, "auto_map", None) and "smallinit_gate" not in vars(model.config):
        raise GateError(
            f"{type(model).__name__} already ships code of its own (auto_map in its config), so a saved gate "
            "could not be re-applied on load; the model is unchanged"
        )
    report = gate_attention_(model, kind, gamma, generator=generator, example_inputs=example_inputs)
    if hf and report.blocks:
        from smallinit.export.remote.smallinit_gate import mark_gated

        mark_gated(model, {"kind": kind, "gamma": gamma, "blocks": report.blocks})
        report.notes.append(
            "save_pretrained keeps the gate; load the folder with smallinit.load_gated(folder) or "
            "AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)"
        )
    return report


def load_gated(path: str | os.PathLike, **kwargs: Any) -> nn.Module:
    """The gated causal LM saved in ``path`` (``save_pretrained`` of a model given :func:`add_attention_gate_`),
    gate included, with smallinit's installed code (no code from the folder runs); ``kwargs`` go to
    ``from_pretrained`` (dtype, device_map, ...)."""
    config_file = Path(path) / "config.json"
    raw = read_json(config_file) if config_file.is_file() else None
    if not isinstance(raw, dict) or not isinstance(raw.get("smallinit_gate"), dict):
        raise ModelError(
            f"{path} holds no gated model (no smallinit_gate in a config.json): load it with "
            "AutoModelForCausalLM.from_pretrained"
        )
    try:
        from smallinit.export.remote.smallinit_gate import SmallinitGatedConfig, SmallinitGatedForCausalLM
    except ImportError:
        raise ModelError("loading a gated model needs transformers: pip install 'smallinit[hf]'") from None
    config = SmallinitGatedConfig.from_pretrained(path, local_files_only=True)
    return SmallinitGatedForCausalLM.from_pretrained(path, config=config, local_files_only=True, **kwargs)
