"""Internal states of one forward pass, for analysis, read through module hooks.

The forward of the model stays the paper's equations: what analysis needs is observed from outside while
``Transformer.forward(..., capture=...)`` runs, and the hooks are gone afterwards.

* ``"hidden"``: h_0 = E[tokens] (the embedding's output), then each block's output; h_L is the final norm's
  input;
* ``"norms"``: the input of each of the model's RMSNorms (``blocks.i.attn_norm``, ``blocks.i.mlp_norm``,
  the per-head ``blocks.i.attn.q_norm``/``k_norm`` with QK-norm, ``norm``), by module name;
* ``"qk"``: per layer, the queries and keys after RoPE, as they enter attention;
* ``"attn"``: per layer, the attention probabilities softmax(q kᵀ/√d + causal mask), computed from those
  queries and keys (the forward itself uses the fused kernel).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from smallinit.model.norm import RMSNorm

KINDS = ("hidden", "norms", "qk", "attn")


@dataclass
class Captured:
    hidden: list[torch.Tensor] = field(default_factory=list)
    norms: dict[str, torch.Tensor] = field(default_factory=dict)
    qk: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    attn: list[torch.Tensor] = field(default_factory=list)


def check_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    kinds = tuple(kinds)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown capture {sorted(unknown)}; choose from {KINDS}")
    return kinds


def attention_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal softmax(q kᵀ/√d) in fp32, (B, H, T, T); grouped keys are repeated to the query heads."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    T = q.shape[-2]
    scores = (q.float() @ k.float().transpose(-2, -1)) * q.shape[-1] ** -0.5
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


@contextlib.contextmanager
def capturing(model: nn.Module, kinds: Iterable[str]) -> Iterator[Captured]:
    """Hooks on ``model`` (a Transformer) that fill a :class:`Captured` while the block runs."""
    kinds, got, handles = set(kinds), Captured(), []

    def on(module: nn.Module, hook, *, pre: bool = False) -> None:
        handles.append(module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook))

    if "hidden" in kinds:
        on(model.embed, lambda _m, _args, out: got.hidden.append(out.detach()))
        for block in model.blocks:
            on(block, lambda _m, _args, out: got.hidden.append(out[0].detach()))
    if "norms" in kinds:
        for name, norm in model.named_modules():
            if isinstance(norm, RMSNorm):
                on(norm, lambda _m, args, name=name: got.norms.__setitem__(name, args[0].detach()), pre=True)
    if kinds & {"qk", "attn"}:

        def take(_m, args):
            q, k = args[0].detach(), args[1].detach()
            if "qk" in kinds:
                got.qk.append((q, k))
            if "attn" in kinds:
                got.attn.append(attention_probs(q, k))

        for block in model.blocks:
            on(block.attn.sdpa, take, pre=True)
    try:
        yield got
    finally:
        for handle in handles:
            handle.remove()
