"""The model presets: named [model] sections as plain data, which ``ModelConfig.preset`` builds and checks."""

from __future__ import annotations

from typing import Any

# Our shape guesses (the paper gives sizes, not shapes; 1.5b has d_model 2048 as in its Fig. 1c).
# Parameter counts are computed by `smallinit info --preset NAME`; see the README for the table.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-1m": dict(
        d_model=64, n_layers=6, n_heads=4, n_kv_heads=4, d_ff=256, vocab_size=8192, max_seq_len=256
    ),
    "cpu-5m": dict(
        d_model=192, n_layers=8, n_heads=6, n_kv_heads=6, d_ff=512, vocab_size=8192, max_seq_len=512
    ),
    "cpu-20m": dict(
        d_model=384, n_layers=8, n_heads=6, n_kv_heads=6, d_ff=1152, vocab_size=8192, max_seq_len=512
    ),
    "0.1b": dict(
        d_model=640,
        n_layers=12,
        n_heads=10,
        n_kv_heads=10,
        d_ff=1728,
        vocab_size=32768,
        max_seq_len=2048,
        tie_embeddings=False,
    ),
    "0.3b": dict(
        d_model=1024,
        n_layers=16,
        n_heads=16,
        n_kv_heads=16,
        d_ff=2816,
        vocab_size=32768,
        max_seq_len=2048,
        tie_embeddings=False,
    ),
    "0.5b": dict(
        d_model=1280,
        n_layers=18,
        n_heads=10,
        n_kv_heads=10,
        d_ff=3456,
        vocab_size=32768,
        max_seq_len=2048,
        tie_embeddings=False,
    ),
    "1b": dict(
        d_model=1792,
        n_layers=20,
        n_heads=14,
        n_kv_heads=14,
        d_ff=4864,
        vocab_size=32768,
        max_seq_len=2048,
        tie_embeddings=False,
    ),
    "1.5b": dict(
        d_model=2048,
        n_layers=24,
        n_heads=16,
        n_kv_heads=16,
        d_ff=5504,
        vocab_size=32768,
        max_seq_len=2048,
        tie_embeddings=False,
    ),
    # MoE (our shapes): fine-grained experts, 64 per layer, top-6 softmax routing, every layer MoE, no shared
    # expert; d_ff = top_k · d_expert, so a dense layer (moe.every_n_layers > 1) costs what an MoE layer does.
    # Counts by `smallinit info --preset NAME`: 1.48B total / 0.25B active; 3.06B / 0.50B.
    "moe-1.5b-a0.25b": dict(
        d_model=768,
        n_layers=24,
        n_heads=6,
        n_kv_heads=6,
        d_ff=2304,
        vocab_size=32768,
        max_seq_len=2048,
        tie_embeddings=False,
        moe=dict(num_experts=64, top_k=6, d_expert=384),
    ),
    "moe-3b-a0.5b": dict(
        d_model=1024,
        n_layers=32,
        n_heads=8,
        n_kv_heads=8,
        d_ff=2688,
        vocab_size=32768,
        max_seq_len=2048,
        tie_embeddings=False,
        moe=dict(num_experts=64, top_k=6, d_expert=448),
    ),
    # tiny MoE for CPU tests and demos: 8 experts, top-2
    "cpu-moe-1m": dict(
        d_model=64,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        d_ff=128,
        vocab_size=8192,
        max_seq_len=256,
        moe=dict(num_experts=8, top_k=2, d_expert=64),
    ),
    "cpu-moe-5m": dict(
        d_model=128,
        n_layers=6,
        n_heads=4,
        n_kv_heads=4,
        d_ff=384,
        vocab_size=8192,
        max_seq_len=512,
        moe=dict(num_experts=8, top_k=2, d_expert=192),
    ),
}
PRESET_ALIASES = {"tiny": "cpu-1m"}
