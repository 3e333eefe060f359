"""The model against independent computations: plain attention, complex-number RoPE, causality, ε, GQA."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from smallinit import ModelConfig, Transformer
from smallinit.model import RMSNorm, apply_rope, rope_tables


def small(**kw) -> ModelConfig:
    return ModelConfig.preset("cpu-1m", vocab_size=97, max_seq_len=32, **kw)


def reference_attention(attn, x, cos, sin):
    """Attention written out by hand: per head softmax(q kᵀ/√d + causal mask) v, gate, o_proj."""
    B, T, _ = x.shape
    H, Hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = (x @ attn.q_proj.weight.T).view(B, T, H, hd).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(B, T, Hkv, hd).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(B, T, Hkv, hd).transpose(1, 2)
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = torch.zeros(B, H, T, hd)
    for h in range(H):
        kh, vh = k[:, h // (H // Hkv)], v[:, h // (H // Hkv)]
        s = q[:, h] @ kh.transpose(-1, -2) / math.sqrt(hd)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out[:, h] = s.softmax(-1) @ vh
    if attn.gate != "none":
        g = torch.sigmoid(x @ attn.g_proj.weight.T).view(B, T, H, -1).transpose(1, 2)
        out = out * g
    return out.transpose(1, 2).reshape(B, T, H * hd) @ attn.o_proj.weight.T


@pytest.mark.parametrize("gate", ["none", "headwise", "elementwise"])
@pytest.mark.parametrize("n_kv_heads,qk_norm", [(4, False), (2, True), (1, False)])
def test_attention_matches_reference(gate, n_kv_heads, qk_norm):
    model = Transformer(small(gate=gate, n_kv_heads=n_kv_heads, qk_norm=qk_norm, gamma=0.5), seed=0)
    attn = model.blocks[0].attn
    x = torch.randn(2, 11, model.config.d_model)
    cos, sin = model.rope_cos[:11], model.rope_sin[:11]
    torch.testing.assert_close(
        attn(x, cos, sin), reference_attention(attn, x, cos, sin), atol=1e-5, rtol=1e-4
    )


def test_gate_shapes_and_none_is_plain_attention():
    for gate, width in [("headwise", 4), ("elementwise", 64)]:
        m = Transformer(small(gate=gate))
        assert m.blocks[0].attn.g_proj.weight.shape == (width, 64)
    plain = Transformer(small(gate="none"))
    assert not hasattr(plain.blocks[0].attn, "g_proj")
    # a gate forced fully open (sigmoid → 1) reproduces the ungated model exactly
    gated = Transformer(small(gate="elementwise"))
    gated.load_state_dict(plain.state_dict(), strict=False)
    for b in gated.blocks:
        torch.nn.init.zeros_(b.attn.g_proj.weight)
    x = torch.randint(0, 97, (2, 16))
    out_plain = plain(x).logits
    # sigmoid(0) = 1/2 halves every head's output; undo it on o_proj to compare with "none"
    for b in gated.blocks:
        b.attn.o_proj.weight.data *= 2
    torch.testing.assert_close(gated(x).logits, out_plain, atol=1e-5, rtol=1e-5)


def test_rope_matches_complex_rotation_and_is_relative():
    hd, T = 16, 10
    cos, sin = rope_tables(hd, T, 10000.0)
    x = torch.randn(1, 1, T, hd)
    # complex form on the (i, i + hd/2) pairs of the rotate-half convention
    z = torch.complex(x[..., : hd // 2], x[..., hd // 2 :])
    freqs = 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)
    rot = z * torch.polar(torch.ones(T, hd // 2), torch.outer(torch.arange(T).float(), freqs))
    expect = torch.cat([rot.real, rot.imag], dim=-1)
    torch.testing.assert_close(apply_rope(x, cos, sin), expect, atol=1e-5, rtol=1e-5)
    # q·k after RoPE depends only on the offset between positions
    q, k = torch.randn(hd), torch.randn(hd)
    qs, ks = (
        apply_rope(q.expand(1, 1, T, hd), cos, sin)[0, 0],
        apply_rope(k.expand(1, 1, T, hd), cos, sin)[0, 0],
    )
    assert torch.allclose(qs[5] @ ks[2], qs[7] @ ks[4], atol=1e-5)
    assert not torch.allclose(qs[5] @ ks[2], qs[5] @ ks[4], atol=1e-3)


def test_eps_reaches_every_norm_and_matters():
    for eps in (1e-5, 1e-12):
        m = Transformer(small(norm_eps=eps, qk_norm=True))
        norms = [mod for mod in m.modules() if isinstance(mod, RMSNorm)]
        assert len(norms) == 2 * 6 + 1 + 2 * 6
        assert all(n.eps == eps for n in norms)
    # with σ²(h) ~ d^(−2γ) far below 1e-5, ε = 1e-5 saturates the factor; ε = 1e-12 does not
    h = torch.randn(4, 2048) / 2048
    w = torch.ones(2048)
    assert RMSNorm(2048, 1e-12)(h).pow(2).mean().item() == pytest.approx(1.0, rel=1e-3)
    assert RMSNorm(2048, 1e-5)(h).pow(2).mean().item() < 0.05
    assert torch.equal(RMSNorm(2048, 1e-12).weight, w)


def test_rmsnorm_in_fp32_for_bf16_input():
    x = (torch.randn(3, 64) * 1e-4).bfloat16()
    y = RMSNorm(64, 1e-12)(x)
    assert y.dtype == torch.bfloat16
    ref = x.float() / x.float().pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=1e-2)


def test_causal_and_loss():
    m = Transformer(small(gamma=0.5))
    x = torch.randint(0, 97, (2, 20))
    y = x.clone()
    y[:, 12:] = torch.randint(0, 97, (2, 8))
    a, b = m(x).logits, m(y).logits
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])
    out = m(x[:, :-1], x[:, 1:])
    ref = F.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten())
    torch.testing.assert_close(out.loss, ref)


def test_capture_api():
    m = Transformer(small(gate="headwise", n_kv_heads=2))
    x = torch.randint(0, 97, (2, 16))
    plain = m(x)
    out = m(x, capture=("hidden", "attn", "qk", "norms"))
    torch.testing.assert_close(out.logits, plain.logits, atol=1e-5, rtol=1e-5)
    assert len(out.hidden_states) == 7 and torch.equal(out.hidden_states[0], m.embed(x))
    assert torch.equal(out.hidden_states[-1], out.norm_inputs["norm"])
    assert len(out.attentions) == 6 and out.attentions[0].shape == (2, 4, 16, 16)
    probs = out.attentions[0]
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 16))
    assert torch.all(probs.triu(1) == 0)
    assert len(out.qk) == 6 and out.qk[0][1].shape == (2, 2, 16, 16)
    assert set(out.norm_inputs) >= {"blocks.0.attn_norm", "blocks.5.mlp_norm", "norm"}
    assert plain.hidden_states == [] and plain.attentions == []
    # the hooks saw the right tensors: layer 1's q, k, v rebuilt from its captured input; the probabilities
    # times v give what the model's fused attention gives
    attn, T = m.blocks[1].attn, x.shape[1]
    h = m.blocks[1].attn_norm(out.norm_inputs["blocks.1.attn_norm"])
    q, k, v = (
        proj(h).view(2, T, -1, attn.head_dim).transpose(1, 2)
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
    )
    q, k = apply_rope(q, m.rope_cos[:T], m.rope_sin[:T]), apply_rope(k, m.rope_cos[:T], m.rope_sin[:T])
    torch.testing.assert_close(out.qk[1], (q, k))
    torch.testing.assert_close(out.attentions[1] @ v.repeat_interleave(2, dim=1), attn.sdpa(q, k, v))
    with pytest.raises(ValueError):
        m(x, capture=("everything",))


def test_untied_head_and_presets():
    m = Transformer(small(tie_embeddings=False))
    assert m.lm_head.weight is not m.embed.weight
    assert set(ModelConfig.presets()) >= {
        "cpu-1m",
        "cpu-5m",
        "cpu-20m",
        "tiny",
        "0.1b",
        "0.3b",
        "0.5b",
        "1b",
        "1.5b",
    }
    assert ModelConfig.preset("1.5b").d_model == 2048
    assert ModelConfig.preset("tiny") == ModelConfig.preset("cpu-1m")


@pytest.mark.parametrize(
    "name,nominal",
    [
        ("cpu-1m", 1e6),
        ("cpu-5m", 5e6),
        ("cpu-20m", 20e6),
        ("0.1b", 0.1e9),
        ("0.3b", 0.3e9),
        ("0.5b", 0.5e9),
        ("1b", 1e9),
        ("1.5b", 1.5e9),
    ],
)
def test_preset_sizes(name, nominal):
    with torch.device("meta"):
        m = Transformer(ModelConfig.preset(name), init=False)
    assert m.num_params() == pytest.approx(nominal, rel=0.1)


@pytest.mark.parametrize(
    "preset,overrides",
    [
        ("cpu-1m", {}),
        ("cpu-1m", {"tie_embeddings": False, "qk_norm": True, "gate": "headwise"}),
        ("cpu-moe-1m", {"moe": {"num_experts": 4, "top_k": 2, "shared_expert": True}}),
    ],
)
def test_built_on_meta_draws_nothing_then_matches_a_cpu_build(preset, overrides):
    cfg = ModelConfig.preset(preset, vocab_size=97, max_seq_len=32, n_layers=2, **overrides)
    with torch.device("meta"):
        m = Transformer(cfg, seed=3)  # PyTorch's convention: building on meta succeeds and draws nothing
    assert m.init_report is None and all(p.is_meta for p in m.parameters())
    m.to_empty(device="cpu")
    report = m.reset_parameters(3)
    cpu = Transformer(cfg, seed=3)
    assert str(report) == str(cpu.init_report)
    assert (m.lm_head.weight is m.embed.weight) == cfg.tie_embeddings
    got, want = m.state_dict(keep_vars=True), cpu.state_dict(keep_vars=True)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    for name, buf in cpu.named_buffers():  # the non-persistent ones too: RoPE tables, routing statistics
        assert torch.equal(dict(m.named_buffers())[name], buf), name
    x = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(m(x).logits, cpu(x).logits)


def _doc_table(path: str, heading: str) -> list[list[str]]:
    """The rows of the first table under ``heading`` in ``path``, cells stripped of backticks."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / path).read_text(encoding="utf-8")
    lines = text[text.index(heading) :].splitlines()
    start = (
        next(i for i, line in enumerate(lines) if line.startswith("|")) + 2
    )  # past the header and its rule
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[start:])
    return [[c.strip().strip("`") for c in row.strip("|").split("|")] for row in rows]


def test_the_preset_tables_of_the_readme_and_moe_md_are_what_the_models_count():
    """README.md's and docs/moe.md's preset tables: each shape and count is the preset's own (they name
    `smallinit info` / `num_params` as their source)."""
    readme = _doc_table("README.md", "## Model presets")
    assert len(readme) == 8
    for name, d, layers, heads, d_ff, shown in readme:
        cfg = ModelConfig.preset(name.split()[0])
        assert [cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff] == [
            int(d),
            int(layers),
            int(heads),
            int(d_ff),
        ]
        with torch.device("meta"):
            n = Transformer(cfg, init=False).num_params() / 1e6
        value = shown.removesuffix(" M")
        decimals = len(value.partition(".")[2])
        assert abs(float(value) - n) <= 0.5 * 10**-decimals, (name, shown, n)
    moe = _doc_table("docs/moe.md", "## Presets")
    assert len(moe) == 4
    for name, d, layers, heads, experts, top_k, d_expert, total, active in moe:
        cfg = ModelConfig.preset(name)
        shape = [cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.d_expert]
        assert shape == [int(x) for x in (d, layers, heads, experts, top_k, d_expert)], name
        with torch.device("meta"):
            m = Transformer(cfg, init=False)
        assert [m.num_params(), m.num_params(active=True)] == [
            int(total.replace(",", "")),
            int(active.replace(",", "")),
        ]
