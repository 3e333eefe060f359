"""The adapter for smallinit's own Transformer: its capture hooks (model/capture.py) give everything."""

from __future__ import annotations

from collections.abc import Collection

import torch

from smallinit.adapters.protocol import AttentionInputs, NormForm, Observed, check_kinds, norm_forms
from smallinit.model import Transformer

_CAPTURE = {"residual": "hidden", "norms": "norms", "attention": "qk"}


class TransformerAdapter:
    def __init__(self, model: Transformer):
        self.module = model
        self.vocab_size = model.config.vocab_size

    def norms(self) -> dict[str, NormForm]:
        return norm_forms(self.module)

    def observe(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, kinds: Collection[str] = ()
    ) -> Observed:
        out = self.module(tokens, targets, capture=[_CAPTURE[k] for k in check_kinds(kinds)])
        attention = [AttentionInputs(name=f"blocks.{i}.attn", q=q, k=k) for i, (q, k) in enumerate(out.qk)]
        return Observed(
            logits=out.logits,
            loss=out.loss,
            aux_loss=out.aux_loss,
            residual=out.hidden_states,
            norm_inputs=out.norm_inputs,
            attention=attention,
        )
