"""The measurements on Hugging Face causal LMs, against references nobody here wrote: the sink by hand from
eager ``output_attentions``, the residual flow from our own hook at the final norm's input and HF's own first
hidden state, the norm factor from what each norm module itself outputs. Tiny configs, fp32, CPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from smallinit.adapters import as_adapter  # noqa: E402
from smallinit.analysis import measured_norm_factors, residual_flow_ratio, sink_scores  # noqa: E402
from smallinit.errors import ModelError  # noqa: E402
from smallinit.measures.activations import measure_activations  # noqa: E402
from support.hf_archs import ARCHS, GET_INTERFACE, WINDOW, Arch, T  # noqa: E402
from support.hf_archs import ids as ids_of  # noqa: E402
from support.hf_archs import model as model_of  # noqa: E402


def _sink_by_hand(arch: Arch, model, ids) -> np.ndarray:
    """Per (softmax layer, head) sink from eager attention probabilities, over the queries i ≥ 2 that may see
    token 1 (all of them, or those within the window on sliding layers)."""
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            attentions = model(ids, output_attentions=True).attentions
    finally:
        model.config._attn_implementation = arch.implementation
    rows, layer = [], 0
    for a in attentions:
        if a is None:  # a linear-attention layer has no probabilities
            layer += 1
            continue
        last = WINDOW if layer in arch.sliding else T  # query 1-based index i sees token 1 iff i ≤ window
        rows.append(a[:, :, 1:last, 0].double().mean(dim=(0, 2)).numpy())
        layer += 1
    return np.stack(rows)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.name)
def test_sink_flow_and_norm_factor_match_independent_references(arch):
    model, ids = model_of(arch), ids_of()
    with torch.no_grad():
        plain = model(ids).logits

    # observing changes nothing the model computes, and leaves nothing behind
    out = as_adapter(model).observe(ids, kinds=("residual", "norms", "attention"))
    assert torch.equal(out.logits, plain)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain)
    assert not any(m._forward_pre_hooks for m in model.modules())
    assert transformers.AttentionInterface.__dict__["get_interface"] is GET_INTERFACE

    # sink: the model as loaded (sdpa where it has it) through the adapter equals eager probabilities by hand
    reference = _sink_by_hand(arch, model, ids)
    scores = sink_scores(model, ids)
    np.testing.assert_allclose(scores.per_head, reference, atol=2e-6, rtol=0)
    if arch.sliding:  # the window matters: counting unseen queries as zero would give a smaller score
        assert np.min(scores.per_head) > 0.05

    # residual flow: e = HF's first hidden state, h_L = our own hook at the final norm's input
    seen = {}
    handle = model.get_submodule(arch.final_norm).register_forward_pre_hook(
        lambda _m, args: seen.__setitem__("h", args[0])
    )
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    handle.remove()
    e, h = hidden[0].double(), seen["h"].double()
    by_hand = ((h - e).norm(dim=-1) / e.norm(dim=-1)).mean().item()
    assert residual_flow_ratio(model, ids) == pytest.approx(by_hand, rel=1e-12)
    assert not torch.equal(hidden[-1], seen["h"])  # HF's last hidden state is the normed one

    # norm factor: the realised 1/√(σ² + ε) read off each norm's own output, times the ideal σ
    factors = measured_norm_factors(model, ids)
    assert set(factors) == set(out.norm_inputs) and arch.final_norm in factors
    for name, x in out.norm_inputs.items():
        norm = model.get_submodule(name)
        if "Gated" in type(norm).__name__:  # Qwen3-Next's gated norm also takes the gate: out of this check
            continue
        with torch.no_grad():
            y = norm(x).double()
        x = x.double()
        w = norm.weight.double() + (1.0 if arch.offset_norms else 0.0)
        if isinstance(norm, torch.nn.LayerNorm):
            x, y = x - x.mean(-1, keepdim=True), y - norm.bias.double()
        realised = (y / (x * w)).mean(-1)
        reference = (realised * x.pow(2).mean(-1).sqrt()).mean().item()
        assert factors[name] == pytest.approx(reference, abs=1e-6), name
    assert min(factors.values()) < 0.9  # ε = 1e-3 is felt, so a wrong ε could not pass


def test_one_measurement_forward_on_hf_equals_the_separate_ones():
    model, ids = model_of(ARCHS[1]), ids_of()
    both = measure_activations(model, ids, ids)
    assert both.sink.per_layer == pytest.approx(sink_scores(model, ids).per_layer, abs=1e-12)
    assert both.residual_flow == pytest.approx(residual_flow_ratio(model, ids), abs=1e-12)
    assert both.sink.layers == ("model.layers.0.self_attn", "model.layers.1.self_attn")
    assert set(both.sink.share_above) == {0.3, 0.8}
    with torch.no_grad():
        logits = model(ids).logits
    assert both.loss == pytest.approx(
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).item()
    )


def test_eager_backend_gives_the_same_sink_as_sdpa():
    model, ids = model_of(ARCHS[2]), ids_of()
    sdpa = sink_scores(model, ids).per_head
    model.config._attn_implementation = "eager"
    np.testing.assert_allclose(sink_scores(model, ids).per_head, sdpa, atol=1e-6)


def test_the_any_model_section_of_analysis_md_runs_and_prints_what_it_shows():
    """docs/analysis.md, "Any model": the Hugging Face example and the own-model adapter, as written."""
    import contextlib
    import io
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "analysis.md").read_text(encoding="utf-8")
    section = text[text.index("## Any model: adapters") : text.index("## Library")]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, re.S | re.M)
    assert [k for k, _ in blocks] == ["python", "text", "python", "text"]
    namespace: dict = {}
    for (_, code), (_, shown) in zip(blocks[::2], blocks[1::2]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/analysis.md", "exec"), namespace)
        assert out.getvalue() == shown
    assert (
        isinstance(namespace["mine"], namespace["TinyLMAdapter"])
        and as_adapter(namespace["mine"]) is namespace["mine"]
    )


class _EpsilonlessNorm(torch.nn.Module):  # a norm whose ε is hard-coded in its forward
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class _ScaleNorm(torch.nn.Module):  # named a norm, but its output follows its input's scale
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.weight


def test_what_cannot_be_observed_is_said_and_the_rest_measured():
    with pytest.raises(ModelError, match=r"cannot run Linear\(tokens\) on token ids .*; pass call="):
        sink_scores(torch.nn.Linear(3, 3), ids_of())
    model, ids = model_of(ARCHS[0]), ids_of()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1e-3)  # inputs near ε, so that ε is felt
    model.model.norm = _EpsilonlessNorm(32)  # ε read from the forward
    assert as_adapter(model).norms()["model.norm"].eps == pytest.approx(1e-6, rel=1e-3)
    seen = {}
    handle = model.model.norm.register_forward_pre_hook(
        lambda _m, args: seen.__setitem__("h", args[0].double())
    )
    factor = measured_norm_factors(model, ids)["model.norm"]
    handle.remove()
    ms = seen["h"].pow(2).mean(-1)
    assert factor == pytest.approx(torch.sqrt(ms / (ms + 1e-6)).mean().item(), abs=1e-6) and factor < 0.9

    model.model.norm = _ScaleNorm(32)  # that norm alone is named, everything else is measured
    assert "model.norm" not in as_adapter(model).norms()  # no ε is read off a forward that is no norm's
    result = measure_activations(model, ids)
    assert set(result.not_measured) == {"norm_factor:model.norm"}
    assert "changing with its input's scale" in result.not_measured["norm_factor:model.norm"]
    assert result.sink and result.residual_flow is not None and "model.norm" not in result.norm_factor
    with pytest.raises(ModelError, match="norm model.norm: the output of _ScaleNorm keeps changing"):
        measured_norm_factors(model, ids)

    model.model.norm = torch.nn.Identity()  # no norm after the last layer: h_L is the last layer's output
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    result = measure_activations(model, ids)
    e, h = hidden[0].double(), hidden[-1].double()
    assert result.residual_flow == pytest.approx(
        ((h - e).norm(dim=-1) / e.norm(dim=-1)).mean().item(), rel=1e-9
    )
    assert result.notes == (
        "residual_flow: h_L is the last layer's output: no norm module of LlamaForCausalLM takes it "
        "after the last layer",
    )


def test_coord_check_on_a_model_the_user_brings():
    """coord_check(build) γ-inits a Hugging Face model per γ: activations at init are HF's own hidden states
    (and the final norm's input for the last block), every parameter gets its update rows."""
    from smallinit import gamma_init_
    from smallinit.analysis import coord_check
    from smallinit.analysis.coordcheck import _batch

    arch = ARCHS[0]

    def build(gamma: float):
        model = getattr(transformers, arch.model_class)(arch.build())
        gamma_init_(model, gamma, generator=torch.Generator().manual_seed(0))
        return model

    cc = coord_check(build, [0.5, 1.0], steps=1, batch_size=2, seq_len=T)
    x, _ = _batch(None, 96, 2, T, 0, 0)
    for i, gamma in enumerate((0.5, 1.0)):
        model, seen = build(gamma), {}
        model.model.norm.register_forward_pre_hook(lambda _m, args, seen=seen: seen.__setitem__("h", args[0]))
        with torch.no_grad():
            out = model(x, output_hidden_states=True)
        rms = [
            t.double().pow(2).mean().sqrt().item() for t in (*out.hidden_states[:2], seen["h"], out.logits)
        ]
        got = [cc.series("activation", n, 0)[i] for n in ("embed", "blocks.0", "blocks.1", "logits")]
        assert got == pytest.approx(rms, rel=1e-6)
    updated = {r["name"] for r in cc.rows if r["kind"] == "update" and r["rms"] > 0}
    assert updated == {n for n, _ in build(1.0).named_parameters()}
    assert cc.config["model"]["class"] == "LlamaForCausalLM"


# --- smallinit's own Transformer, against its Hugging Face twin and its own modules --------------------------


@pytest.mark.parametrize(
    "overrides",
    [dict(gate="none", qk_norm=False), dict(gate="elementwise", qk_norm=True)],
    ids=["llama-twin", "qwen3-next-twin"],
)
def test_our_transformer_against_eager_attention_of_its_hf_twin(overrides):
    """The Transformer adapter's sink equals eager probabilities of the same weights in transformers' own
    modeling code (the export's stock class); flow and norm factor equal our own hooks and the norm's output."""
    from smallinit import ModelConfig, Transformer
    from smallinit.export.hf import choose_architecture, hf_config, hf_tensors

    cfg = dataclasses.replace(
        ModelConfig.preset("cpu-1m"),
        vocab_size=96,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=64,
        gamma=1.0,
        norm_eps=1e-4,
        **overrides,
    )
    ours = Transformer(cfg, seed=0).eval()
    architecture, _ = choose_architecture(cfg)
    twin = getattr(transformers, architecture)(hf_config(cfg, architecture, 0)).eval()
    twin.load_state_dict(hf_tensors(ours.state_dict(), cfg, architecture), strict=False)
    twin.config._attn_implementation = "eager"
    ids = ids_of()
    with torch.no_grad():
        assert torch.allclose(twin(ids).logits, ours(ids).logits, atol=1e-5)
        probs = twin(ids, output_attentions=True).attentions
    by_hand = np.stack([a[:, :, 1:, 0].double().mean(dim=(0, 2)).numpy() for a in probs])
    np.testing.assert_allclose(sink_scores(ours, ids).per_head, by_hand, atol=2e-6, rtol=0)

    seen = {}
    hooks = [
        ours.embed.register_forward_hook(lambda _m, _a, out: seen.__setitem__("e", out)),
        ours.norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("h", args[0])),
    ]
    with torch.no_grad():
        ours(ids)
    for h in hooks:
        h.remove()
    e, h = seen["e"].double(), seen["h"].double()
    assert residual_flow_ratio(ours, ids) == pytest.approx(
        ((h - e).norm(dim=-1) / e.norm(dim=-1)).mean().item()
    )

    inputs = as_adapter(ours).observe(ids, kinds=("norms",)).norm_inputs
    factors = measured_norm_factors(ours, ids)
    assert set(factors) == {n for n, m in ours.named_modules() if type(m).__name__ == "RMSNorm"}
    for name, x in inputs.items():
        with torch.no_grad():
            realised = (ours.get_submodule(name)(x).double() / x.double()).mean(-1)  # weights are 1 at init
        assert factors[name] == pytest.approx(
            (realised * x.double().pow(2).mean(-1).sqrt()).mean().item(), abs=1e-6
        ), name
    assert min(factors.values()) < 0.9  # ε = 1e-4 against σ² = 1/d² is felt


# --- the command line on Hugging Face folders ------------------------------------------------------------------


def _hf_folder(path, tokenizer: str = "bytes"):
    """A tiny GPT-2 saved with save_pretrained, with a tokenizer built offline from smallinit's own."""
    from smallinit.data import EOS_TOKEN, load_tokenizer

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=load_tokenizer(tokenizer).hf, eos_token=EOS_TOKEN
    )
    config = transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_analyze_and_compare_read_an_exported_run_as_they_read_the_run(corpus, tmp_path, capsys):
    """The same trained model as a smallinit run and as the Hugging Face folder export-hf writes
    (Qwen3-Next: gated attention, (1 + w) norms): the two adapters give the same measurements."""
    import json

    from smallinit.cli import main
    from smallinit.config import Config
    from smallinit.train import Trainer
    from support.runs import TINY_GQA

    cfg = Config.load(
        overrides=[
            *TINY_GQA,
            "model.gate=elementwise",
            "model.qk_norm=true",
            "train.steps=2",
            "train.batch_size=2",
            "train.warmup_steps=1",
            "train.eval_every=0",
            "train.eval_batches=1",
            "train.checkpoint_every=0",
            f"data.corpus={corpus}",
        ]
    )
    Trainer(cfg, tmp_path / "run", callbacks=[]).fit()
    assert main(["export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "qwen3_next"
    common = [
        "--data",
        str(corpus),
        "--set",
        "train.eval_batches=1",
        "--set",
        "train.batch_size=2",
        "--set",
        "data.seq_len=32",
    ]
    for name in ("run", "hf"):
        assert main(["analyze", str(tmp_path / name), *common, "--out", str(tmp_path / f"a-{name}")]) == 0
    ours, theirs = (json.loads((tmp_path / f"a-{n}" / "analysis.json").read_text()) for n in ("run", "hf"))
    assert "hf_config" in theirs and "config" in ours and (tmp_path / "a-hf" / "sink.png").is_file()
    np.testing.assert_allclose(theirs["sink"]["per_head"], ours["sink"]["per_head"], atol=1e-6, rtol=0)
    assert theirs["sink"]["share_above"] == ours["sink"]["share_above"]
    assert theirs["residual_flow"] == pytest.approx(ours["residual_flow"], rel=1e-6)
    assert theirs["loss"] == pytest.approx(ours["loss"], rel=1e-6)
    assert list(theirs["norm_factor"].values()) == pytest.approx(list(ours["norm_factor"].values()), abs=1e-7)
    assert "Sink_0.3" in capsys.readouterr().out

    assert (
        main(
            [
                "compare",
                str(tmp_path / "run"),
                str(tmp_path / "hf"),
                "--data",
                str(corpus),
                "--max-tokens",
                "128",
                "--set",
                "data.seq_len=32",
                "--out",
                str(tmp_path / "cmp"),
            ]
        )
        == 0
    )
    gap = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert abs(gap["mean_delta_sym"]) < 1e-5 and gap["tokens"] >= 128


def test_cli_on_hf_folders_and_on_a_folder_that_is_neither(corpus, tmp_path, capsys):
    from smallinit.cli import main

    a, b = _hf_folder(tmp_path / "a"), _hf_folder(tmp_path / "b", tokenizer="default")
    assert (
        main(
            [
                "analyze",
                str(a),
                "--data",
                str(corpus),
                "--set",
                "train.eval_batches=1",
                "--set",
                "train.batch_size=2",
                "--set",
                "data.seq_len=16",
            ]
        )
        == 0
    )
    assert (a / "analysis" / "analysis.json").is_file() and (a / "analysis" / "norms_matrices.png").is_file()
    capsys.readouterr()

    assert main(["compare", str(a), str(b), "--data", str(corpus)]) == 2
    err = capsys.readouterr().err
    assert "different tokenizers" in err and err.count("\n") == 1

    (tmp_path / "neither").mkdir()
    (tmp_path / "neither" / "notes.txt").write_text("hello")
    for argv in (["analyze", str(tmp_path / "neither")], ["compare", str(a), str(tmp_path / "neither")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "run folder" in err and "Hugging Face model folder" in err, err
    (a / "model.safetensors").unlink()  # a Hugging Face config without its weights says what is missing
    assert main(["analyze", str(a)]) == 2
    assert "it has no model.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_damaged_safetensors_in_a_hugging_face_folder_is_one_line(damage, tmp_path, capsys):
    from smallinit.cli import main

    a = _hf_folder(tmp_path / "a")
    weights = a / "model.safetensors"
    raw = weights.read_bytes()
    # a copy cut short (a save killed mid-write), or the right length of noise: safetensors raises its own
    # error type, which is no OSError
    weights.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else bytes(len(raw)) + b"x")
    capsys.readouterr()  # save_pretrained's progress bar
    for command in ("audit", "analyze"):
        assert main([command, str(a), "--out", str(tmp_path / command)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot load" in err and str(a) in err, err


# --- matrices in out × in orientation, from the d_in knowledge γ-init uses -------------------------------------


def test_matrix_stats_read_conv1d_and_experts_out_by_in():
    from smallinit.analysis import matrix_stats, row_cosine
    from smallinit.analysis.measure import analyze_model
    from smallinit.measures.condensation import named_matrices, unoriented_matrices

    gpt2 = model_of(ARCHS[-1])
    fc = gpt2.transformer.h[0].mlp.c_fc  # Conv1D: stored (in = 32, out = 128), applied as x @ W
    mats = named_matrices(gpt2)
    assert torch.equal(mats["transformer.h.0.mlp.c_fc.weight"], fc.weight.T)
    stat = {s.name: s for s in matrix_stats(gpt2)}["transformer.h.0.mlp.c_fc.weight"]
    assert stat.shape == (128, 32)  # one row per output neuron
    rows = row_cosine(fc.weight.detach().T.contiguous()).mean_abs
    assert stat.mean_abs_cos == pytest.approx(rows, rel=1e-9)
    assert stat.mean_abs_cos != pytest.approx(row_cosine(fc.weight.detach()).mean_abs, rel=1e-3)

    # fused experts either way round: Qwen3-MoE stores (E, out, in), GPT-OSS (E, in, out) and applies x @ W
    for arch, read in ((ARCHS[4], lambda w: w), (ARCHS[7], lambda w: w.T)):
        model = model_of(arch)
        stored = model.model.layers[0].mlp.experts.down_proj[1]
        assert torch.equal(named_matrices(model)["model.layers.0.mlp.experts.down_proj.1"], read(stored)), (
            arch.name
        )
    assert stored.shape == (64, 32)  # GPT-OSS: d_ff in, d_model out

    # a parameter whose input axis is not established gets no statistic, and analyze says which
    gpt2.transformer.h[0].mlp.extra = torch.nn.Module()
    gpt2.transformer.h[0].mlp.extra.mixing = torch.nn.Parameter(torch.randn(4, 6))  # no known module type
    left = unoriented_matrices(gpt2)
    assert "transformer.h.0.mlp.extra.mixing" in left and not any(
        n.startswith(tuple(left)) for n in named_matrices(gpt2)
    )
    result = analyze_model(gpt2, [(ids_of(), ids_of())])
    assert result.matrices_left_out == left and left["transformer.h.0.mlp.extra.mixing"]  # with its reason
    assert "transformer.h.0.mlp.c_fc.weight" in {m.name for m in result.matrices}


def test_our_moe_experts_are_matrices_of_their_own():
    from smallinit import ModelConfig, MoEConfig, Transformer
    from smallinit.measures.condensation import named_matrices

    cfg = dataclasses.replace(
        ModelConfig.preset("cpu-1m"),
        vocab_size=64,
        n_layers=1,
        moe=MoEConfig(num_experts=4, top_k=2, d_expert=16),
    )
    model = Transformer(cfg)
    mats = named_matrices(model)
    assert torch.equal(mats["blocks.0.mlp.down_proj.3"], model.blocks[0].mlp.down_proj[3])
    assert mats["blocks.0.mlp.up_proj.0"].shape == (16, cfg.d_model)


def test_compiled_layers_are_measured_as_the_same_layers_uncompiled():
    """The first observation of attention follows each fused matrix's products through the forward: where a
    layer is torch.compile'd, that runs eagerly, else the compiled code under the following read every norm's
    factor as 'Boolean value of Tensor with more than one value is ambiguous'."""
    llama = next(a for a in ARCHS if a.name == "llama")
    plain, compiled = model_of(llama), model_of(llama)
    for layer in compiled.model.layers:
        layer.compile()
    ids = ids_of()
    want, got = measure_activations(plain, ids, ids), measure_activations(compiled, ids, ids)
    assert got.not_measured == want.not_measured == {}
    assert got.sink.per_layer == pytest.approx(want.sink.per_layer, rel=1e-6)
    assert got.norm_factor == pytest.approx(want.norm_factor, rel=1e-6)


def test_a_transformers_older_than_the_oldest_read_is_one_line_and_the_bound_is_the_one_installed_and_tested():
    """Before 5.23 the adapter failed deep inside (5.0: KeyError 'get_interface') and the exported model's
    forward raised TypeError; the refusal names the version and the install line, and pyproject's bound and
    the release .ci/run tests are that same oldest version."""
    import re
    from pathlib import Path

    from smallinit.adapters.hf import OLDEST_TRANSFORMERS, transformers_too_old

    oldest = ".".join(map(str, OLDEST_TRANSFORMERS))
    assert transformers_too_old("5.22.2") == (
        f"transformers 5.22.2 is older than {oldest}, the oldest smallinit reads; "
        f"pip install 'transformers>={oldest}'"
    )
    assert transformers_too_old("4.57.6") is not None
    assert transformers_too_old(f"{oldest}.0.dev0") is None and transformers_too_old("6.0.0") is None
    assert transformers_too_old(transformers.__version__) is None
    root = Path(__file__).resolve().parents[2]
    assert set(re.findall(r'"transformers>=([\d.]+)"', (root / "pyproject.toml").read_text())) == {oldest}
    assert re.findall(r'"transformers==([\d.]+)"', (root / ".ci" / "run").read_text()) == [f"{oldest}.0"]
