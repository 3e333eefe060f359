"""Each measurement stands on its own on Hugging Face architectures outside the matrix (issue 34): what a
model does not have is named in one line and the rest is measured, against references computed by hand
from transformers' own outputs (hidden states, eager attention probabilities) and from each norm's
formula as its modeling source writes it. Tiny configs, fp32, CPU."""

from __future__ import annotations

import dataclasses
import inspect
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
hf_tiny = pytest.importorskip("support.hf_tiny")

from smallinit.adapters import AttentionInputs, norm_forms  # noqa: E402
from smallinit.analysis import residual_flow_ratio, sink_scores  # noqa: E402
from smallinit.analysis.measure import analyze_model  # noqa: E402
from smallinit.errors import ModelError  # noqa: E402
from smallinit.init import set_norm_eps_  # noqa: E402
from smallinit.measures.activations import measure_activations  # noqa: E402
from smallinit.measures.sink import sink_from_attention, uniform_sink  # noqa: E402
from smallinit.report import analysis_lines  # noqa: E402

T = 16


def _ids(model, batch: int = 2) -> torch.Tensor:
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(1, vocab, (batch, T), generator=torch.Generator().manual_seed(0))


def _flow(e: torch.Tensor, h: torch.Tensor) -> float:
    e, h = e.double(), h.double()
    return ((h - e).norm(dim=-1) / e.norm(dim=-1)).mean().item()


def _eager_sink(model, ids) -> tuple[np.ndarray, float]:
    """Per (layer, head) mean weight on token 1 over queries 2…T, from the eager probabilities by hand, and
    what even attention over the same keys would give (1 / the number of keys each query sees)."""
    backend = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    finally:
        model.config._attn_implementation = backend
    even = np.mean([(1 / (a[:, :, 1:] > 0).sum(-1).double()).mean().item() for a in attentions])
    return np.stack([a[:, :, 1:, 0].double().mean(dim=(0, 2)).numpy() for a in attentions]), float(even)


def test_no_softmax_attention_leaves_the_sink_out_and_measures_the_rest():
    model = hf_tiny.build("mamba").eval()
    ids = _ids(model)
    result = measure_activations(model, ids, ids)
    assert result.sink is None
    why = result.not_measured["sink"]
    assert why.startswith("no softmax attention") and "\n" not in why
    assert set(result.not_measured) == {"sink", "max_attention_logit"}
    assert result.not_measured["max_attention_logit"] == why
    with pytest.raises(ModelError, match="no softmax attention"):
        sink_scores(model, ids)

    seen = {}  # e: the embedding's output, h_L: the final norm's input, by our own hooks
    hooks = [
        model.backbone.embeddings.register_forward_hook(lambda _m, _a, out: seen.__setitem__("e", out)),
        model.backbone.norm_f.register_forward_pre_hook(lambda _m, args: seen.__setitem__("h", args[0])),
    ]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    assert result.residual_flow == pytest.approx(_flow(seen["e"], seen["h"]), rel=1e-9)
    assert set(result.norm_factor) == {
        "backbone.layers.0.norm",
        "backbone.layers.1.norm",
        "backbone.norm_f",
    }

    analysed = analyze_model(model, [(ids, ids)])  # analyze: the matrices too, and one line on the sink
    assert analysed.matrices and analysed.sink is None and analysed.not_measured == result.not_measured
    lines = analysis_lines(dataclasses.replace(analysed, checkpoint="mamba"), T)
    assert f"not measured, sink: {why}" in lines and any(line.startswith("residual flow") for line in lines)


@pytest.mark.parametrize("arch", ["falcon", "roformer", "bloom", "openai-gpt"])
def test_attention_outside_the_interface_is_read_from_eager_probabilities(arch):
    """Whether a model calls transformers' attention interface is read from its modeling source, the
    reference, since releases move architectures onto it (Falcon did in 5.25): the note follows the source."""
    model = hf_tiny.build(arch).eval()
    ids = _ids(model)
    result = measure_activations(model, ids)
    by_hand, even = _eager_sink(model, ids)
    np.testing.assert_allclose(result.sink.per_head, by_hand, atol=1e-6, rtol=0)
    assert result.sink.uniform == pytest.approx(even)  # causal here, bidirectional in RoFormer's default
    outside = "ALL_ATTENTION_FUNCTIONS" not in inspect.getsource(sys.modules[type(model).__module__])
    noted = any(n.startswith("sink: read from eager attention probabilities") for n in result.notes)
    assert noted == outside
    assert "sink" not in result.not_measured


@pytest.mark.parametrize("arch", ["roformer", "bloom", "openai-gpt"])
def test_eager_probabilities_count_a_query_whose_weight_on_token_1_underflowed(arch):
    """Sharp attention read from eager probabilities (OpenAI-GPT masks with −1e4, Bloom with fp32's minimum,
    RoFormer not at all): every query i ≥ 2 sees token 1, so each counts, those whose weight underflowed to 0
    with weight 0."""
    model = hf_tiny.build(arch).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "query_key_value.weight", "c_attn.weight")):
                p.mul_(100.0)
    ids = _ids(model)
    result = measure_activations(model, ids)
    by_hand, _ = _eager_sink(model, ids)
    backend, model.config._attn_implementation = model.config._attn_implementation, "eager"
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    model.config._attn_implementation = backend
    assert np.mean([(a[:, :, 1:, 0] == 0).double().mean().item() for a in attentions]) > 0.2
    np.testing.assert_allclose(result.sink.per_head, by_hand, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["openai-gpt", "marian", "plbart"])
def test_without_a_final_norm_h_L_is_the_last_layers_output(arch):
    """OpenAI-GPT has no norm after its last layer; Marian's and PLBart's decoder layers are counted by
    decoder_layers (their num_hidden_layers counts the encoder's): transformers' own first and last hidden
    states are e and the last layer's output."""
    model = hf_tiny.build(arch).eval()
    ids = _ids(model)
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    result = measure_activations(model, ids)
    assert result.residual_flow == pytest.approx(_flow(hidden[0], hidden[-1]), rel=1e-9)
    assert residual_flow_ratio(model, ids) == result.residual_flow
    assert any(n.startswith("residual_flow: h_L is the last layer's output") for n in result.notes)
    eager = any(n.startswith("sink: read from eager attention probabilities") for n in result.notes)
    assert set(result.not_measured) == ({"max_attention_logit"} if eager else set())  # no q, k: no logits


def _small_inputs(model, scale: float = 1e-3):
    """Embeddings shrunk so that every norm's input sits near its ε: a wrong ε or form shows."""
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(scale)
    return model


@pytest.mark.parametrize(
    "arch,eps,centered,names",
    [
        ("olmo", 1e-5, True, "input_layernorm"),  # OlmoLayerNorm: F.layer_norm(..., eps=1e-5), no attribute
        ("cohere", 1e-5, True, "q_norm"),  # CohereLayerNorm with a 2-D (heads, head_dim) weight
        ("llama4_text", 1e-5, False, "qk_norm"),  # Llama4TextL2Norm: weightless, x·rsqrt(mean(x²) + ε)
    ],
)
def test_norms_without_an_eps_attribute_or_of_another_shape_are_measured(arch, eps, centered, names):
    model = _small_inputs(hf_tiny.build(arch).eval())
    ids = _ids(model)
    inputs = {}  # every call (Llama 4's qk_norm runs on q and on k)
    hooks = [
        m.register_forward_pre_hook(
            lambda _m, args, n=n: inputs.setdefault(n, []).append(args[0].flatten(0, -2))
        )
        for n, m in model.named_modules()
        if n.endswith(names)
    ]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    result = measure_activations(model, ids)
    assert not [k for k in result.not_measured if k.startswith("norm_factor")]
    assert inputs
    for name, calls in inputs.items():  # the formula of the modeling source, with its ε
        x = torch.cat(calls).double()
        var = x.var(-1, unbiased=False) if centered else x.pow(2).mean(-1)
        assert result.norm_factor[name] == pytest.approx(
            torch.sqrt(var / (var + eps)).mean().item(), abs=1e-5
        )
        assert norm_forms(model)[name].eps == pytest.approx(
            eps, rel=1e-3
        )  # read from the forward where hard-coded
    assert min(result.norm_factor.values()) < 0.9  # ε is felt: a wrong one could not pass


def _rms_factor(h: torch.Tensor, eps: float) -> float:
    ms = h.pow(2).mean(-1)
    return torch.sqrt(ms / (ms + eps)).mean().item()


def test_a_gated_norm_is_measured_on_what_it_normalises():
    """Mamba-2's gated norm normalises x·silu(z) (modeling_mamba2.MambaRMSNormGated), not its input x."""
    config = transformers.Mamba2Config(
        vocab_size=96,
        hidden_size=64,
        num_heads=8,
        head_dim=16,
        expand=2,
        n_groups=1,
        state_size=16,
        num_hidden_layers=2,
        conv_kernel=4,
    )
    torch.manual_seed(0)
    model = transformers.Mamba2ForCausalLM(config).eval()
    with torch.no_grad():  # x and z small, so that x·silu(z) sits near ε
        for layer in model.backbone.layers:
            layer.mixer.in_proj.weight.mul_(0.03)
    ids = _ids(model)
    calls = {}
    hooks = [
        model.get_submodule(f"backbone.layers.{i}.mixer.norm").register_forward_pre_hook(
            lambda _m, args, kwargs, i=i: calls.__setitem__(i, (args, kwargs)), with_kwargs=True
        )
        for i in range(2)
    ]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    factors = measure_activations(model, ids).norm_factor
    for i, (args, kwargs) in calls.items():
        norm = model.get_submodule(f"backbone.layers.{i}.mixer.norm")
        x, z = args[0].double(), (args[1] if len(args) > 1 else kwargs["gate"]).double()
        g = x * torch.nn.functional.silu(z)
        on_g, on_x = (_rms_factor(h, norm.variance_epsilon) for h in (g, x))
        assert factors[f"backbone.layers.{i}.mixer.norm"] == pytest.approx(on_g, abs=1e-5)
        assert abs(on_g - on_x) > 0.05  # on x it would read differently


def test_a_norm_over_groups_of_channels_is_the_mean_of_its_groups_factors():
    """Bamba's gated norm with n_groups = 4 normalises each group of 32 channels of x·silu(z) on its own
    (modeling_bamba.BambaRMSNormGated): its factor is the mean over tokens and groups, as a per-head norm's is
    over heads. The first group's z is made large, so it is far from saturated while the others are: the rms
    over groups, which a ratio of whole-row norms gives, would read 0.47 here against a mean of 0.29."""
    config = transformers.BambaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, attn_layer_indices=[], mamba_n_heads=8, mamba_d_head=16, mamba_expand=2,
        mamba_d_state=8, mamba_n_groups=4, mamba_d_conv=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BambaForCausalLM(config).eval()
    mixer = model.model.layers[0].mamba
    with torch.no_grad():
        mixer.in_proj.weight[: mixer.norm.group_size].mul_(30.0)  # the rows of z that gate the first group
    ids = _ids(model)
    calls = []
    hook = mixer.norm.register_forward_pre_hook(lambda _m, a, k: calls.append((a, k)), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    hook.remove()
    ((args, kwargs),) = calls
    x, z = args[0].double(), (args[1] if len(args) > 1 else kwargs["gate"]).double()
    groups = (x * torch.nn.functional.silu(z)).unflatten(-1, (4, 32))  # (B, T, group, channel)
    ms = groups.pow(2).mean(-1)
    per_group = torch.sqrt(ms / (ms + mixer.norm.variance_epsilon))
    assert per_group.mean((0, 1)).max() > 0.8 > 0.2 > per_group.mean((0, 1)).min()  # groups far apart
    factor = measure_activations(model, ids).norm_factor["model.layers.0.mamba.norm"]
    assert factor == pytest.approx(per_group.mean().item(), rel=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_uniform_sink_is_the_score_of_even_attention(window):
    """q = k = 0: every key a query may see gets the same score, so the attention is exactly even."""
    zeros = torch.zeros(2, 3, T, 4)
    scores = sink_from_attention([AttentionInputs(name="even", q=zeros, k=zeros, window=window)])
    assert scores.mean == pytest.approx(uniform_sink(T, window), abs=1e-7)
    assert scores.uniform == pytest.approx(uniform_sink(T, window), abs=1e-7)
    assert uniform_sink(T, 5) > uniform_sink(T)  # a window of 5 keys: at least 1/5 each


def test_the_uniform_reference_follows_a_sliding_window():
    config = transformers.MistralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=6,
    )
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).eval()
    sink = measure_activations(model, _ids(model)).sink
    assert sink.uniform_per_layer == pytest.approx([uniform_sink(T, 6)] * 2)
    assert sink.uniform == pytest.approx(uniform_sink(T, 6)) and uniform_sink(T, 6) != pytest.approx(
        uniform_sink(T)
    )


@pytest.mark.parametrize("arch", ["stablelm", "roberta-prelayernorm"])
def test_set_norm_eps_sets_norms_it_used_to_refuse(arch):
    """StableLM's per-head q/k norm is a list of nn.LayerNorm with ε; roberta-prelayernorm's encoder and
    attention modules are named "…PreLayerNorm…" but are not norms."""
    config = hf_tiny.tiny_config(arch)
    if arch == "stablelm":
        config.qk_layernorm = True
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    touched = set_norm_eps_(model, 1e-12)
    layer_norms = {n for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}
    assert set(touched) == layer_norms and all(model.get_submodule(n).eps == 1e-12 for n in touched)
    if arch == "stablelm":
        assert any(".q_layernorm.norms." in n for n in touched)


def test_the_report_shows_an_analysis_without_a_sink_and_says_why(tmp_path):
    from smallinit.analysis import analyze_model
    from smallinit.report import build_report, write_analysis

    x = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    write_analysis(analyze_model(hf_tiny.build("mamba"), [(x[:, :-1], x[:, 1:])]), tmp_path)
    html = build_report(tmp_path).read_text()
    assert "Single-model analyses" in html and "sink not measured: no softmax attention" in html


def test_a_model_in_training_mode_is_measured_without_dropout_and_left_as_it_was():
    """GPT-2 built from a config is in training mode (dropout 0.1 on embeddings, attention and branches): the
    forward measure_activations observes ran with it, so two measurements of one model differed. Measured now as
    its eval-mode forward, the flow computed here from transformers' own hidden states, and every module keeps
    its mode (a part the user froze in eval stays so)."""
    model = hf_tiny.build("gpt2")
    ids = _ids(model)
    model.transformer.h[0].eval()
    assert model.training and model.config.resid_pdrop > 0
    first, second = measure_activations(model, ids), measure_activations(model, ids)
    assert first.residual_flow == second.residual_flow and first.norm_factor == second.norm_factor
    model.eval()
    seen = []
    hook = model.transformer.ln_f.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))  # h_L
    with torch.no_grad():
        e = model(input_ids=ids, output_hidden_states=True).hidden_states[0]
    hook.remove()
    assert first.residual_flow == pytest.approx(_flow(e, seen[0]), rel=1e-6)
    model.train()
    model.transformer.h[0].eval()
    measure_activations(model, ids)
    assert model.training and model.transformer.h[1].training
    assert not model.transformer.h[0].training and not model.transformer.h[0].attn.training


def test_the_measured_forward_builds_no_autograd_graph():
    """A measurement reads the forward and keeps none of it for a backward: with the parameters requiring grad,
    every layer runs under no_grad (a graph kept alive would hold each layer's activations until the end)."""
    model = hf_tiny.build("llama")
    graded = []
    hooks = [
        m.register_forward_hook(lambda _m, _a, out: graded.append(torch.is_grad_enabled()))
        for m in model.modules()
    ]
    measure_activations(model, _ids(model))
    for h in hooks:
        h.remove()
    assert graded and not any(graded)
