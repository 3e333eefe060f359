"""Softmax attention of no library: q/k/v/o projections around a causal SDPA, as the gate's tests build it."""

from __future__ import annotations

import torch
from torch import nn


class SoftmaxAttention(nn.Module):
    """q/k/v/o projections around a causal softmax; ``own_init`` gives it an init of its own, as torchtitan's
    modules have (init_states), which its model's init calls after to_empty."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (
            p(x).view(B, T, self.num_heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, d))


def decoder(n: int = 3) -> nn.Sequential:
    """``n`` attention blocks in a row (no init of their own)."""
    return nn.Sequential(*(SoftmaxAttention() for _ in range(n)))
