"""γ-init: every matrix's sample std matches d_in^(−γ), on our model and on real transformers models."""

import math

import pytest
import torch
from torch import nn

from smallinit import ModelConfig, SmallinitError, Transformer, gamma_init_, gamma_normal_
from smallinit.init import set_norm_eps_


def check_stds(model: nn.Module, report, gamma: float) -> int:
    params = dict(model.named_parameters(remove_duplicate=True))
    checked = 0
    for row in report.rows:
        p = params[row.name].detach().float()
        if row.rule == "normal":
            assert row.std == pytest.approx(row.fan_in**-gamma)
            n = p.numel()
            # the sample std of n normal draws has relative error ~ 1/sqrt(2n); allow 5 of those, ≥ 2 %
            tol = max(0.02, 5 / math.sqrt(2 * n))
            assert p.std().item() == pytest.approx(row.std, rel=tol), row.name
            assert abs(p.mean().item()) < 5 * row.std / math.sqrt(n), row.name
            checked += 1
        elif row.rule == "ones":
            assert torch.all(p == 1), row.name
        elif row.rule == "zeros":
            assert torch.all(p == 0), row.name
    return checked


@pytest.mark.parametrize("gamma", [0.5, 0.75, 1.0, 1.5])
def test_our_model_stds(gamma):
    cfg = ModelConfig.preset("cpu-1m", gamma=gamma, gate="elementwise", qk_norm=True, tie_embeddings=False)
    model = Transformer(cfg, seed=1)
    checked = check_stds(model, model.init_report, gamma)
    # every matrix: embed, lm_head, and per layer q, k, v, o, gate W_θ, gate/up/down of the MLP
    assert checked == 2 + cfg.n_layers * 8
    fans = {r.name: r.fan_in for r in model.init_report.rows}
    assert fans["embed.weight"] == cfg.d_model
    assert fans["lm_head.weight"] == cfg.d_model
    assert fans["blocks.0.mlp.down_proj.weight"] == cfg.d_ff
    assert fans["blocks.0.attn.g_proj.weight"] == cfg.d_model


def test_init_is_seeded_and_tied_weights_drawn_once():
    cfg = ModelConfig.preset("cpu-1m")
    a, b, c = Transformer(cfg, seed=3), Transformer(cfg, seed=3), Transformer(cfg, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.embed.weight, c.embed.weight)
    assert a.lm_head.weight is a.embed.weight
    assert sum(r.name == "lm_head.weight" for r in a.init_report.rows) == 0


def test_gamma_normal_and_bad_gamma():
    t = torch.empty(512, 256)
    gamma_normal_(t, 1.0, generator=torch.Generator().manual_seed(0))
    assert t.std().item() == pytest.approx(1 / 256, rel=0.02)
    gamma_normal_(t, 0.5, fan_in=1024)
    assert t.std().item() == pytest.approx(1 / 32, rel=0.02)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(SmallinitError):
            gamma_normal_(t, bad)
        with pytest.raises(SmallinitError):
            gamma_init_(nn.Linear(4, 4), bad)


def test_report_is_a_table():
    model = Transformer(ModelConfig.preset("cpu-1m"))
    text = str(model.init_report)
    assert "γ = 1" in text and "blocks.0.attn.q_proj.weight" in text and "0.01562" in text


def test_biases_zero_declared_fan_in_and_forward_roles():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(300, 200, bias=True)
            self.experts = nn.Parameter(torch.empty(4, 64, 128))  # (experts, in, out), applied as x @ w[e]
            self.odd = nn.Parameter(torch.empty(100, 50))
            self.gamma_fan_in = {"odd": 100}
            self.ln = nn.LayerNorm(200)

        def forward(self, x):  # x: (tokens, 64)
            return torch.einsum("ti,eio->teo", x, self.experts)

    m = Custom()
    rows = gamma_init_(m, 1.0, generator=torch.Generator().manual_seed(0)).by_name()
    assert torch.all(m.proj.bias == 0) and torch.all(m.ln.weight == 1) and torch.all(m.ln.bias == 0)
    assert rows["odd"].fan_in == 100 and m.odd.std().item() == pytest.approx(1 / 100, rel=0.05)
    # no forward to read the experts' input axis from: kept and said so, not guessed from the layout
    assert rows["experts"].rule == "kept" and "example_inputs" in rows["experts"].reason
    rows = gamma_init_(m, 1.0, example_inputs=torch.zeros(3, 64)).by_name()
    assert rows["experts"].fan_in == 64 and m.experts.std().item() == pytest.approx(1 / 64, rel=0.03)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_transformers_models(arch, gamma):
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, tie_word_embeddings=False))
    else:
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
        )
    report = gamma_init_(model, gamma, generator=torch.Generator().manual_seed(0))
    checked = check_stds(model, report, gamma)
    n_matrices = sum(1 for _, p in model.named_parameters() if p.dim() == 2)
    assert checked == n_matrices
    fans = {r.name: r.fan_in for r in report.rows}
    assert fans["model.layers.0.mlp.down_proj.weight"] == 352
    assert fans["model.embed_tokens.weight"] == 128
    touched = set_norm_eps_(model, 1e-12)
    norms = [m for m in model.modules() if "norm" in type(m).__name__.lower()]
    assert len(touched) == len(norms) > 0
    assert all(m.variance_epsilon == 1e-12 for m in norms)


def _old_rule_init(model: nn.Module, gamma: float, seed: int) -> dict[str, torch.Tensor]:
    """The rule our Transformer was always initialised with, written out independently: in named_modules
    order, each parameter once, every ≥ 2-d one from N(0, fan^(−2γ)) in fp32 (fan: in_features of a Linear,
    embedding_dim of an Embedding, else the last dim), norm weights 1, other 1-d parameters 0."""
    g, out, seen = torch.Generator().manual_seed(seed), {}, set()
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.dim() >= 2:
                fan = (
                    mod.in_features
                    if isinstance(mod, nn.Linear)
                    else mod.embedding_dim
                    if isinstance(mod, nn.Embedding)
                    else p.shape[-1]
                )
                value = torch.empty(p.shape).normal_(0.0, fan**-gamma, generator=g)
            else:
                value = torch.ones(p.shape) if "norm" in type(mod).__name__.lower() else torch.zeros(p.shape)
            out[f"{mname}.{pname}".lstrip(".")] = value
    return out


@pytest.mark.parametrize(
    "preset,overrides",
    [
        ("cpu-1m", {}),
        ("cpu-1m", dict(gate="elementwise", qk_norm=True, tie_embeddings=False, gamma=0.5)),
        ("cpu-moe-1m", dict(gate="headwise")),
    ],
)
def test_our_model_init_unchanged(preset, overrides):
    """Exact resume and the CPU study's reproducibility rest on the same seed giving the same weights."""
    cfg = ModelConfig.preset(preset, **overrides)
    model = Transformer(cfg, seed=5)
    want = _old_rule_init(Transformer(cfg, init=False), cfg.gamma, 5)
    got = dict(model.named_parameters())
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert all(r.rule != "kept" for r in model.init_report.rows)


# -- roles: what each parameter is, from module types and from the forward --------------------------------


def test_param_roles_conv_and_stored_in_by_out():
    from smallinit import as_out_in, param_roles

    transformers = pytest.importorskip("transformers")
    conv = param_roles(nn.Conv1d(64, 64, 3))["weight"]
    assert (conv.kind, conv.fan_in, conv.in_dim) == ("matrix", 192, 1)  # in_channels × kernel
    assert param_roles(nn.Conv1d(64, 64, 3, groups=64))["weight"].fan_in == 3  # depthwise: 1 × kernel
    assert as_out_in(torch.zeros(8, 4, 3), param_roles(nn.Conv1d(4, 8, 3))["weight"]).shape == (8, 12)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16)
    )
    roles = param_roles(gpt2)
    fc = roles["transformer.h.0.mlp.c_fc.weight"]  # Conv1D: stored (in, out), applied as x @ W
    assert (fc.kind, fc.in_dim, fc.fan_in) == ("matrix", 0, 32)
    assert "checked by the forward" in fc.source
    assert as_out_in(gpt2.transformer.h[0].mlp.c_fc.weight, fc).shape == (128, 32)
    assert roles["transformer.h.0.mlp.c_proj.weight"].fan_in == 128
    assert roles["transformer.h.0.mlp.c_fc.bias"].kind == "bias"
    assert "lm_head.weight" not in roles  # tied to the token embedding: once


def test_forward_finds_the_input_axis_whatever_the_storage():
    from smallinit import param_roles

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.w_in = nn.Parameter(torch.empty(4, 16, 48))  # (E, in, out) used as x @ w[e]
            self.w_out = nn.Parameter(torch.empty(4, 16, 48))  # (E, out, in) used with F.linear
            self.bias = nn.Parameter(torch.empty(4, 48))  # a 2-d bias, per expert
            self.scale = nn.Parameter(torch.empty(48))  # only multiplied: not a matrix, not a bias

        def forward(self, x):
            h = torch.stack([x @ self.w_in[e] + self.bias[e] for e in range(4)]) * self.scale
            return torch.stack([nn.functional.linear(h[e], self.w_out[e]) for e in range(4)])

    roles = param_roles(Experts(), torch.zeros(5, 16))
    assert (roles["w_in"].kind, roles["w_in"].in_dim, roles["w_in"].fan_in) == ("matrix", 1, 16)
    assert (roles["w_out"].in_dim, roles["w_out"].fan_in) == (2, 48)
    assert roles["bias"].kind == "bias"
    assert roles["scale"].kind == "own" and "mul" in roles["scale"].reason
    # without a forward nothing is guessed: every raw parameter is unknown, with the reason
    assert {r.kind for r in param_roles(Experts()).values()} == {"unknown"}


def test_norm_forms_probed_not_named():
    from smallinit import param_roles

    transformers = pytest.importorskip("transformers")
    gemma = hf_tiny_build("gemma")
    offset = [r for n, r in param_roles(gemma).items() if n.endswith("norm.weight")]
    assert offset and all(r.kind == "norm" and r.norm_offset for r in offset)
    report = gamma_init_(gemma, 1.0)
    x = torch.randn(3, gemma.config.hidden_size)
    assert torch.allclose(
        gemma.model.norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), atol=1e-5
    )
    assert "1 + w" in report.by_name()["model.norm.weight"].reason
    cohere = transformers.AutoModelForCausalLM.from_config(
        transformers.CohereConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            use_qk_norm=True,
        )
    )
    gamma_init_(cohere, 1.0)
    q_norm = cohere.model.layers[0].self_attn.q_norm.weight  # (heads, head_dim): a norm, not a matrix
    assert q_norm.dim() == 2 and torch.all(q_norm == 1)


def hf_tiny_build(arch):
    return pytest.importorskip("support.hf_tiny").build(arch)


# -- the paths large models take ---------------------------------------------------------------------------


def _tiny_llama(tie: bool, device: str):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        tie_word_embeddings=tie,
    )
    with torch.device(device):
        return transformers.LlamaForCausalLM(cfg)


def test_meta_model_refused_in_one_line_and_planned():
    from smallinit.init import init_plan

    model = _tiny_llama(True, "meta")
    with pytest.raises(SmallinitError) as e:
        gamma_init_(model, 1.0)
    assert "meta device" in str(e.value) and "to_empty" in str(e.value) and "\n" not in str(e.value)
    plan = init_plan(model, 1.0)  # what would be drawn, on meta
    assert plan.by_name()["model.layers.0.mlp.down_proj.weight"].fan_in == 128
    assert all(r.rule != "kept" for r in plan.rows)


def test_to_empty_broken_tie_is_restored_and_said():
    model = _tiny_llama(True, "meta").to_empty(device="cpu")
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # what to_empty does to ties
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in report.by_name()
    assert any("to_empty" in n for n in report.notes)
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(1 / 64, rel=0.05)


# -- ε that cannot be set or saved -------------------------------------------------------------------------


def test_set_norm_eps_refuses_hard_coded_eps():
    transformers = pytest.importorskip("transformers")
    olmo = transformers.AutoModelForCausalLM.from_config(
        transformers.OlmoConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            vocab_size=128,
            pad_token_id=0,
        )
    )
    with pytest.raises(SmallinitError) as e:
        set_norm_eps_(olmo, 1e-12)
    assert "OlmoLayerNorm" in str(e.value) and "hard-codes" in str(e.value)


def test_set_norm_eps_sets_torch_s_rms_norm_at_its_default_eps():
    """nn.RMSNorm(d) holds eps = None (the input dtype's machine epsilon): an attribute its forward reads, so ε is
    set there, and the factor moves to √(ms/(ms + ε)) at the new ε, computed here. It was refused as a norm
    whose forward hard-codes ε."""
    torch.manual_seed(0)
    norm, ln = nn.RMSNorm(32), nn.LayerNorm(32, elementwise_affine=False)
    model = nn.Sequential(norm, ln)
    x = torch.randn(4, 32) * 1e-4  # mean square 1e-8: fp32's machine epsilon (1.2e-7) swamps it

    def factor(eps: float) -> float:
        ms = x.double().pow(2).mean(-1)
        return torch.sqrt(ms / (ms + eps)).mean().item()

    ideal = x.double() / x.double().pow(2).mean(-1, keepdim=True).sqrt()
    assert (norm(x).double() / ideal).mean().item() == pytest.approx(
        factor(torch.finfo(torch.float32).eps), rel=1e-4
    )
    assert set_norm_eps_(model, 1e-12, example_inputs=(x,)) == ["0", "1"]
    assert norm.eps == 1e-12 and ln.eps == 1e-12
    assert (norm(x).double() / ideal).mean().item() == pytest.approx(factor(1e-12), rel=1e-4)


@pytest.mark.parametrize(
    "raw",
    [
        {
            "model_type": "olmo",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "vocab_size": 128,
            "pad_token_id": 0,
            "eos_token_id": 0,
        },  # ε hard-coded in OlmoLayerNorm
        {
            "model_type": "opt",
            "hidden_size": 64,
            "ffn_dim": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "vocab_size": 128,
            "word_embed_proj_dim": 64,
            "pad_token_id": 1,
        },  # no config field to keep ε
    ],
)
def test_init_hf_eps_it_cannot_keep_exits_2(raw, tmp_path, capsys):
    import json

    from smallinit.cli import main

    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert main(["init-hf", str(tmp_path / "config.json"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ε" in err[0] and "--keep-norm-eps" in err[0]
    assert not (tmp_path / "out").exists()
    assert (
        main(["init-hf", str(tmp_path / "config.json"), "--out", str(tmp_path / "out"), "--keep-norm-eps"])
        == 0
    )
    assert "the architecture's, kept" in capsys.readouterr().out


# -- architectures whose branch outputs are renormalised ---------------------------------------------------


@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_post_branch_norms_found_from_the_forward_and_noted(gamma):
    model = hf_tiny_build("gemma2")
    report = gamma_init_(model, gamma, generator=torch.Generator().manual_seed(0))
    layers = model.model.layers
    want = [
        f"model.layers.{i}.{n}"
        for i in range(len(layers))
        for n in ("post_attention_layernorm", "post_feedforward_layernorm")
    ]
    assert report.renormalised == want
    notes = [n for n in report.notes if "renormalise a branch's output" in n]
    assert (
        len(notes) == 1 and "\n" not in notes[0] and notes[0] in str(report) and notes[0] in report.summary()
    )
    # independently, through the forward: each layer adds exactly those norms' outputs to the stream, and
    # they have RMS 1 whatever γ (with an ε that does not swamp the small branch outputs)
    set_norm_eps_(model, 1e-12)
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        model.get_submodule(n).register_forward_hook(lambda _m, _a, out, n=n: seen.__setitem__(n, out))
        for n in want
    ]
    ends: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks += [
        layer.register_forward_hook(
            lambda _m, args, kwargs, out: ends.append(
                (
                    kwargs.get("hidden_states", args[0] if args else None),
                    out[0] if isinstance(out, tuple) else out,
                )
            ),
            with_kwargs=True,
        )
        for layer in layers
    ]
    with torch.no_grad():
        model(pytest.importorskip("support.hf_tiny").tokens(model))
    for h in hooks:
        h.remove()
    for i, (h_in, h_out) in enumerate(ends):
        added = seen[want[2 * i]] + seen[want[2 * i + 1]]
        torch.testing.assert_close(h_out - h_in, added, atol=1e-4, rtol=1e-4)
    for name in want:
        assert seen[name].pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_no_post_branch_note_for_pre_norm_models(arch):
    report = gamma_init_(hf_tiny_build(arch), 1.0)
    assert report.renormalised == [] and not any("renormalise" in n for n in report.notes)


@pytest.mark.parametrize("arch,noted", [("gemma2", True), ("qwen3", False)])
def test_init_hf_prints_the_post_branch_note(arch, noted, tmp_path, capsys):
    from smallinit.cli import main

    hf_tiny = pytest.importorskip("support.hf_tiny")
    hf_tiny.tiny_config(arch).save_pretrained(tmp_path / "cfg")
    assert main(["init-hf", str(tmp_path / "cfg"), "--out", str(tmp_path / "out"), "--keep-norm-eps"]) == 0
    out = capsys.readouterr().out
    assert ("renormalise a branch's output right before it is added to the residual stream" in out) == noted


# -- roles without values -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe", "jetmoe"])
def test_meta_plan_and_roles_are_the_cpu_ones_for_moe(arch):
    from smallinit import param_roles
    from smallinit.init import init_plan

    hf_tiny = pytest.importorskip("support.hf_tiny")
    cpu, meta = hf_tiny.build(arch), hf_tiny.build(arch, "meta")
    plan = init_plan(meta, 1.0)
    assert [(r.name, r.rule, r.fan_in) for r in plan.rows] == [
        (r.name, r.rule, r.fan_in) for r in init_plan(cpu, 1.0).rows
    ]
    experts = [
        r
        for r in plan.rows
        if ("experts" in r.name or "router" in r.name or ".gate." in r.name) and not r.name.endswith("bias")
    ]
    assert experts and all(r.rule == "normal" for r in experts), [
        r.name for r in experts if r.rule != "normal"
    ]
    assert param_roles(meta) == param_roles(cpu)  # the documented fix for FSDP2 works on a meta build


def test_roles_never_depend_on_weight_values():
    from smallinit import param_roles

    hf_tiny = pytest.importorskip("support.hf_tiny")
    transformers = pytest.importorskip("transformers")
    cfg = hf_tiny.tiny_config("jetmoe")
    roles = []
    for seed in range(4):
        torch.manual_seed(seed)
        roles.append(param_roles(transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)))
    assert all(r == roles[0] for r in roles)
    biases = [
        n for n in roles[0] if n.endswith("mlp.bias")
    ]  # JetMoE's MoE output bias, added after the experts
    assert biases and all(roles[0][n].kind == "bias" for n in biases)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))  # weights that steer nothing: not even routing
    assert param_roles(model) == roles[0]
    gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    assert all(torch.all(model.get_parameter(n) == 0) for n in biases)


def test_a_model_that_is_not_hugging_faces_is_drawn_whatever_was_imported_before():
    """A model of another library with an ``_init_weights`` of its own (litgpt's GPT has one) is γ-drawn the
    same whether or not transformers was imported first: its embedding's normal_ draw is not a start of its
    own to keep. (It was kept, at N(0, 1), once transformers.initialization was imported.)"""
    pytest.importorskip("transformers")
    import transformers.initialization  # noqa: F401  the state that made the draw depend on import order

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(64, 16)
            self.out = nn.Linear(16, 64, bias=False)

        def _init_weights(self, module):
            if isinstance(module, (nn.Embedding, nn.Linear)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, ids):
            return self.out(self.wte(ids))

    model = Decoder()
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    assert report.by_name()["wte.weight"].rule == "normal"
    assert model.wte.weight.std().item() == pytest.approx(1 / 16, rel=0.1)
