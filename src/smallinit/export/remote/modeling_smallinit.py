"""A smallinit decoder as a Hugging Face ``transformers`` causal LM (loaded with trust_remote_code).

Same computation as smallinit.model.Transformer, parameter for parameter:

    h_0 = E[tokens];  h ← h + Attn(Norm(h));  h ← h + FFN(Norm(h));  logits = Norm(h) Wᵀ

RMSNorm is x·rsqrt(mean(x²)+ε)·w in fp32; RoPE is rotate-half over the full head with angles computed in
fp64; the output gate multiplies each head's attention output by sigmoid(x W_θ) before o_proj, where x is
the normalised input of the attention block. Depends on torch and transformers (>= 5) only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as hf_init  # initialisers that skip tensors loaded from a checkpoint
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from smallinit.export.remote.configuration_smallinit import SmallinitConfig

# the output's cache is `cache` from transformers 5.24, `past_key_values` before; this file runs on the loader's own
# release, whichever it is
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class SmallinitRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


def rope_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, 1, T, head_dim) for the rotate-half convention (angles in fp64, as in training)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float64, device=position_ids.device) / head_dim
    )
    angles = position_ids.to(torch.float64)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


class SmallinitAttention(nn.Module):
    def __init__(self, config: SmallinitConfig, layer_idx: int):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            hd,
        )
        self.gate = config.attn_output_gate
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)
        if self.gate != "none":  # W_θ
            self.g_proj = nn.Linear(d, self.n_heads * (hd if self.gate == "elementwise" else 1), bias=False)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = SmallinitRMSNorm(hd, config.rms_norm_eps)
            self.k_norm = SmallinitRMSNorm(hd, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask: torch.Tensor | None, cache: Cache | None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and T > 1,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )
        if self.gate != "none":
            g = torch.sigmoid(self.g_proj(x).float()).to(y.dtype)
            y = y * g.view(B, T, self.n_heads, -1).transpose(1, 2)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class SmallinitMLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SmallinitMoE(nn.Module):
    """Top-k router over E SwiGLU experts with batched (E, out, in) weights, plus an optional shared expert.

    scores = softmax or sigmoid of the router logits (fp32); the top-k scores are renormalised to sum 1 when
    k > 1. Dropless: each token's output depends on that token only.
    """

    def __init__(self, config: SmallinitConfig):
        super().__init__()
        E, d, d_e = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.top_k, self.score = E, config.num_experts_per_tok, config.moe_score
        self.router = nn.Linear(d, E, bias=False)
        self.gate_proj = nn.Parameter(torch.empty(E, d_e, d))
        self.up_proj = nn.Parameter(torch.empty(E, d_e, d))
        self.down_proj = nn.Parameter(torch.empty(E, d, d_e))
        self.shared_expert = SmallinitMLP(d, d_e) if config.moe_shared_expert else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, k = x.shape, self.top_k
        x = x.reshape(-1, shape[-1])
        logits = F.linear(x.float(), self.router.weight.float())
        scores = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()
        weights, experts = scores.topk(k, dim=-1)
        if k > 1:
            weights = weights / weights.sum(-1, keepdim=True)
        flat = experts.flatten()
        order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        xs = x[order // k]
        outs = []
        for e, xe in enumerate(xs.split(counts)):  # one matmul per expert, never a loop over tokens
            outs.append((F.silu(xe @ self.gate_proj[e].T) * (xe @ self.up_proj[e].T)) @ self.down_proj[e].T)
        ys = torch.cat(outs)
        y = torch.zeros_like(ys).index_copy(0, order, ys).view(-1, k, shape[-1])
        y = (y * weights.unsqueeze(-1).to(y.dtype)).sum(1)
        if self.shared_expert is not None:
            y = y + self.shared_expert(x)
        return y.view(shape)


class SmallinitDecoderLayer(nn.Module):
    def __init__(self, config: SmallinitConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = SmallinitRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SmallinitAttention(config, layer_idx)
        self.post_attention_layernorm = SmallinitRMSNorm(config.hidden_size, config.rms_norm_eps)
        n = config.moe_every_n_layers
        if config.num_experts > 0 and layer_idx % n == n - 1:
            self.mlp = SmallinitMoE(config)
        else:
            self.mlp = SmallinitMLP(config.hidden_size, config.intermediate_size)

    def forward(self, h, cos, sin, mask, cache):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class SmallinitPreTrainedModel(PreTrainedModel):
    config_class = SmallinitConfig
    base_model_prefix = "model"
    _no_split_modules = ["SmallinitDecoderLayer"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        """A fresh model follows the γ rule: every matrix N(0, d_in^(−2γ)), norms 1 (weights from a checkpoint
        are loaded over this)."""
        gamma = self.config.initializer_gamma
        if isinstance(module, SmallinitMoE):
            for p in (module.gate_proj, module.up_proj, module.down_proj):
                hf_init.normal_(p, mean=0.0, std=p.shape[-1] ** -gamma)
        elif isinstance(module, nn.Linear):
            hf_init.normal_(module.weight, mean=0.0, std=module.in_features**-gamma)
        elif isinstance(module, nn.Embedding):
            hf_init.normal_(module.weight, mean=0.0, std=module.embedding_dim**-gamma)
        elif isinstance(module, SmallinitRMSNorm):
            hf_init.ones_(module.weight)


class SmallinitModel(SmallinitPreTrainedModel):
    def __init__(self, config: SmallinitConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(SmallinitDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = SmallinitRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def forward(self, h: torch.Tensor, position_ids: torch.Tensor, mask, cache) -> torch.Tensor:
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, cache)
        return self.norm(h)


def attention_mask_4d(attention_mask: torch.Tensor | None, T: int, past: int) -> torch.Tensor | None:
    """Boolean (B, 1, T, past+T) mask: causal and not padding. None when plain causal attention is exact."""
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask.bool()
    padded = attention_mask is not None and not bool(attention_mask.all())
    if not padded and (past == 0 or T == 1):
        return None
    S = past + T
    device = attention_mask.device if attention_mask is not None else None
    q_pos = torch.arange(past, S, device=device)[:, None]
    k_pos = torch.arange(S, device=device)[None, :]
    mask = (k_pos <= q_pos)[None, None]
    if padded:
        mask = mask & attention_mask[:, None, None, -S:].bool()
    # a padding query sees no key at all; let it see itself so no row is empty (its output is never used)
    return mask | (k_pos == q_pos)[None, None]


class SmallinitForCausalLM(SmallinitPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: SmallinitConfig):
        super().__init__(config)
        self.model = SmallinitModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values  # the name before transformers 5.24
        h = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = h.shape[:2]
        use_cache = self.config.use_cache and not self.training if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            if attention_mask is not None and attention_mask.dim() == 2:  # left padding shifts positions
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
            else:
                position_ids = torch.arange(past, past + T, device=h.device)[None].expand(B, T)
        mask = attention_mask_4d(attention_mask, T, past)
        h = self.model(h, position_ids, mask, cache if use_cache else None)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(h[:, keep])
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache if use_cache else None})
