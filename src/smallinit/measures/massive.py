"""Massive activations (Sun et al., 2024): a few dimensions of the residual stream that carry values hundreds to
thousands of times the typical one, on a few tokens (often the first), acting as fixed biases that go with the
attention sink.

Per layer (the residual stream after each block, h_1 … h_L): the ratio max |h| / median |h| over every token and
dimension of the batch, and the dimensions that hold activations of at least :data:`MASSIVE_RATIO` × the median
on some token, largest first. A ratio near the few units a Gaussian gives means none formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASSIVE_RATIO = 100.0  # Sun et al.'s threshold: at least 100× the median magnitude
MAX_DIMS = 8  # the dimensions listed per layer


@dataclass(frozen=True)
class MassiveActivations:
    ratio: tuple[float, ...]  # per layer, max |h| / median |h|
    dims: tuple[tuple[int, ...], ...] = ()  # per layer, the dimensions holding a massive activation


def massive_activations(residual: list[torch.Tensor]) -> MassiveActivations:
    """From the residual stream as an adapter observes it: e, each later block's input, then h_L."""
    ratio, dims = [], []
    for h in residual[1:]:
        a = h.detach().float().abs().flatten(0, -2)  # (tokens, d)
        median = a.median()
        ratio.append((a.max() / median).item())
        peak = a.max(dim=0).values  # per dimension, its largest |h| over tokens
        order = peak.argsort(descending=True)[:MAX_DIMS]
        dims.append(tuple(int(i) for i in order if peak[i] >= MASSIVE_RATIO * median))
    return MassiveActivations(tuple(ratio), tuple(dims))
