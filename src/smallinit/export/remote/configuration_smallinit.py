"""Configuration of a smallinit decoder for Hugging Face ``transformers`` (loaded with trust_remote_code).

This file and modeling_smallinit.py are copied into every folder written by ``smallinit export-hf`` for
models that no stock transformers class reproduces exactly (headwise gates, elementwise gates without
QK-norm, mixture-of-experts). They depend on torch and transformers only.
"""

from transformers import PretrainedConfig


class SmallinitConfig(PretrainedConfig):
    """Pre-norm decoder: RMSNorm x·rsqrt(mean(x²)+ε)·w, full rotate-half RoPE, optional per-head QK-norm,
    optional sigmoid output gate (``attn_output_gate`` none | headwise | elementwise), SwiGLU or MoE."""

    model_type = "smallinit"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 8192,
        hidden_size: int = 64,
        intermediate_size: int = 256,
        num_hidden_layers: int = 6,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 4,
        max_position_embeddings: int = 512,
        rms_norm_eps: float = 1e-12,
        rope_theta: float = 10000.0,
        attn_output_gate: str = "elementwise",
        qk_norm: bool = False,
        num_experts: int = 0,
        num_experts_per_tok: int = 2,
        moe_intermediate_size: int = 256,
        moe_shared_expert: bool = False,
        moe_every_n_layers: int = 1,
        moe_score: str = "softmax",
        initializer_gamma: float = 1.0,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        **kwargs,
    ):
        if attn_output_gate not in ("none", "headwise", "elementwise"):
            raise ValueError(
                f"attn_output_gate must be none, headwise or elementwise, got {attn_output_gate!r}"
            )
        if hidden_size % num_attention_heads or num_attention_heads % num_key_value_heads:
            raise ValueError(
                "num_attention_heads must divide hidden_size and num_key_value_heads must divide it"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.attn_output_gate = attn_output_gate
        self.qk_norm = qk_norm
        self.num_experts = num_experts  # 0 → every feed-forward is a dense SwiGLU
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.moe_shared_expert = moe_shared_expert
        self.moe_every_n_layers = moe_every_n_layers
        self.moe_score = moe_score
        self.initializer_gamma = initializer_gamma  # weights of a fresh model: N(0, d_in^(−2γ))
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
