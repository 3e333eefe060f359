"""The paper's attention output gate added to Hugging Face architectures built from tiny configs: each family
gated, the gated forward against a hand-written G1 (attention computed per head from the module's own weights,
σ(X W_θ), then the output projection), bad input refused with the model unchanged, saved and reloaded with the
gate, and trained by transformers' Trainer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from smallinit import add_attention_gate_, load_gated
from smallinit.config import ModelConfig
from smallinit.errors import SmallinitError
from smallinit.init.gate import GateError
from smallinit.model import Transformer
from support.attention import SoftmaxAttention, decoder
from support.distributed import torchrun
from support.hf_tiny import build, tokens, transformers
from support.trainers import Rows

FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "olmo2", "phi3", "gpt2"]


def _gates(model) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if n.endswith(".g_proj")}


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["elementwise", "headwise"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_each_family_gated(arch, kind):
    model = build(arch).eval()
    ids = tokens(model)
    with torch.no_grad():
        before = model(input_ids=ids).logits
    report = add_attention_gate_(model, kind, gamma=1.0, generator=torch.Generator().manual_seed(0))
    text = model.config.get_text_config()
    gates = _gates(model)
    assert len(report.gated) == len(gates) == text.num_hidden_layers, str(report)
    d = text.hidden_size
    heads = text.num_attention_heads
    for g in gates.values():
        assert g.weight.shape == (heads * (g.head_dim if kind == "elementwise" else 1), d)
        # W_θ ~ N(0, d_model^(−2γ)): the sample std of its entries within 4 standard errors
        assert abs(g.weight.std().item() * d - 1) < 4 / math.sqrt(2 * g.weight.numel()), g.weight.std()
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert torch.isfinite(after).all() and not torch.allclose(before, after)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _rope(x, cos, sin):
    r = cos.shape[-1]  # partial rotary (Phi-3): only the first r channels turn
    return torch.cat([x[..., :r] * cos + _rotate_half(x[..., :r]) * sin, x[..., r:]], dim=-1)


def _linear(mod, x):
    """y = x Wᵀ + b for nn.Linear, x W + b for GPT-2's Conv1D (weight stored (in, out))."""
    w = mod.weight if isinstance(mod, nn.Linear) else mod.weight.T
    return x @ w.T + (0 if mod.bias is None else mod.bias)


def g1_reference(arch: str, attn: nn.Module, x: torch.Tensor, pos) -> torch.Tensor:
    """The gated attention block by hand: per-head causal softmax attention from the module's weights, each
    head's output times σ(X W_θ) (per channel or per head), then the output projection."""
    cfg = attn.config
    H = cfg.num_attention_heads
    Hkv = getattr(cfg, "num_key_value_heads", None) or H
    B, T, d = x.shape
    if arch == "gpt2":
        hd = d // H
        q, k, v = _linear(attn.c_attn, x).split(d, dim=-1)
        out_proj = attn.c_proj
    else:
        hd = attn.head_dim
        if arch == "phi3":
            q, k, v = _linear(attn.qkv_proj, x).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        else:
            q, k, v = _linear(attn.q_proj, x), _linear(attn.k_proj, x), _linear(attn.v_proj, x)
        out_proj = attn.o_proj
    q = q.view(B, T, H, hd).transpose(1, 2)
    k = k.view(B, T, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    v = v.view(B, T, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    if arch != "gpt2":
        cos, sin = (t.unsqueeze(1) for t in pos)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, hd): each head's output
    w_theta = attn.g_proj.weight
    g = torch.sigmoid(x @ w_theta.T)  # (B, T, H·hd) or (B, T, H)
    g = g.view(B, T, H, -1).transpose(1, 2)  # per channel, or one per head broadcast over its channels
    return _linear(out_proj, (y * g).transpose(1, 2).reshape(B, T, H * hd))


@pytest.mark.parametrize("kind", ["elementwise", "headwise"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3", "gpt2"])
def test_gated_forward_is_g1(arch, kind):
    model = build(arch).eval()
    add_attention_gate_(model, kind, generator=torch.Generator().manual_seed(1))
    for g in _gates(model).values():  # gates far from 1/2, so that a gate not applied cannot pass
        g.weight.data.normal_(0, 1.0, generator=torch.Generator().manual_seed(2))
    name = next(iter(_gates(model)))[: -len(".g_proj")]
    attn = model.get_submodule(name)
    seen = {}

    def pre(mod, args, kwargs):
        seen["x"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["pos"] = kwargs.get("position_embeddings")

    def post(mod, args, kwargs, out):
        seen["y"] = out[0]

    h1 = attn.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = attn.register_forward_hook(post, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=tokens(model))
        want = g1_reference(arch, attn, seen["x"], seen["pos"])
    h1.remove(), h2.remove()
    torch.testing.assert_close(seen["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["elementwise", "headwise"])
def test_multi_head_latent_attention_is_gated_at_its_low_rank_query(kind):
    """DeepSeek-V3's attention (MLA) has no q_proj: its query is q_a_proj → q_a_layernorm → q_b_proj, and o_proj
    reads heads × v_head_dim channels (v_head_dim ≠ the query's head dim). By hand: o_proj's input is the
    attention output times σ(X W_θ), X the block's input, per channel or per head."""
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=12, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    report = add_attention_gate_(model, kind, generator=torch.Generator().manual_seed(1))
    gates = _gates(model)
    assert len(report.gated) == len(gates) == 2, str(report)
    seen: dict = {}
    hooks = []
    for name, g in gates.items():
        attn = model.get_submodule(name[: -len(".g_proj")])
        assert g.weight.shape == (4 * (12 if kind == "elementwise" else 1), 64)
        g.weight.data.normal_(0, 1.0, generator=torch.Generator().manual_seed(2))  # gates far from 1/2
        hooks += [
            attn.register_forward_pre_hook(
                lambda _m, a, k, n=name: seen.__setitem__(
                    (n, "x"), k.get("hidden_states", a[0] if a else None)
                ),
                with_kwargs=True,
            ),
            attn.o_proj.register_forward_pre_hook(
                lambda _m, a, n=name: seen.__setitem__((n, "y"), a[0].clone()), prepend=True
            ),  # before the gate's own hook
            attn.o_proj.register_forward_pre_hook(lambda _m, a, n=name: seen.__setitem__((n, "gated"), a[0])),
        ]
    with torch.no_grad():
        model(input_ids=tokens(model))
    for h in hooks:
        h.remove()
    for name, g in gates.items():
        x, y = seen[(name, "x")], seen[(name, "y")]
        by_hand = torch.sigmoid(x.float() @ g.weight.T.float())  # (B, T, 4·12) or (B, T, 4)
        by_hand = by_hand.repeat_interleave(12 if kind == "headwise" else 1, dim=-1)
        torch.testing.assert_close(seen[(name, "gated")], y * by_hand, rtol=1e-6, atol=0)


def test_bad_kind_leaves_the_model_unchanged():
    model = build("llama")
    state = _state(model)
    with pytest.raises(GateError, match="elementwise, headwise"):
        add_attention_gate_(model, "sigmoid")
    assert model.state_dict().keys() == state.keys() and not _gates(model)


def test_a_second_gate_is_refused_and_changes_nothing():
    model = build("llama")
    add_attention_gate_(model)
    state = _state(model)
    with pytest.raises(GateError, match="already has smallinit's attention gate"):
        add_attention_gate_(model, "headwise")
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)


def test_no_softmax_attention_is_refused():
    mamba = build("mamba")
    with pytest.raises(GateError, match="no softmax attention"):
        add_attention_gate_(mamba)
    assert not _gates(mamba)
    with pytest.raises(GateError, match="no softmax attention"):
        add_attention_gate_(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)))


class LinearAttention(nn.Module):
    """q_proj and o_proj around a kernel with no softmax: not the attention the gate is for."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.k_proj, self.o_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        q, k = torch.relu(self.q_proj(x)), torch.relu(self.k_proj(x))
        return self.o_proj(q * k.cumsum(1))


class NoOutputAttention(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.num_heads = 2
        self.q_proj, self.proj_out = nn.Linear(d, d), nn.Linear(d, d)


def test_attention_whose_projections_the_gate_cannot_name_is_refused_for_that_reason():
    """BERT as a decoder has softmax attention, its projections named query and output.dense: the line says the
    projections were not found, not that the model has no softmax attention."""
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        is_decoder=True,
    )  # fmt: skip
    model = transformers.BertLMHeadModel(config)
    with pytest.raises(
        GateError, match=r"^BertLMHeadModel has no softmax attention to gate: no module holds both"
    ):
        add_attention_gate_(model)
    assert not _gates(model)


def test_linear_attention_is_not_gated_and_a_missing_output_projection_refused():
    with pytest.raises(GateError, match="no softmax attention"):
        add_attention_gate_(LinearAttention(), example_inputs=torch.randn(1, 4, 8))
    model = nn.ModuleDict({"a": NoOutputAttention()})
    with pytest.raises(GateError, match="a.*NoOutputAttention.*not an nn.Linear or Conv1D among o_proj"):
        add_attention_gate_(model)
    assert not _gates(model)


def test_smallinit_model_with_its_own_gate_is_a_no_op_said():
    model = Transformer(
        ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, vocab_size=64, gate="headwise")
    )
    state = _state(model)
    report = add_attention_gate_(model)
    assert len(report.kept) == 2 and not report.gated and "own headwise gate" in str(report)
    assert model.state_dict().keys() == state.keys()
    plain = Transformer(
        ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, vocab_size=64, gate="none")
    )
    with pytest.raises(GateError, match="model.gate=elementwise"):
        add_attention_gate_(plain)


def test_saved_gated_model_reloads_with_its_gate(tmp_path):
    model = build("llama").eval()
    add_attention_gate_(model, "headwise", gamma=1.0)
    ids = tokens(model)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "smallinit_gated"
    assert raw["smallinit_gate"]["kind"] == "headwise" and raw["smallinit_gate"]["model_type"] == "llama"
    loaded = load_gated(tmp_path).eval()
    assert set(_gates(loaded)) == set(_gates(model))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, want)
    # plain from_pretrained never loads the architecture without its gate: it asks for the gate's code ...
    with pytest.raises(ValueError, match="trust_remote_code"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    # ... which, trusted, re-applies it
    remote = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    with torch.no_grad():
        assert torch.equal(remote(input_ids=ids).logits, want)
    # and a reloaded model saves as gated again
    loaded.save_pretrained(tmp_path / "again")
    assert (
        json.loads((tmp_path / "again" / "config.json").read_text())["smallinit_gate"]["kind"] == "headwise"
    )


def test_trainer_trains_a_gated_model_built_by_model_init(tmp_path):
    from smallinit.integrations.hf import model_init, watch

    config = build("llama").config
    init = model_init(config, gamma=1.0, norm_eps=1e-12, gate="elementwise", seed=0)
    assert init.settings["model.gate"] == "elementwise"
    ids = torch.randint(0, 256, (24, 32), generator=torch.Generator().manual_seed(0))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model_init=init, args=args, train_dataset=Rows(ids))
    watch(trainer, every=4, batch=ids[:4])
    start = {n: m.weight.detach().clone() for n, m in _gates(trainer.model).items()}
    assert len(start) == 2 and all(abs(w.std().item() * 64 - 1) < 0.1 for w in start.values())
    trainer.train()
    for n, m in _gates(trainer.model).items():  # W_θ is a trained parameter: the optimizer moved it
        assert not torch.equal(m.weight, start[n]), n
    assert (tmp_path / "smallinit" / "metrics.jsonl").is_file()
    with pytest.raises(SmallinitError, match="gate must be one of none, elementwise, headwise"):
        model_init(config, gate="gated")


def test_init_hf_adds_the_gate_and_its_folder_loads_gated(tmp_path):
    from smallinit.cli import main

    build("qwen3").config.save_pretrained(tmp_path / "cfg")
    out = tmp_path / "init"
    assert main(["init-hf", str(tmp_path / "cfg"), "--out", str(out), "--set", "model.gate=headwise"]) == 0
    model = load_gated(out)
    gates = _gates(model)
    assert len(gates) == 2 and all(g.weight.shape == (4, 64) for g in gates.values())
    assert (
        main(["init-hf", str(tmp_path / "cfg"), "--out", str(tmp_path / "x"), "--set", "model.gate=g"]) == 2
    )
    assert (
        main(["init-hf", str(tmp_path / "cfg"), "--out", str(tmp_path / "x"), "--set", "model.gat=none"]) == 2
    )
    assert not (tmp_path / "x").exists()


def test_load_gated_refuses_a_plain_folder(tmp_path):
    build("llama").save_pretrained(tmp_path)
    with pytest.raises(SmallinitError, match="holds no gated model"):
        load_gated(tmp_path)


def test_a_config_shared_with_other_models_is_not_marked(tmp_path):
    config = build("llama").config
    gated, plain = transformers.LlamaForCausalLM(config), transformers.LlamaForCausalLM(config)
    add_attention_gate_(gated)
    assert "smallinit_gate" not in vars(config) and type(config) is transformers.LlamaConfig
    assert all(m.config is gated.config for m in gated.modules() if "config" in vars(m))
    plain.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"


def test_an_architecture_with_its_own_gate_is_kept_said():
    model = build("qwen3_next")
    state = _state(model)
    report = add_attention_gate_(model)
    assert not report.gated and report.kept and "a sigmoid gates its attention" in report.kept[0]
    assert model.state_dict().keys() == state.keys()


def test_a_gated_folder_is_refused_by_the_folder_reader_in_one_line(tmp_path):
    from smallinit.adapters import load_hf_folder
    from smallinit.errors import ModelError

    model = build("llama")
    add_attention_gate_(model)
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="smallinit's attention gate.*load_gated"):
        load_hf_folder(tmp_path)


class OwnInit(SoftmaxAttention):
    def init_states(self) -> None:
        for p in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            nn.init.normal_(p.weight, std=0.02)


def _layers(attention: type, n: int = 3) -> nn.Module:
    model = nn.Sequential(*(attention() for _ in range(n)))
    model.init_states = lambda: [m.init_states() for m in model]  # the model's init calls each block's
    return model


def test_a_gate_added_on_meta_is_drawn_by_its_blocks_own_init_as_on_materialised_weights():
    """Build on meta, add the gate, to_empty, the model's own init: each W_θ is what adding the gate to the
    materialised model draws with the same generator (σ = d_model^(−γ), in block order)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        lazy = _layers(OwnInit)
    add_attention_gate_(lazy, gamma=0.5, generator=torch.Generator().manual_seed(7), example_inputs=None)
    lazy.to_empty(device="cpu")
    with torch.no_grad():
        lazy.init_states()
    eager = _layers(OwnInit)
    add_attention_gate_(eager, gamma=0.5, generator=torch.Generator().manual_seed(7))
    for a, b in zip(lazy, eager):
        assert torch.equal(a.g_proj.weight, b.g_proj.weight)
    W = torch.cat([m.g_proj.weight.flatten() for m in lazy])
    assert W.std().item() == pytest.approx(16**-0.5, rel=0.1)
    lazy(torch.randn(2, 5, 16))  # drawn: the forward runs


def test_a_gate_left_undrawn_is_an_error_at_the_forward_not_a_silent_start():
    """A block with no init of its own: to_empty leaves W_θ as whatever memory was there, and the forward
    says so in one line; gamma_init_ draws it and the forward runs."""
    from smallinit import gamma_init_

    with torch.device("meta"):
        model = nn.Sequential(SoftmaxAttention(), SoftmaxAttention())
    add_attention_gate_(model)
    model.to_empty(device="cpu")
    x = torch.randn(2, 5, 16)
    with pytest.raises(GateError, match=r"^the attention gate 0\.g_proj was added on the meta device") as e:
        model(x)
    assert "\n" not in str(e.value) and "gamma_init_" in str(e.value)
    gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0), example_inputs=(x,))
    model(x)


GATE_FSDP1_WORKER = Path(__file__).parents[1] / "_gate_fsdp1_worker.py"


def test_a_gate_added_on_meta_is_drawn_when_fsdp1_materialises_the_model(tmp_path):
    """torch's FSDP1 (and Lightning Fabric's FSDP) materialise a meta model by calling each module's
    reset_parameters after to_empty: the gate's own draws W_θ by its rule, the numbers adding it to materialised
    weights draws, where nn.Linear's default had left it flagged undrawn and the forward refused. 2 gloo ranks."""
    done = torchrun(GATE_FSDP1_WORKER, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = torch.load(tmp_path / "gates.pt")
    eager = decoder()
    add_attention_gate_(eager, gamma=0.5, generator=torch.Generator().manual_seed(7), example_inputs=None)
    assert sharded["gates"].keys() == {f"{i}.g_proj.weight" for i in range(3)}
    for i, block in enumerate(eager):
        assert torch.equal(sharded["gates"][f"{i}.g_proj.weight"], block.g_proj.weight.detach()), i
    assert math.isfinite(sharded["loss"])


def test_resetting_a_gate_draws_it_by_its_rule_not_nn_linears_default():
    """A materialised model whose modules are reset (the same idiom, outside FSDP): W_θ is redrawn with σ =
    d_model^(−γ), not nn.Linear's uniform ±1/√d_model."""
    model = decoder(n=8)
    add_attention_gate_(model, gamma=1.0, example_inputs=None)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.reset_parameters()
    W = torch.cat([b.g_proj.weight.flatten() for b in model])
    assert W.std().item() == pytest.approx(1 / 16, rel=0.1)  # nn.Linear's default: 1/(√3·4) ≈ 0.144
