"""Attention sink scores (the paper's Fig. 1f/g), without materialising attention matrices.

Sink score of layer l (our definition; the paper does not fix the positions): the mean over sequences,
heads and query positions i ≥ 2 (1-based) of the attention weight on key position 1. Query 1 is excluded:
it can only attend to itself.

From the post-RoPE queries and keys (capture "qk") the weight of query i on key 0 (0-based) is
exp(s_i0 − logsumexp_{j≤i} s_ij), s = q·k/√head_dim. The log-sum-exp is computed over blocks of
``chunk`` queries, so memory is O(chunk × T) per head instead of O(T²).

Beside it, the sink literature's metric (Gu et al., ICLR 2025): Sink_ε, the share of (layer, head) pairs
whose mean attention on the first token exceeds ε (they report ε = 0.3), so numbers compare with theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass
class SinkScores:
    per_layer: list[float]  # one score per layer
    per_head: np.ndarray  # (layers, heads)

    @property
    def mean(self) -> float:
        return float(np.mean(self.per_layer))

    def share_above(self, eps: float) -> float:
        """Sink_ε: the share of (layer, head) pairs whose mean attention on the first token exceeds ε."""
        return float(np.mean(self.per_head > eps))

    def to_dict(self) -> dict:
        return {
            "per_layer": self.per_layer,
            "per_head": self.per_head.tolist(),
            "mean": self.mean,
            "share_above": {str(eps): self.share_above(eps) for eps in SINK_EPS},
        }


SINK_EPS = (0.3, 0.8)  # the thresholds Gu et al. report

def key0_weights(q: torch.Tensor, k: torch.Tensor, *, chunk: int = 256) -> torch.Tensor:
    """Attention weight of every query on key 0 under causal softmax: (B, H, T) for q (B, H, T, hd).

    ``k`` may have fewer heads (grouped-query attention); it is shared across groups as in the model.
    """
    B, H, T, hd = q.shape
    rep = H // k.shape[1]
    k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
    q, k = q.float(), k.float()
    scale = hd**-0.5
    out = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    for lo in range(0, T, chunk):
        hi = min(lo + chunk, T)
        s = (q[:, :, lo:hi] @ k[:, :, :hi].transpose(-2, -1)) * scale  # (B, H, hi−lo, hi)
        causal = torch.arange(hi, device=q.device)[None, :] <= torch.arange(lo, hi, device=q.device)[:, None]
        s = s.masked_fill(~causal, float("-inf"))
        out[:, :, lo:hi] = torch.exp(s[..., 0] - torch.logsumexp(s, dim=-1))
    return out


@torch.no_grad()
def sink_scores(model: nn.Module, tokens: torch.Tensor, *, chunk: int = 256) -> SinkScores:
    """Per-layer and per-head sink scores of ``model`` on ``tokens`` (B, T), T ≥ 2."""
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"sink_scores needs tokens of shape (batch, T ≥ 2), got {tuple(tokens.shape)}")
    return sink_from_qk(model(tokens, capture=("qk",)).qk, chunk=chunk)


def sink_from_qk(qk: list[tuple[torch.Tensor, torch.Tensor]], *, chunk: int = 256) -> SinkScores:
    """Sink scores from captured per-layer (q, k) (``ModelOutput.qk``)."""
    per_head = []
    for q, k in qk:
        w = key0_weights(q, k, chunk=chunk)[:, :, 1:]  # queries i ≥ 2 (1-based)
        per_head.append(w.mean(dim=(0, 2)).double().cpu().numpy())
    heads = np.stack(per_head)
    return SinkScores(per_layer=heads.mean(axis=1).tolist(), per_head=heads)


@torch.no_grad()
def attention_roles(model: nn.Module, tokens: torch.Tensor, marked: torch.Tensor) -> dict[str, list[list[float]]]:
    """Where each head's attention goes, split by query: mean weight on the first token, on the query itself and
    on the token before it, for the queries ``marked`` (B, T bool: e.g. the sink task's triggers) and for the
    others, over queries i ≥ 2 (0-based), where those three keys differ. Keys "first/marked", "first/other",
    "self/…", "previous/…", and "entropy/…" (mean entropy of the attention, nats: diffuse or parked); values
    (layers, heads) as nested lists, NaN where no query is of that kind. Materialises T × T per head: for probes."""
    out: dict[str, list[list[float]]] = {}
    T = tokens.shape[1]
    kinds = {"marked": marked[:, 2:].to(tokens.device)}
    kinds["other"] = ~kinds["marked"]
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    for q, k in model(tokens, capture=("qk",)).qk:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        s = (q.float() @ k.float().transpose(-2, -1)) * q.shape[-1] ** -0.5
        a = s.masked_fill(~causal, float("-inf")).softmax(-1)[:, :, 2:]  # (B, H, T − 2, T): queries 2 … T − 1
        roles = {"first": a[..., 0], "self": torch.diagonal(a[..., 2:], dim1=-2, dim2=-1),
                 "previous": torch.diagonal(a[..., 1:], dim1=-2, dim2=-1),
                 "entropy": -(a * torch.log(a.clamp_min(1e-30))).sum(-1)}
        for name, w in roles.items():  # (B, H, T − 2)
            for kind, sel in kinds.items():
                out.setdefault(f"{name}/{kind}", []).append(
                    [w[:, h][sel].mean().item() if sel.any() else float("nan") for h in range(w.shape[1])])
    return out
