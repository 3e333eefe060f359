"""``smallinit.audit`` and ``smallinit audit``: every number checked against a computation written here, on a
nanochat-style model of no library, Hugging Face architectures from tiny configs and smallinit's own runs."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

from smallinit import gamma_init_
from smallinit.analysis.measure import load_run
from smallinit.auditing import audit, audit_path
from smallinit.auditing.matrices import edge_limit, matrix_rows
from smallinit.cli import main
from smallinit.config import ModelConfig
from smallinit.init import init_plan, param_roles
from smallinit.model import Transformer
from support.hf_tiny import build, tokens
from support.nanochat_style import GPT, Config
from support.runs import TINY_MODEL

IDS = torch.zeros(1, 8, dtype=torch.long)
# the matrices each architecture's modeling source adds to the residual stream
OUTPUT = re.compile(r"\.(o_proj|down_proj|c_proj)(\.weight)?$")


def _nanochat(tied: bool = False) -> GPT:
    torch.manual_seed(0)
    model = GPT(Config(d=48, vocab=300))
    if tied:
        model.lm_head.weight = model.wte.weight
    return model


def test_each_matrix_number_is_the_one_computed_here():
    model = _nanochat(tied=True)
    gamma_init_(model, 0.75, example_inputs=IDS)
    nn.init.zeros_(model.h[0].attn.c_proj.weight)
    rows = {r.name: r for r in audit(model).matrices}
    for name, p in model.named_parameters():
        w = p.detach().double()
        d_in = 48 if name == "wte.weight" else w.shape[1]  # an embedding's d_in is its width
        r = rows[name]
        assert r.d_in == d_in and r.shape == tuple(w.shape)
        if name == "h.0.attn.c_proj.weight":
            assert r.zero and r.gamma is None and r.fresh_random is None
            continue
        sigma = w.std().item()
        assert r.sigma == pytest.approx(sigma, rel=1e-12)
        assert r.gamma == pytest.approx(-math.log(sigma) / math.log(d_in), rel=1e-6)  # γ from the fp32 std
        assert r.gamma == pytest.approx(0.75, abs=0.03)
        assert r.truncation == pytest.approx(((w - w.mean()).abs().max() / sigma).item(), rel=1e-9)
        top = torch.linalg.matrix_norm(w - w.mean(), ord=2).item()
        assert r.edge == pytest.approx(
            top / (sigma * (math.sqrt(w.shape[0]) + math.sqrt(w.shape[1]))), rel=2e-2
        )
    assert rows["wte.weight"].tied == ("lm_head.weight",) and "lm_head.weight" not in rows
    writers = {n for n, r in rows.items() if r.writes_residual}
    assert writers == {f"h.{i}.{part}.c_proj.weight" for i in (0, 1) for part in ("attn", "mlp")}


@pytest.mark.parametrize("shape", [(32, 64), (64, 64), (300, 64)])
def test_fresh_random_flags_every_drawn_matrix_and_no_spiked_one(shape):
    """The flag's error rates by simulation: 60 independent draws (normal, uniform as torch's default,
    normal truncated at ±2σ) are all flagged; the same draws plus a rank-one spike of strength 1.5× the bulk
    edge (what a few training steps add) are none."""
    g = torch.Generator().manual_seed(1)
    m, n = shape
    layer = nn.Linear(n, m, bias=False)
    roles = param_roles(layer, forward=False)
    flagged = spiked = 0
    for i in range(60):
        if i % 3 == 0:
            w = torch.randn(m, n, generator=g)
        elif i % 3 == 1:
            w = torch.rand(m, n, generator=g) * 2 - 1
        else:
            w = torch.nn.init.trunc_normal_(torch.empty(m, n), a=-2, b=2, generator=g)
        with torch.no_grad():
            layer.weight.copy_(w)
        flagged += matrix_rows(layer, roles, set())[0].fresh_random
        u, v = torch.randn(m, 1, generator=g), torch.randn(1, n, generator=g)
        spike = 1.5 * w.std() * (m**0.5 + n**0.5) * (u / u.norm()) @ (v / v.norm())
        with torch.no_grad():
            layer.weight.copy_(w + spike)
        spiked += matrix_rows(layer, roles, set())[0].fresh_random
    assert flagged == 60 and spiked == 0
    assert edge_limit(m, n) < 1.5


def test_each_expert_of_a_fused_tensor_is_judged_on_its_own():
    """Eight experts (8, 64, 64) as drawn are fresh-random (12 draws: normal, uniform, truncated normal); expert 0
    given a rank-one spike 1.2× its own bulk edge (what training adds to the one expert tokens reach): stacked
    as one 512 × 64 matrix the spike stays inside the taller stack's bulk edge; judged per expert, the tensor is
    no longer fresh-random and experts 1–7 are named."""
    model = Transformer(ModelConfig.preset("cpu-moe-1m"))
    name = "blocks.0.mlp.down_proj"
    w = dict(model.named_parameters())[name]
    E, m, n = w.shape
    roles, block = {"down_proj": param_roles(model, model.example_inputs())[name]}, model.blocks[0].mlp
    g = torch.Generator().manual_seed(0)
    for i in range(12):
        if i % 3 == 0:
            x = torch.randn(E, m, n, generator=g)
        elif i % 3 == 1:
            x = torch.rand(E, m, n, generator=g) * 2 - 1
        else:
            x = nn.init.trunc_normal_(torch.empty(E, m, n), a=-2, b=2, generator=g)
        with torch.no_grad():
            w.copy_(x)
        (row,) = matrix_rows(block, roles, set())
        assert row.fresh_random and row.fresh_parts == (), i
    u, v = torch.randn(m, 1, generator=g), torch.randn(1, n, generator=g)
    with torch.no_grad():
        w[0] += 1.2 * w[0].std() * (m**0.5 + n**0.5) * (u / u.norm()) @ (v / v.norm())
    result = audit(model)
    row = next(r for r in result.matrices if r.name == name)
    assert not row.fresh_random and row.fresh_parts == tuple(range(1, E))
    experts = w.detach().double()
    edges = [
        torch.linalg.matrix_norm(e - e.mean(), ord=2).item() / (e.std().item() * (m**0.5 + n**0.5))
        for e in experts
    ]
    assert row.edge == pytest.approx(max(edges), rel=2e-2) and max(edges) > edge_limit(m, n)
    stacked = experts.reshape(E * m, n)
    top = torch.linalg.matrix_norm(stacked - stacked.mean(), ord=2).item()
    assert top / (stacked.std().item() * ((E * m) ** 0.5 + n**0.5)) < edge_limit(E * m, n)  # hidden stacked
    assert "fresh-random experts: 7 of 8 (1, 2, 3, 4, 5, 6, …)" in result.table()


def test_the_recipe_named_for_hugging_face_defaults_gamma_init_and_nanochat():
    llama = build("llama")
    r = audit(llama, tokens(llama)).recipe
    assert r.summary == f"fixed std {llama.config.initializer_range:.3g} in every role" and not r.disagree
    gamma_init_(llama, 0.5)
    assert audit(llama, tokens(llama)).recipe.summary == "fan-in γ = 0.500 in every role"
    # a mix: the embedding left at torch's N(0, 1) disagrees and is named
    nn.init.normal_(llama.model.embed_tokens.weight)
    r = audit(llama, tokens(llama)).recipe
    assert [d.split(":")[0] for d in r.disagree] == ["embedding"]
    assert r.roles["embedding"].sigma == pytest.approx(llama.model.embed_tokens.weight.std().item())

    gpt2 = build("gpt2")  # c_proj drawn at 0.02/√(2·n_layer)
    r = audit(gpt2, tokens(gpt2)).recipe
    assert r.roles["output projections"].rule == "depth-scaled" and r.layers == gpt2.config.n_layer
    assert r.depth_k == pytest.approx(2.0, rel=0.1)

    r = audit(_nanochat(), torch.randint(0, 300, (2, 16))).recipe
    assert "output projections: zero-init" in r.disagree
    assert r.roles["head"].sigma == pytest.approx(0.001, rel=0.05)


@pytest.mark.parametrize("tied", [False, True])
def test_an_mlp_as_wide_as_the_vocabulary_is_no_head(tied):
    """The head is the model's own (its lm_head, tied or not), not every matrix with the vocabulary's output
    size: with 4·d = vocab, c_fc (vocab × d) had joined the head role (3 matrices for an untied model, a head role
    of two c_fc for a tied one)."""
    torch.manual_seed(0)
    model = GPT(Config(d=48, vocab=192))
    if tied:
        model.lm_head.weight = model.wte.weight
    result = audit(model, torch.randint(0, 192, (2, 16)))
    roles = {}
    for r in result.matrices:
        roles.setdefault(
            "embedding" if r.kind == "embedding" else "output projections" if r.writes_residual
            else "head" if r.name == "lm_head.weight" else "matrices", []
        ).append(r.name)  # fmt: skip
    assert {role: fit.matrices for role, fit in result.recipe.roles.items()} == {
        role: len(names) for role, names in roles.items()
    }
    assert ("head" in result.recipe.roles) == (not tied)
    assert sum(r.head for r in result.matrices) == 1


def test_torch_s_default_init_is_named_as_such():
    """nn.Linear's own init (uniform in ±1/√d_in, σ = 1/√(3·d_in)) at d_in 48 and 192 reads as fan-in γ ≈ 0.62
    under the γ rule; the recipe names it torch's default in every role but the embedding (nn.Embedding's own
    N(0, 1)), from σ·√(3·d_in) = 1 and uniform entries computed here."""
    model = _nanochat()
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.reset_parameters()
    result = audit(model, torch.randint(0, 300, (2, 16)))
    linear = [r for r in result.matrices if r.kind == "matrix"]
    assert {r.d_in for r in linear} == {48, 192}
    for r in linear:
        w = dict(model.named_parameters())[r.name].detach().double()
        assert r.sigma * math.sqrt(3 * r.d_in) == pytest.approx(1.0, abs=0.05)
        assert w.abs().max() <= r.d_in**-0.5  # the uniform bound
    r = result.recipe
    fits = {role: fit.rule for role, fit in r.roles.items()}
    assert fits == {
        "embedding": "either",
        "head": "torch default",
        "output projections": "torch default",
        "matrices": "torch default",
    }
    assert r.summary.startswith("matrices and head, output projections: torch default: uniform ±1/√d_in")
    assert [d.split(":")[0] for d in r.disagree] == ["embedding"]


def test_norm_factors_of_a_hugging_face_model_against_their_inputs():
    model = build("llama")
    ids = tokens(model)
    eps = model.config.rms_norm_eps
    with torch.no_grad():  # inputs small enough that ε matters
        model.model.embed_tokens.weight.mul_(1e-3)
    seen = {}

    def keep(name):
        def hook(_module, args):
            seen.setdefault(name, args[0].detach().double())

        return hook

    hooks = [
        m.register_forward_pre_hook(keep(n))
        for n, m in model.named_modules()
        if type(m).__name__.endswith("RMSNorm")
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    result = audit(model, ids)
    norms = {n.name: n for n in result.norms}
    assert set(norms) == set(seen)
    for name, h in seen.items():
        ms = h.pow(2).mean(-1)
        assert norms[name].eps == eps
        assert norms[name].factor == pytest.approx(torch.sqrt(ms / (ms + eps)).mean().item(), rel=1e-6)
    first = norms["model.layers.0.input_layernorm"]
    assert first.factor < 0.5 and first.saturated and "model.layers.0.input_layernorm" in result.saturated


def test_a_model_in_training_mode_is_audited_without_dropout_and_left_as_it_was():
    """GPT-2 built from a config is in training mode with dropout 0.1 after every branch: the audit's forward
    ran with it, so its norm factors were random (two audits of one model differed) and not the model's own.
    They are now those of the eval-mode forward, computed here, and every module keeps its mode."""
    model = build("gpt2")
    ids = tokens(model)
    with torch.no_grad():  # inputs small enough that ε matters
        model.transformer.wte.weight.mul_(1e-2)
        model.transformer.wpe.weight.mul_(1e-2)
    model.transformer.h[0].eval()  # a part the user froze in eval mode
    assert model.training and model.config.resid_pdrop > 0
    seen = {}
    hooks = [
        m.register_forward_pre_hook(lambda _m, args, n=n: seen.__setitem__(n, args[0].detach().double()))
        for n, m in model.named_modules()
        if isinstance(m, nn.LayerNorm)
    ]
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    model.train()
    model.transformer.h[0].eval()
    for h in hooks:
        h.remove()
    first, second = audit(model, ids), audit(model, ids)
    assert [n.factor for n in first.norms] == [n.factor for n in second.norms]
    eps = model.config.layer_norm_epsilon
    for n in first.norms:
        var = seen[n.name].var(-1, unbiased=False)
        assert n.factor == pytest.approx(torch.sqrt(var / (var + eps)).mean().item(), rel=1e-6)
    assert min(n.factor for n in first.norms) < 0.99  # ε is felt, so dropout would have moved the factor
    assert model.training and not model.transformer.h[0].training and model.transformer.h[1].training
    assert not model.transformer.h[0].attn.training


def test_a_model_on_meta_is_audited_from_shapes_and_config():
    result = audit_path("1.5b")
    cfg = ModelConfig.preset("1.5b")
    rows = {r.name: r for r in result.matrices}
    assert rows["blocks.0.attn.q_proj.weight"].d_in == cfg.d_model
    assert rows["blocks.0.mlp.down_proj.weight"].d_in == cfg.d_ff
    assert all(r.sigma is None and r.fresh_random is None for r in rows.values())
    assert {n.eps for n in result.norms} == {cfg.norm_eps} and len(result.norms) == 2 * cfg.n_layers + 1
    assert any("on meta" in n for n in result.notes)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("audit") / "run"
    sets = [*TINY_MODEL, "data.corpus=shakespeare", "train.batch_size=8", "train.warmup_steps=2"]
    sets += ["train.steps=20", "train.lr=0.01", "train.eval_every=20", "train.eval_batches=1"]
    assert main(["train", "--out", str(run), *[a for s in sets for a in ("--set", s)]]) == 0
    return run


def test_a_trained_run_is_not_flagged_and_a_reinitialised_one_is(trained_run, tmp_path):
    assert main(["audit", str(trained_run), "--out", str(tmp_path), "--fail-on", "fresh-random"]) == 0
    trained = audit_path(trained_run)
    assert trained.claims_trained and trained.fresh_random == [] and trained.failures(("fresh-random",)) == []
    assert json.loads((tmp_path / "audit.json").read_text())["fresh_random"] == []
    # the same model with its matrices drawn again at std 0.02, as a load that re-initialises leaves it
    run = load_run(trained_run)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in run.model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    again = audit(run.model, trained=True)
    assert len(again.fresh_random) == len(again.matrices) == len(trained.matrices)
    assert again.recipe.summary == "fixed std 0.02 in every role"
    assert again.failures(("saturated", "fresh-random"))[0].startswith("fresh-random:")
    assert "re-initialised on load?" in again.table()


def test_fail_on_names_an_unknown_check():
    with pytest.raises(SystemExit) as e:
        main(["audit", "cpu-1m", "--fail-on", "saturated,stale"])
    assert e.value.code == 2


def test_a_fresh_hugging_face_checkpoint_fails_the_fresh_random_check(tmp_path, capsys):
    """model.safetensors beside its config.json, saved straight after construction (transformers' own init):
    every matrix is flagged, the recipe is its initializer_range and the CI exit status is 1."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=8192
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    argv = [
        "audit",
        str(weights),
        "--tokenizer",
        "default",
        "--out",
        str(tmp_path),
        "--fail-on",
        "fresh-random",
    ]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert f"recipe: fixed std {cfg.initializer_range:g} in every role" in out
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert len(saved["fresh_random"]) == len(saved["matrices"]) == 16
    assert err.strip().splitlines()[-1].startswith("audit failed: fresh-random: 16 of 16 matrices")


@pytest.mark.parametrize("name", ["dense", "moe", "llama", "gpt2", "qwen3_moe", "gemma2", "nanochat"])
def test_the_audit_and_role_scales_find_the_same_output_projections(name):
    """One finder of the matrices that write into the residual stream, whatever the model: the audit's flags
    and the matrices ``output=zero`` zeroes are the output projections its modeling source adds, with no
    example inputs given (a row of token ids, the one builder both use)."""
    if name in ("dense", "moe"):
        model = Transformer(ModelConfig.preset("cpu-1m" if name == "dense" else "cpu-moe-1m"))
    else:
        model = _nanochat() if name == "nanochat" else build(name)
    expected = {n for n, p in model.named_parameters() if OUTPUT.search(n) and p.dim() >= 2}
    assert len(expected) >= 4  # attention and MLP of each block: the names this test expects exist
    plan = init_plan(model, 1.0, scales=["output=zero"])
    assert {r.name for r in plan.rows if r.role == "output"} == expected
    assert {r.name for r in audit(model).matrices if r.writes_residual} == expected
