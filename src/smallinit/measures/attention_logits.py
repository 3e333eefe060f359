"""The largest attention logit per layer: the maximum over sequences, heads, queries and the keys each query may
see of scale·q·k, after position encoding and before soft-capping, any additive bias and the softmax.

Megatron logs it to catch logit growth (QK-clip acts on it): a logit that keeps growing saturates the softmax,
and a small init shrinks it at the start. It needs the queries and keys, so attention observed only as
probabilities (eager softmax read through output_attentions) cannot give it, and is named instead.
"""

from __future__ import annotations

import torch

from smallinit.adapters import AttentionInputs
from smallinit.errors import ModelError
from smallinit.measures.sink import allowed_keys


def max_attention_logits(attention: list[AttentionInputs], *, chunk: int = 256) -> tuple[float, ...]:
    """max scale·q·k per observed attention call (layer), over the keys its mask lets each query see, computed
    over blocks of ``chunk`` queries (O(chunk × T) memory per head)."""
    blind = [a.name for a in attention if a.q is None or a.k is None]
    if blind:
        raise ModelError(
            f"attention of {blind[0]}{f' and {len(blind) - 1} more' if len(blind) > 1 else ''} was read as "
            "probabilities only, so its logits q·k are not observed"
        )
    out = []
    for att in attention:
        q, k = att.q.float(), att.k.float()
        T, S, rep = q.shape[-2], k.shape[-2], q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        scale = att.scale if att.scale is not None else q.shape[-1] ** -0.5
        top = -torch.inf
        for lo in range(0, T, chunk):
            hi = min(lo + chunk, T)
            s = (q[:, :, lo:hi] @ k.transpose(-2, -1)) * scale
            s = s.masked_fill(~allowed_keys(att, lo, hi, S, q.device).expand_as(s), -torch.inf)
            top = max(top, s.max().item())
        out.append(float(top))
    return tuple(out)
