"""Hugging Face architectures from tiny configs, each with what the measurements must get right (GQA, sliding
windows, soft-caps, (1 + w) norms, learned sinks), loaded with weights that make those differences show."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from smallinit.adapters import as_adapter

transformers = pytest.importorskip("transformers")

T, WINDOW = 16, 6  # a sliding window shorter than the sequence: queries 7… cannot see token 1

GET_INTERFACE = transformers.AttentionInterface.__dict__["get_interface"]  # as transformers defines it


@dataclasses.dataclass
class Arch:
    name: str
    build: object  # () -> config
    model_class: str
    final_norm: str
    offset_norms: bool = False  # norms scale by (1 + w) (the modeling source says so)
    sliding: tuple[int, ...] = ()  # which layers use the sliding window
    implementation: str = "sdpa"  # the backend it is loaded with (Gemma-2's soft-cap has no sdpa path)


def _common(**kw):
    return dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        **kw,
    )


ARCHS = [
    Arch(
        "llama",
        lambda: transformers.LlamaConfig(**_common(num_key_value_heads=4, rms_norm_eps=1e-3)),
        "LlamaForCausalLM",
        "model.norm",
    ),
    Arch(
        "mistral-gqa-sliding",
        lambda: transformers.MistralConfig(
            **_common(num_key_value_heads=2, rms_norm_eps=1e-3, sliding_window=WINDOW)
        ),
        "MistralForCausalLM",
        "model.norm",
        sliding=(0, 1),
    ),
    Arch(
        "gemma3-sliding-1+w",
        lambda: transformers.Gemma3TextConfig(
            **_common(
                num_key_value_heads=2,
                head_dim=8,
                rms_norm_eps=1e-3,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention"],
                query_pre_attn_scalar=16,
            )
        ),
        "Gemma3ForCausalLM",
        "model.norm",
        offset_norms=True,
        sliding=(0,),
    ),
    Arch(
        "gemma2-softcap",
        lambda: transformers.Gemma2Config(
            **_common(
                num_key_value_heads=2,
                head_dim=8,
                rms_norm_eps=1e-3,
                sliding_window=WINDOW,
                attn_logit_softcapping=2.0,
                layer_types=["sliding_attention", "full_attention"],
            )
        ),
        "Gemma2ForCausalLM",
        "model.norm",
        offset_norms=True,
        sliding=(0,),
        implementation="eager",
    ),
    Arch(
        "qwen3-moe",
        lambda: transformers.Qwen3MoeConfig(
            **_common(
                num_key_value_heads=2,
                head_dim=8,
                rms_norm_eps=1e-3,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
            )
        ),
        "Qwen3MoeForCausalLM",
        "model.norm",
    ),
    Arch(
        "mixtral",
        lambda: transformers.MixtralConfig(
            **_common(num_key_value_heads=2, rms_norm_eps=1e-3, num_local_experts=4, num_experts_per_tok=2)
        ),
        "MixtralForCausalLM",
        "model.norm",
    ),
    Arch(
        "qwen3-next-gated",
        lambda: transformers.Qwen3NextConfig(
            **_common(
                num_key_value_heads=2,
                head_dim=8,
                rms_norm_eps=1e-3,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
                layer_types=["linear_attention", "full_attention"],
            )
        ),
        "Qwen3NextForCausalLM",
        "model.norm",
        offset_norms=True,
    ),
    Arch(
        "gpt-oss-sinks",
        lambda: transformers.GptOssConfig(
            **_common(
                num_key_value_heads=2,
                head_dim=8,
                rms_norm_eps=1e-3,
                sliding_window=WINDOW,
                num_local_experts=4,
                num_experts_per_tok=2,
                layer_types=["sliding_attention", "full_attention"],
            )
        ),
        "GptOssForCausalLM",
        "model.norm",
        sliding=(0,),
        implementation="eager",
    ),
    Arch(
        "gpt2",
        lambda: transformers.GPT2Config(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, layer_norm_epsilon=1e-3
        ),
        "GPT2LMHeadModel",
        "transformer.ln_f",
    ),
]


def model(arch: Arch):
    torch.manual_seed(0)
    config = arch.build()
    config._attn_implementation = arch.implementation
    model = getattr(transformers, arch.model_class)(config).eval()
    with torch.no_grad():
        for m in as_adapter(
            model
        ).norms():  # norm weights away from their neutral value: the (1 + w) form matters
            w = model.get_submodule(m).weight
            w.copy_(torch.rand(w.shape, generator=torch.Generator().manual_seed(1)) + 0.5)
        for name, p in model.named_parameters():  # peaked attention, so scale, soft-cap and mask all matter
            if any(k in name for k in ("q_proj.weight", "k_proj.weight", "c_attn.weight")):
                p.mul_(12.0)
            if name.endswith("sinks"):  # learned sink logits that take a visible share
                p.copy_(torch.linspace(-1.0, 2.0, p.numel()))
    return model


def ids(batch: int = 2):
    return torch.randint(
        1, 96, (batch, T), generator=torch.Generator().manual_seed(0)
    )  # 0 pads: a zero embedding
