"""The adapter for Hugging Face causal LMs, whatever attention backend the model was loaded with.

Everything is observed from outside the ordinary forward, and nothing of it stays afterwards:

* the residual stream from forward pre-hooks: each decoder layer's input (the classes the architecture
  declares in ``_no_split_modules``), and the final norm's input, h_L (the norm that runs outside the
  layers after the last one; Hugging Face's last hidden state is that norm's *output*);
* every norm's input from a pre-hook, and its ε and form from the module (protocol.norm_forms);
* every softmax attention call through transformers' attention interface: while observing,
  ``AttentionInterface.get_interface`` hands out the model's own backend (eager, sdpa, flash, ...) wrapped
  in a recorder that keeps the query and key (after position encoding), the mask, scale, sliding window,
  logit soft-cap and learned sinks it is called with, then calls the backend unchanged. Layers that are
  not softmax attention (linear attention, state-space) make no such call and have no sink score.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import ModelError
from ..model.loss import cross_entropy
from .protocol import AttentionInputs, NormForm, Observed, check_kinds, norm_forms, norm_modules


def is_hf_causal_lm(model: Any) -> bool:
    """A transformers PreTrainedModel (without importing transformers when it is not loaded)."""
    return any(c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
               for c in type(model).__mro__)


class HFAdapter:
    def __init__(self, model: nn.Module):
        self.module = model
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size = int(config.vocab_size)
        self.blocks = decoder_layers(model, getattr(config, "num_hidden_layers", None))

    def norms(self) -> dict[str, NormForm]:
        return norm_forms(self.module)

    def observe(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                kinds: Collection[str] = ()) -> Observed:
        kinds = check_kinds(kinds)
        seen: list[tuple[str, torch.Tensor]] = []  # (module name, its input) in call order
        attention: list[AttentionInputs] = []
        norms = norm_modules(self.module) if kinds & {"norms", "residual"} else {}
        forms = self.norms() if "norms" in kinds else {}
        watched = {**(dict(self.blocks) if "residual" in kinds else {}), **norms}
        with contextlib.ExitStack() as stack:
            for name, module in watched.items():
                hook = module.register_forward_pre_hook(_keep_input(name, seen), with_kwargs=True)
                stack.callback(hook.remove)
            if "attention" in kinds:
                stack.enter_context(recording_attention(self.module, attention))
            logits = self.module(input_ids=tokens, use_cache=False).logits
        out = Observed(logits=logits, attention=attention)
        if targets is not None:
            out.loss = cross_entropy(logits.flatten(0, 1), targets.flatten())
        if "residual" in kinds:
            out.residual = self._residual(seen, set(norms))
        if "norms" in kinds:
            for name, h in seen:
                if name in forms:  # a norm called more than once contributes all its rows
                    prev = out.norm_inputs.get(name)
                    out.norm_inputs[name] = h if prev is None else torch.cat([prev.flatten(0, -2), h.flatten(0, -2)])
        if "attention" in kinds and not attention:
            raise ModelError(f"{type(self.module).__name__} made no call to transformers' attention interface, so "
                             "its attention cannot be observed; adapt it yourself (docs/analysis.md, 'Your own model')")
        return out

    def _residual(self, seen: list[tuple[str, torch.Tensor]], norms: set[str]) -> list[torch.Tensor]:
        """Block inputs in order, then the input of the last norm called outside the blocks after the last block."""
        blocks = [name for name, _ in self.blocks]
        inputs = [(i, name, h) for i, (name, h) in enumerate(seen) if name in blocks]
        if [name for _, name, _ in inputs] != blocks:
            raise ModelError(f"the decoder layers of {type(self.module).__name__} did not each run once in order; "
                             "adapt the model yourself (docs/analysis.md, 'Your own model')")
        last = inputs[-1][0]
        inside = tuple(f"{b}." for b in blocks)
        final = [h for i, (name, h) in enumerate(seen) if i > last and name in norms and not name.startswith(inside)]
        if not final:
            raise ModelError(f"{type(self.module).__name__} has no norm after its last layer, so h_L (the final "
                             "norm's input) is unknown; adapt the model yourself (docs/analysis.md, 'Your own model')")
        return [h for _, _, h in inputs] + [final[-1]]


def decoder_layers(model: nn.Module, n_layers: int | None) -> list[tuple[str, nn.Module]]:
    """The decoder layers, by name: the modules of the classes the model declares unsplittable
    (``_no_split_modules``), else the children of the ModuleList with one entry per layer."""
    declared = set(getattr(model, "_no_split_modules", None) or ())
    layers = [(n, m) for n, m in model.named_modules() if type(m).__name__ in declared]
    if layers and (n_layers is None or len(layers) == n_layers):
        return layers
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) == n_layers:
            return [(f"{name}.{i}", block) for i, block in enumerate(m)]
    raise ModelError(f"cannot find the {n_layers} decoder layers of {type(model).__name__}; adapt the model "
                     "yourself (docs/analysis.md, 'Your own model')")


def _keep_input(name: str, seen: list[tuple[str, torch.Tensor]]):
    def hook(_module, args, kwargs):
        h = args[0] if args else kwargs.get("hidden_states")
        if isinstance(h, torch.Tensor):
            seen.append((name, h.detach()))
    return hook


@contextlib.contextmanager
def recording_attention(model: nn.Module, records: list[AttentionInputs]) -> Iterator[None]:
    """While inside, every attention call of ``model``'s modules is recorded in ``records`` on its way to
    the backend the model was loaded with; other models' calls pass untouched."""
    from transformers import AttentionInterface

    names = {id(m): n for n, m in model.named_modules()}
    original = AttentionInterface.__dict__["get_interface"]

    def get_interface(self, implementation, default):
        backend = original(self, implementation, default)

        def recorded(module, query, key, value, *args, **kwargs):
            if id(module) in names:
                records.append(_attention_inputs(names[id(module)], module, query, key, args, kwargs))
            return backend(module, query, key, value, *args, **kwargs)

        return recorded

    AttentionInterface.get_interface = get_interface
    try:
        yield
    finally:
        AttentionInterface.get_interface = original


def _attention_inputs(name: str, module: nn.Module, q: torch.Tensor, k: torch.Tensor, args: tuple,
                      kwargs: dict) -> AttentionInputs:
    mask = args[0] if args else kwargs.get("attention_mask")
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise ModelError(f"{name}: attention masks of type {type(mask).__name__} (flex attention) cannot be read; "
                         "load the model with attn_implementation='sdpa' or 'eager' to measure it")
    if kwargs.get("position_bias") is not None:
        raise ModelError(f"{name}: attention with a position bias cannot be rebuilt from q and k; adapt the model "
                         "yourself (docs/analysis.md, 'Your own model')")
    window = kwargs.get("sliding_window")
    T, S = q.shape[-2], k.shape[-2]
    if mask is not None and mask.dim() == 2:  # flash attention's key padding mask (B, S): 1 = a real token
        keys = torch.arange(S, device=q.device)
        queries = torch.arange(S - T, S, device=q.device)[:, None]
        allowed = keys <= queries
        if window is not None:
            allowed = allowed & (queries - keys < window)
        mask, window = allowed & mask.bool()[:, None, None, :], None
    elif mask is not None:
        window = None  # a 4-d mask already holds the window
    elif not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        mask = torch.ones(1, 1, T, S, dtype=torch.bool, device=q.device)
    sinks = kwargs.get("s_aux")
    return AttentionInputs(name=name, q=q.detach(), k=k.detach(), mask=None if mask is None else mask.detach(),
                           window=window, scale=kwargs.get("scaling"), softcap=kwargs.get("softcap"),
                           sink_logits=None if sinks is None else sinks.detach())
