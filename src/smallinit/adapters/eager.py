"""Eager attention: a softmax the forward takes over the last axis of (batch, heads, T, S ≥ T) scores, and
which keys each query may see, read off the scores it is taken over rather than off the weights it gives: a
sharp query's weight on a key it may see underflows to exactly 0 (fp16 soonest), and counts as 0 there."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SOFTMAX = {torch.softmax, F.softmax, torch.Tensor.softmax}
MASKED_GAP = 5e3  # a score this far below its row's largest is a mask's (−inf, a dtype's minimum, −1e4, ...)


def attention_scores(func, args: tuple, kwargs: dict, T: int) -> torch.Tensor | None:
    """The scores when ``func(*args, **kwargs)`` is a softmax over the last axis of (batch, heads, T, S ≥ T)
    scores, else None."""
    if func not in SOFTMAX:
        return None
    x = args[0] if args else kwargs.get("input")
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or dim not in (-1, 3):
        return None
    if x.shape[-2] != T or x.shape[-1] < T:  # not (batch, heads, queries, keys) over the tokens
        return None
    return x


def visible(scores: torch.Tensor) -> torch.Tensor:
    """Which keys the queries of eager attention scores (…, T, S) may see: those within ``MASKED_GAP`` of the
    row's largest score. Masks fill with −inf or add a large negative constant, which may be another dtype's
    minimum (fp16's −65504 in an fp32 softmax) or −1e4 (OpenAI-GPT), so no absolute threshold holds; a real
    score that far below its row's largest has weight 0 in any dtype either way."""
    s = scores.detach().float()
    return s.amax(-1, keepdim=True) - s < MASKED_GAP


class EagerMasks(TorchFunctionMode):
    """While inside, the keys each query may see (``visible``) of every eager attention softmax over ``T``
    tokens, in call order, in ``masks``."""

    def __init__(self, T: int):
        super().__init__()
        self.T, self.masks = T, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        scores = attention_scores(func, args, kwargs, self.T)
        if scores is not None:
            self.masks.append(visible(scores))
        return func(*args, **kwargs)
