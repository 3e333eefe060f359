"""Model FLOPs of a training step: what MFU is measured against (benchmarks/) and what a plan costs
(smallinit.study.planning.cost)."""

from __future__ import annotations

from torch import nn


def matmul_params(model: nn.Module) -> int:
    """Weights one token multiplies with in a forward pass.

    Every ``nn.Linear`` weight, the LM head included (also when tied to the embedding: the lookup is free
    but the head is a d_model × vocab matmul), and MoE experts scaled by the fraction one token uses
    (``active_fraction``: top_k / num_experts). Embedding lookups and norm weights are not matmuls.
    """
    total = 0
    for mod in model.modules():
        if isinstance(mod, nn.Embedding):
            continue
        for name, p in mod.named_parameters(recurse=False):
            if p.dim() < 2:
                continue
            frac = mod.active_fraction(name) if hasattr(mod, "active_fraction") else 1.0
            total += round(p.numel() * frac)
    return total


def train_flops_per_token(model: nn.Module, seq_len: int, *, causal: bool = True) -> float:
    """Model FLOPs of one training step (forward + backward) per token.

        6 · N_matmul  +  12 · L · T · d_attn · (1/2 if causal)

    6·N: a weight of N entries costs 2N FLOPs per token forward and 4N backward (gradients of the input and
    of the weight). Attention: per layer and token, q·kᵀ over T keys and the probabilities times v are
    2·T·d_attn FLOPs each forward (d_attn = n_heads · head_dim), so 4·T·d_attn forward, 12·T·d_attn in
    training; under the causal mask a query sees (T+1)/2 keys on average, so half of that is counted
    (the PaLM convention counts the full 12·L·T·d; ours is the smaller, stricter number). Recomputation
    (activation checkpointing) is not counted: these are model FLOPs, not hardware FLOPs.
    """
    cfg = model.config
    d_attn = cfg.n_heads * cfg.head_dim
    attention = 12.0 * cfg.n_layers * seq_len * d_attn * (0.5 if causal else 1.0)
    return 6.0 * matmul_params(model) + attention
