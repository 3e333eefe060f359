"""d_in is the size of the contracted axis as the forward sees it, through the views, splits and merges
between a parameter's storage and its use. Each draw is checked against the gain of the contraction the
forward itself performs (mean square out / mean square in = d_in·σ², so at γ = 1 σ must be 1/d_in),
measured on the tensors the forward passes, not on smallinit's own record."""

import pytest
import torch
from torch import nn

from smallinit import as_out_in, gamma_init_, param_roles

G = torch.Generator().manual_seed(1)


def gain_d_in(contract, x_shape, w: torch.Tensor) -> float:
    """d_in read from a contraction's gain on unit inputs: (mean y² / mean x²) / σ²."""
    x = torch.randn(x_shape, generator=G)
    y = contract(x)
    return (y.pow(2).mean() / x.pow(2).mean()).item() / w.std().item() ** 2


def assert_drawn_for(w: torch.Tensor, d_in: float) -> None:
    # γ = 1: σ = 1/d_in; a sample std is off by ~1/sqrt(2n), and the gain estimate by a few %
    assert w.std().item() * d_in == pytest.approx(1.0, rel=0.1)


def tiny_dbrx():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DbrxConfig(d_model=64, n_heads=4, n_layers=1, max_seq_len=64, vocab_size=128)
    cfg.attn_config.kv_n_heads = 2
    cfg.attn_config.clip_qkv = 8.0  # with None transformers' own DBRX forward fails
    cfg.attn_config.rope_theta = 10000.0  # read by DbrxAttention, absent from its config's defaults
    cfg.ffn_config.ffn_hidden_size, cfg.ffn_config.hidden_size, cfg.ffn_config.moe_top_k = 32, 64, 2
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def test_dbrx_merged_experts_drawn_with_the_ffn_as_d_in():
    model = tiny_dbrx()
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0)).by_name()
    mlp = model.transformer.blocks[0].ffn.experts.mlp  # w1, v1, w2 stored (experts · ffn, d) = (128, 64)
    seen = {}
    hook = mlp.register_forward_pre_hook(lambda m, args: seen.setdefault("w", args[1:]) and None)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 128, (1, 8), generator=G))
    hook.remove()
    w1, v1, w2 = seen["w"]  # one expert's weights, as the forward hands them to DbrxExpertGLU
    assert w2.shape == (32, 64)
    d_in = gain_d_in(lambda h: h.matmul(w2), (4096, w2.shape[0]), mlp.w2)  # down_proj = h @ w2: contracts ffn
    assert d_in == pytest.approx(32, rel=0.1)
    assert_drawn_for(mlp.w2, d_in)
    assert report["transformer.blocks.0.ffn.experts.mlp.w2"].fan_in == 32
    assert_drawn_for(mlp.w1, gain_d_in(lambda x: x.matmul(w1.T), (4096, 64), mlp.w1))  # x @ w1ᵀ: contracts d
    # the (out, in) matrices the measurements read are the forward's: one per expert, ffn the input axis
    role = param_roles(model)["transformer.blocks.0.ffn.experts.mlp.w2"]
    assert as_out_in(mlp.w2, role).shape == (4, 64, 32)


class Views(nn.Module):
    """Parameters the forward reshapes before contracting them."""

    def __init__(self):
        super().__init__()
        self.split = nn.Parameter(torch.empty(4 * 8, 16))  # experts · ffn merged, seen as (4, 8, 16)
        self.merged = nn.Parameter(torch.empty(4, 8, 16))  # (heads, head_dim, out), heads merged on use
        self.square = nn.Parameter(torch.empty(16, 16))  # used as W and as Wᵀ: 16 contracted both ways
        self.ragged = nn.Parameter(torch.empty(16, 32))  # contracted at 16 in one use, at 32 in another

    def split_out(self, h):  # h: (4, tokens, 8) → (4, tokens, 16)
        return torch.bmm(h, self.split.view(4, 8, 16))

    def merged_out(self, x):  # x: (tokens, 32) → (tokens, 16)
        return x @ self.merged.reshape(32, 16)

    def forward(self, x):  # x: (tokens, 16)
        y = self.split_out(x[:, :8].expand(4, -1, -1)).sum(0) + self.merged_out(torch.cat([x, x], -1))
        return (y @ self.square) @ self.square.T + x @ self.ragged @ self.ragged.T


def test_a_module_that_views_a_merged_axis_gets_the_contracted_size():
    m = Views()
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(7.0)  # what the draw replaces
    report = gamma_init_(
        m, 1.0, generator=torch.Generator().manual_seed(0), example_inputs=torch.zeros(5, 16)
    ).by_name()
    d_split = gain_d_in(m.split_out, (4, 2048, 8), m.split)
    d_merged = gain_d_in(m.merged_out, (2048, 32), m.merged)
    assert (round(d_split), round(d_merged)) == (8, 32)
    assert_drawn_for(m.split, d_split)
    assert_drawn_for(m.merged, d_merged)
    assert report["square"].fan_in == 16 and report["square"].rule == "normal"
    # uses that disagree on d_in: kept, and said why, never one of the two guessed
    assert report["ragged"].rule == "kept" and "different sizes (16, 32)" in report["ragged"].reason
    roles = param_roles(m, torch.zeros(5, 16))
    assert as_out_in(m.split, roles["split"]).shape == (4, 16, 8)
    assert as_out_in(m.merged, roles["merged"]).shape == (16, 32)


def test_xlnet_merged_heads_output_projection_drawn():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.XLNetLMHeadModel(
        transformers.XLNetConfig(d_model=64, n_layer=1, n_head=4, d_inner=128, vocab_size=256)
    )
    attn = model.transformer.layer[0].rel_attn
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0)).by_name()
    # o: (d_model, heads, head_dim), applied as einsum("ibnd,hnd->ibh"): heads × head_dim contracted
    d_in = gain_d_in(lambda a: torch.einsum("ibnd,hnd->ibh", a, attn.o), (256, 8, 4, 16), attn.o)
    assert report["transformer.layer.0.rel_attn.o"].fan_in == 64
    assert_drawn_for(attn.o, d_in)
    # r, the relative-position projection: einsum("ibh,hnd->ibnd") contracts d_model
    assert_drawn_for(
        attn.r, gain_d_in(lambda p: torch.einsum("ibh,hnd->ibnd", p, attn.r), (256, 8, 64), attn.r)
    )


def test_inkling_relative_position_projection_drawn_with_d_rel():
    # proj (d_rel, rel_extent) = (16, 512) is applied as relative_states @ proj: the forward contracts d_rel;
    # each distance's bias then gathers one column. Measured on the valid distances only (the rest are
    # masked to 0 and would dilute the gain), d_in is d_rel, not rel_extent.
    hf_tiny = pytest.importorskip("support.hf_tiny")
    model = hf_tiny.build("inkling_text")
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0)).by_name()
    rel = model.model.layers[0].self_attn.rel_logits_proj
    assert tuple(rel.proj.shape) == (16, 512)
    pos = torch.arange(64)

    def contract(rs):
        bias = rel(rs, pos, pos)  # (batch, heads, q, k)
        valid = (pos[:, None] - pos[None, :] >= 0).expand_as(bias)
        return bias[valid]

    d_in = gain_d_in(contract, (8, 64, 4, 16), rel.proj)
    assert d_in == pytest.approx(16, rel=0.1)
    assert_drawn_for(rel.proj, d_in)
    assert report["model.layers.0.self_attn.rel_logits_proj.proj"].fan_in == 16
