"""Causal self-attention: RoPE, grouped-query SDPA, optional QK-norm, optional output gate.

The gate (Qiu et al. 2025, position G1) multiplies each head's SDPA output by sigmoid(x W_θ), where x is the
same normalised hidden state that feeds Q/K/V, so the gate depends on the query token. "headwise" learns one
scalar per head, "elementwise" one per channel. It lets a head output ~0 without parking its attention on
the first token, which is what small init otherwise encourages (the attention sink).

For decoding, a :class:`KVCache` keeps every layer's keys and values of the positions seen so far, so each
new token costs one position's projections and one row of attention instead of a forward over the prefix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from smallinit.model.norm import RMSNorm


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (max_seq_len, head_dim) for the rotate-half convention, in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, hd) by position: x·cos + rotate_half(x)·sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class KVCache:
    """Keys and values (after RoPE) of every layer for the first ``length`` positions, preallocated up to the
    context length. Each layer's attention stores its new positions; the model advances ``length`` once all
    layers have."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self._mask: torch.Tensor | None = None

    def mask(self, T: int) -> torch.Tensor | None:
        """The mask of T new queries after the cached positions: query i sits at position length + i and sees
        keys 0 … length + i (SDPA's is_causal aligns top-left, so it cannot say this). None while nothing is
        cached, where is_causal is right. Built once per forward and shared by every layer."""
        if not self.length:
            return None
        if self._mask is None or self._mask.shape != (T, self.length + T):
            self._mask = torch.ones(T, self.length + T, dtype=torch.bool, device=self.keys.device).tril(
                self.length
            )
        return self._mask

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H_kv, T, hd) after the cached positions; return the layer's keys and values so far."""
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


class ScaledDotProductAttention(nn.Module):
    """softmax(q kᵀ/√d + mask) v through PyTorch's fused kernel, causal unless a mask is given. A module of
    its own so that analysis can observe the queries and keys after RoPE (model/capture.py)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
        gqa = k.shape[1] != q.shape[1]
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class Attention(nn.Module):
    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, *, gate: str, qk_norm: bool, norm_eps: float
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.gate = gate
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        if gate != "none":  # W_θ
            self.g_proj = nn.Linear(
                d_model, n_heads * (self.head_dim if gate == "elementwise" else 1), bias=False
            )
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, norm_eps)
            self.k_norm = RMSNorm(self.head_dim, norm_eps)
        self.qk_norm = qk_norm
        self.sdpa = ScaledDotProductAttention()

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        """``cos``/``sin`` are the rows of x's positions; with ``cache``, x continues the cached positions."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        mask = None
        if cache is not None:
            mask = cache.mask(T)
            k, v = cache.store(layer, k, v)
        y = self.sdpa(q, k, v, mask)

        if self.gate != "none":
            g = torch.sigmoid(self.g_proj(x).float()).to(y.dtype)  # (B, T, H·hd) or (B, T, H)
            g = g.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, hd or 1)
            y = y * g
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))
