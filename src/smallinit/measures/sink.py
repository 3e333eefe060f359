"""Attention sink scores (the paper's Fig. 1f/g), without materialising attention matrices.

Sink score of layer l (our definition; the paper does not fix the positions): the mean over sequences,
heads and query positions i ≥ 2 (1-based) of the attention weight on key position 1, over the queries that
see it (a sliding-window query further than the window from token 1 cannot). Query 1 is excluded: it can
only attend to itself.

From the queries and keys after position encoding (``AttentionInputs``, from any model adapter) the
weight of query i on key 0 (0-based) is exp(s_i0 − logsumexp_j s_ij) over the keys j the mask lets it
see, s = scale·q·k (soft-capped and with learned sink logits where the model has them). The log-sum-exp
is computed over blocks of ``chunk`` queries, so memory is O(chunk × T) per head instead of O(T²).

Its reference is uniform attention: a query that spreads its weight evenly over the keys it may see puts
1/(number of those keys) on key 1 (:func:`uniform_sink`; within a sliding window W, at most W keys), and
each layer's reference is computed from the same mask as its score, so a score near it is no sink.

Beside it, the sink literature's metric (Gu et al., ICLR 2025): Sink_ε, the share of (layer, head) pairs
whose mean attention on the first token exceeds ε (they report ε = 0.3), so numbers compare with theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from smallinit.adapters import AttentionInputs, as_adapter
from smallinit.adapters.protocol import score_modded
from smallinit.errors import ModelError
from smallinit.fields import from_json, to_json


@dataclass(frozen=True)
class Sink:
    """Sink scores of one model: per layer and per head, with their uniform reference (what even attention over
    the same keys gives) and Sink_ε. One forward's, or the mean over batches (:meth:`Activations.mean`)."""

    per_layer: tuple[float, ...]  # the sink score per layer, first layer first
    per_head: tuple[tuple[float, ...], ...] = ()  # per layer, that layer's heads
    mean: float | None = None  # over layers
    layers: tuple[str, ...] = ()  # the attention modules, in order
    uniform: float | None = None  # the score uniform attention would give, averaged over layers
    uniform_per_layer: tuple[float, ...] = ()  # the same per layer, from each layer's own mask
    # Sink_ε: ε → share of (layer, head) pairs whose mean attention on the first token exceeds ε
    share_above: dict[float, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @staticmethod
    def from_dict(raw: Mapping[str, Any], *, strict: bool = True) -> Sink:
        return from_json(Sink, raw, strict=strict, where="sink.")

    def formed(self, seq_len: int) -> bool:
        """Whether a sink formed: some layer above :data:`SINK_RATIO` × uniform attention on ``seq_len`` tokens."""
        return max(self.per_layer) > sink_threshold(seq_len)


SINK_EPS = (0.3, 0.8)  # the thresholds Gu et al. report
SINK_RATIO = 3.0  # a sink has formed when some layer exceeds this multiple of uniform attention


def uniform_sink(seq_len: int, window: int | None = None) -> float:
    """The sink score of uniform attention on causal sequences of ``seq_len`` tokens: query i (1-based,
    i ≥ 2) puts 1/i on token 1, averaged over the queries that see token 1 (with a sliding ``window`` W,
    queries i ≤ W)."""
    last = seq_len if window is None else min(seq_len, window)
    if last < 2:
        raise ValueError(f"no query i ≥ 2 sees token 1 with seq_len={seq_len}, window={window}")
    return float(np.mean([1 / i for i in range(2, last + 1)]))


def sink_shares(per_head) -> dict[float, float]:
    """Sink_ε for each ε of :data:`SINK_EPS`: the share of (layer, head) pairs whose score (``per_head``, per layer
    that layer's heads) exceeds ε."""
    heads = np.concatenate([np.asarray(h, dtype=float) for h in per_head])
    return {eps: float(np.mean(heads > eps)) for eps in SINK_EPS}


def sink_threshold(seq_len: int) -> float:
    """The sink score some layer must exceed for a sink to count as formed."""
    return SINK_RATIO * uniform_sink(seq_len)


def key0_weights(
    att: AttentionInputs, *, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each query's attention weight on key 0, whether it may attend to key 0 at all, and the weight uniform
    attention over the keys it may see would put there: three (B, H, T) tensors (weights in fp32, 0 where
    unseen). Keys with fewer heads (grouped-query attention) are shared across their group of query heads,
    as in the model."""
    if att.probs is not None:
        B, H, T, S = att.probs.shape
        allowed = allowed_keys(att, 0, T, S, att.probs.device).expand(B, H, T, S)
        sees = allowed[..., 0]
        return att.probs[..., 0].float() * sees, sees, sees / allowed.sum(-1).clamp_min(1)
    q, k = att.q.float(), att.k.float()
    B, H, T, hd = q.shape
    S, rep = k.shape[-2], H // k.shape[1]
    k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
    scale = att.scale if att.scale is not None else hd**-0.5
    weight = torch.zeros(B, H, T, dtype=torch.float32, device=q.device)
    uniform = torch.zeros(B, H, T, dtype=torch.float32, device=q.device)
    sees = torch.zeros(B, H, T, dtype=torch.bool, device=q.device)
    for lo in range(0, T, chunk):
        hi = min(lo + chunk, T)
        s = score_modded(
            att.score_mod, (q[:, :, lo:hi] @ k.transpose(-2, -1)) * scale, lo
        )  # (B, H, hi−lo, S)
        if att.softcap:
            s = att.softcap * torch.tanh(s / att.softcap)
        if att.mask is not None and att.mask.dtype != torch.bool:
            s = s + att.mask[..., lo:hi, :].float()
        allowed = allowed_keys(att, lo, hi, S, q.device).expand_as(s)
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        if att.sink_logits is not None:
            lse = torch.logaddexp(lse, att.sink_logits.float().view(1, H, 1))
        seen = allowed[..., 0]
        weight[:, :, lo:hi] = torch.where(seen, torch.exp(s[..., 0] - lse), 0.0)
        sees[:, :, lo:hi] = seen
        uniform[:, :, lo:hi] = seen / allowed.sum(-1).clamp_min(1)
    return weight, sees, uniform


def allowed_keys(att: AttentionInputs, lo: int, hi: int, S: int, device: torch.device) -> torch.Tensor:
    """Which keys queries lo…hi−1 may attend to, broadcastable to (B, H, hi−lo, S)."""
    if att.mask is None:
        T = att.q.shape[-2] if att.q is not None else att.probs.shape[-2]
        # positions after any cached keys
        queries = torch.arange(S - T + lo, S - T + hi, device=device)[:, None]
        keys = torch.arange(S, device=device)[None, :]
        allowed = keys <= queries
        if att.window is not None:
            allowed = allowed & (queries - keys < att.window)
        return allowed
    mask = att.mask[..., lo:hi, :]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2  # additive masks block with the dtype's minimum


@torch.no_grad()
def sink_scores(model, tokens: torch.Tensor, *, chunk: int = 256) -> Sink:
    """Per-layer and per-head sink scores of ``model`` (any model an adapter reads) on ``tokens`` (B, T), T ≥ 2."""
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"sink_scores needs tokens of shape (batch, T ≥ 2), got {tuple(tokens.shape)}")
    observed = as_adapter(model).observe(tokens, kinds=("attention",))
    observed.require("attention")
    return sink_from_attention(observed.attention, chunk=chunk)


def sink_from_attention(attention: list[AttentionInputs], *, chunk: int = 256) -> Sink:
    """Sink scores from observed attention calls (``Observed.attention``), one layer per call."""
    if not attention:
        raise ModelError("no softmax attention was observed, so there is no sink score")
    per_head, uniform = [], []
    for att in attention:
        w, sees, even = key0_weights(att, chunk=chunk)
        w, sees, even = w[:, :, 1:], sees[:, :, 1:], even[:, :, 1:]  # queries i ≥ 2 (1-based)
        per_head.append((w.double().sum(dim=(0, 2)) / sees.sum(dim=(0, 2))).cpu().numpy())
        uniform.append((even.double().sum() / sees.sum()).item())
    return Sink(
        per_layer=tuple(float(h.mean()) for h in per_head),
        per_head=tuple(tuple(h.tolist()) for h in per_head),
        mean=float(np.mean([h.mean() for h in per_head])),
        layers=tuple(a.name for a in attention),
        uniform=float(np.mean(uniform)),
        uniform_per_layer=tuple(uniform),
        share_above=sink_shares(per_head),
    )


@torch.no_grad()
def attention_roles(
    model: torch.nn.Module, tokens: torch.Tensor, marked: torch.Tensor
) -> dict[str, list[list[float]]]:
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
        roles = {
            "first": a[..., 0],
            "self": torch.diagonal(a[..., 2:], dim1=-2, dim2=-1),
            "previous": torch.diagonal(a[..., 1:], dim1=-2, dim2=-1),
            "entropy": -(a * torch.log(a.clamp_min(1e-30))).sum(-1),
        }
        for name, w in roles.items():  # (B, H, T − 2)
            for kind, sel in kinds.items():
                out.setdefault(f"{name}/{kind}", []).append(
                    [w[:, h][sel].mean().item() if sel.any() else float("nan") for h in range(w.shape[1])]
                )
    return out
