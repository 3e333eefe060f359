"""A tiny Qwen3 at a given γ and ε, sequences with structure to learn, and a run folder's records."""

from __future__ import annotations

import json

import pytest
import torch

from smallinit import gamma_init_, set_norm_eps_

transformers = pytest.importorskip("transformers")


def tiny_qwen3(gamma: float = 1.0, eps: float = 1e-12, seed: int = 0):
    cfg = transformers.Qwen3Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    model = transformers.Qwen3ForCausalLM(cfg)
    gamma_init_(model, gamma, generator=torch.Generator().manual_seed(seed))
    set_norm_eps_(model, eps)
    return model


def tokens(n: int, T: int = 33, seed: int = 0) -> torch.Tensor:
    """Sequences with structure to learn: each token is the previous plus one (mod 256), from a random start."""
    start = torch.randint(0, 256, (n, 1), generator=torch.Generator().manual_seed(seed))
    return (start + torch.arange(T)) % 256


def records(folder, event="analysis"):
    return [
        r
        for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
        if r.get("event") == event
    ]
