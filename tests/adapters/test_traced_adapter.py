"""The adapter found from a model's own forward (smallinit.adapters.traced) against references computed by
hand: on a decoder written here with no library (its own names, a fused qkv, nn.RMSNorm, RoPE, SDPA or an
eager softmax) and on Hugging Face architectures read through it instead of their own adapter."""

from __future__ import annotations

import logging
import math
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from smallinit import Monitor
from smallinit.adapters import HFAdapter, TracedAdapter, as_adapter
from smallinit.errors import ConfigError, ModelError
from smallinit.measures.activations import measure_activations
from smallinit.monitor.records import parse_record

VOCAB, D, HEADS, KV_HEADS, HD, T = 97, 48, 4, 2, 12, 12


def _rope(x: torch.Tensor) -> torch.Tensor:
    t = torch.arange(x.shape[-2], dtype=torch.float32)
    freq = 1.0 / 10000 ** (torch.arange(0, x.shape[-1], 2, dtype=torch.float32) / x.shape[-1])
    angle = torch.outer(t, freq)
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


_compiled_flex = torch.compile(flex_attention)  # bound in the module, as torchtitan binds its compiled flex


def _alibi_capped(score, b, h, q_idx, kv_idx):
    """A score_mod: ALiBi's per-head penalty on the distance, then soft-capping at 5."""
    return 5.0 * torch.tanh((score - (h + 1) * 0.5 * (q_idx - kv_idx)) / 5.0)


class Mixer(nn.Module):
    def __init__(self, eager: bool):
        super().__init__()
        self.wqkv = nn.Linear(D, (HEADS + 2 * KV_HEADS) * HD, bias=False)
        self.wo = nn.Linear(HEADS * HD, D, bias=False)
        self.eager, self.probs, self.score_mod = eager, None, _alibi_capped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.wqkv(x).split((HEADS * HD, KV_HEADS * HD, KV_HEADS * HD), dim=-1)
        q = _rope(q.view(B, L, HEADS, HD).transpose(1, 2))
        k = _rope(k.view(B, L, KV_HEADS, HD).transpose(1, 2))
        v = v.view(B, L, KV_HEADS, HD).transpose(1, 2)
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        if self.eager == "flex":
            causal = create_block_mask(lambda b, h, i, j: j <= i, None, None, L, L, device="cpu")
            y = flex_attention(q, k, v, block_mask=causal)
        elif self.eager in ("flex-mod", "flex-mod-eager"):  # compiled, or not: the same attention
            causal = create_block_mask(lambda b, h, i, j: j <= i, None, None, L, L, device="cpu")
            self.qk = (q, k)
            attend = _compiled_flex if self.eager == "flex-mod" else flex_attention
            y = attend(q, k, v, score_mod=self.score_mod, block_mask=causal)
        elif self.eager:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(HD)
            s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
            self.probs = torch.softmax(s, dim=-1)
            y = self.probs @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, L, HEADS * HD))


class Ffn(nn.Module):
    def __init__(self):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = nn.Linear(D, 96), nn.Linear(D, 96), nn.Linear(96, D)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Layer(nn.Module):
    def __init__(self, eager: bool, attention: bool = True, norm: bool = True):
        super().__init__()
        make = (lambda: nn.RMSNorm(D, eps=1e-3)) if norm else nn.Identity
        self.pre_mix, self.pre_ffn = make(), make()
        self.mix = Mixer(eager) if attention else nn.Linear(D, D)
        self.ffn = Ffn()

    def forward(self, x):
        x = x + self.mix(self.pre_mix(x))
        return x + self.ffn(self.pre_ffn(x))


class Decoder(nn.Module):
    """A decoder of no library: token table, a stack of layers, a final nn.RMSNorm, an untied readout."""

    def __init__(self, eager: bool = False, attention: bool = True, norm: bool = True, n_layers: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(VOCAB, D)
        self.stack = nn.ModuleList(Layer(eager, attention, norm) for _ in range(n_layers))
        self.last = nn.RMSNorm(D, eps=1e-3) if norm else nn.Identity()
        self.readout = nn.Linear(D, VOCAB, bias=False)
        with torch.no_grad():
            self.table.weight.mul_(0.05)  # small inputs, so the norms' ε matters and a wrong form shows

    def forward(self, ids):
        h = self.table(ids)
        for layer in self.stack:
            h = layer(h)
        return self.readout(self.last(h))


def _ids(batch: int = 3, seq: int = T) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))


def _by_hand(model: Decoder, ids: torch.Tensor) -> dict:
    """Sink per layer from the eager probabilities the model itself kept, the flow from the first layer's
    input and the final norm's input, each norm's factor σ/√(σ² + ε) from its input."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_pre_hook(lambda _m, a, n=n: inputs.__setitem__(n, a[0]))
        for n, m in model.named_modules()
        if isinstance(m, (nn.RMSNorm, Layer))
    ]
    for layer in model.stack:
        layer.mix.eager = True
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    e, h_L = inputs["stack.0"].double(), inputs["last"].double()
    factors = {}
    for name, x in inputs.items():
        if name.startswith("stack.") and name.count(".") == 1:
            continue
        var = x.double().pow(2).mean(-1)
        factors[name] = torch.sqrt(var / (var + 1e-3)).mean().item()
    sink = [layer.mix.probs[:, :, 1:, 0].double().mean().item() for layer in model.stack]
    return {
        "sink": sink,
        "flow": ((h_L - e).norm(dim=-1) / e.norm(dim=-1)).mean().item(),
        "norm_factor": factors,
    }


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("eager", [False, True, "flex"], ids=["sdpa", "eager-softmax", "flex"])
def test_a_decoder_of_no_library_is_measured_as_by_hand(eager):
    model = Decoder(eager=eager).eval()
    ids = _ids()
    adapter = as_adapter(model)
    assert isinstance(adapter, TracedAdapter) and adapter.vocab_size == VOCAB
    result = measure_activations(model, ids, ids)
    ref = _by_hand(model, ids)
    assert set(result.not_measured) == (
        {"max_attention_logit"} if eager is True else set()
    )  # probabilities only
    assert result.sink.layers == ("stack.0.mix", "stack.1.mix", "stack.2.mix")
    np.testing.assert_allclose(result.sink.per_layer, ref["sink"], rtol=1e-5)
    assert result.residual_flow == pytest.approx(ref["flow"], rel=1e-6)
    assert set(result.norm_factor) == set(ref["norm_factor"]) and len(ref["norm_factor"]) == 7
    for name, f in ref["norm_factor"].items():
        assert result.norm_factor[name] == pytest.approx(f, rel=1e-6), name
    assert min(ref["norm_factor"].values()) < 0.9  # ε matters here, so a wrong form would show
    assert result.loss == pytest.approx(
        F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).item(), rel=1e-6
    )


def test_what_a_model_lacks_is_named_in_one_line_and_the_rest_measured():
    ids = _ids()
    no_attention = measure_activations(Decoder(attention=False).eval(), ids)
    assert set(no_attention.not_measured) == {"sink", "max_attention_logit"} and no_attention.sink is None
    assert no_attention.not_measured["sink"].startswith("no softmax attention: Decoder made no")
    assert no_attention.residual_flow is not None and no_attention.norm_factor

    no_norm = measure_activations(Decoder(norm=False).eval(), ids)
    assert no_norm.not_measured == {"norm_factor": "no norm layer ran in the forward"}
    assert no_norm.notes == (
        "residual_flow: h_L is the last layer's output: no norm module of Decoder takes it after the last layer",
    )

    class Flat(nn.Module):  # an embedding and a readout, no stack of blocks, no attention, no norm
        def __init__(self):
            super().__init__()
            self.table, self.readout = nn.Embedding(VOCAB, D), nn.Linear(D, VOCAB)

        def forward(self, ids):
            return self.readout(self.table(ids))

    flat = measure_activations(Flat(), ids)
    assert set(flat.not_measured) == {
        "sink",
        "max_attention_logit",
        "residual_flow",
        "massive",
        "norm_factor",
    }
    assert flat.not_measured["residual_flow"].startswith("no stack of blocks in Flat")
    assert flat.not_measured["massive"] == flat.not_measured["residual_flow"]  # one reason: one observation
    assert all("\n" not in why for why in flat.not_measured.values())


def test_a_forward_that_cannot_be_run_on_token_ids_says_what_to_pass():
    class TwoInputs(Decoder):
        def forward(self, ids, positions):  # noqa: ARG002
            return super().forward(ids)

    model, ids = TwoInputs().eval(), _ids()
    with pytest.raises(
        ModelError, match=r"^cannot run TwoInputs\(tokens\) on token ids \(TypeError: .*pass call="
    ) as e:
        measure_activations(model, ids)
    assert "\n" not in str(e.value)

    class Features(Decoder):
        def forward(self, ids):
            return {"features": super().forward(ids)}

    with pytest.raises(
        ModelError, match=r"gave dict, not logits of shape \(batch, T, vocabulary\); pass call="
    ):
        measure_activations(Features().eval(), ids)
    told = TracedAdapter(TwoInputs().eval(), call=lambda m, t: m(t, None))
    assert measure_activations(told, ids).not_measured == {}


transformers = pytest.importorskip("transformers")
hf_archs = pytest.importorskip("support.hf_archs")  # its architectures, built as its tests build them
hf_tiny = pytest.importorskip("support.hf_tiny")


@pytest.mark.parametrize(
    "arch",
    [
        a
        for a in hf_archs.ARCHS
        if a.name in ("mistral-gqa-sliding", "gemma2-softcap", "gpt-oss-sinks", "gpt2")
    ],
    ids=lambda a: a.name,
)
def test_hf_architectures_read_from_their_forward_agree_with_their_own_adapter(arch):
    """SDPA with GQA and windows, eager softmax with soft-capping or learned sinks, gated norms, (1 + w)
    norms, GPT-2's Conv1D: found from the forward, the numbers are those of the Hugging Face adapter, whose
    tests check them against eager probabilities and each norm's formula."""
    model, ids = hf_archs.model(arch), hf_archs.ids()
    own = measure_activations(HFAdapter(model), ids, ids)
    found = measure_activations(TracedAdapter(model), ids, ids)
    assert own.not_measured == {}
    # soft-capped or sink-logit attention is read from its eager probabilities: no q, k, so no logits, said so
    assert all(
        k == "max_attention_logit" and "probabilities only" in v for k, v in found.not_measured.items()
    )
    if found.max_attention_logit:
        assert found.max_attention_logit == pytest.approx(own.max_attention_logit, rel=1e-6)
    np.testing.assert_allclose(found.sink.per_layer, own.sink.per_layer, atol=1e-7, rtol=0)
    assert found.residual_flow == pytest.approx(own.residual_flow, rel=1e-12)
    assert found.norm_factor == pytest.approx(own.norm_factor, rel=1e-12)
    assert found.loss == pytest.approx(own.loss, rel=1e-12)


def _bloom():  # fused_qkv.view(B, T, H, 3, hd): q = [..., 0, :], k = [..., 1, :], v = [..., 2, :]
    cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
    rows = torch.arange(3 * 32).view(4, 3, 8)
    return (
        cfg,
        "transformer.h.{}.self_attention.query_key_value.weight",
        [rows[:, i].flatten() for i in range(3)],
    )


def _falcon():  # multi-query; fused_qkv.view(B, T, H + 2, hd).split([H, 1, 1], dim=-2); FalconLinear: x @ W.T
    cfg = transformers.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        multi_query=True,
        alibi=True,
    )
    rows = torch.arange(32 + 2 * 8)
    return cfg, "transformer.h.{}.self_attention.query_key_value.weight", [rows[:32], rows[32:40], rows[40:]]


def _bigcode():  # multi-query; c_attn(h).split((d, hd, hd), dim=-1)
    cfg = transformers.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, multi_query=True)
    rows = torch.arange(32 + 2 * 8)
    return cfg, "transformer.h.{}.attn.c_attn.weight", [rows[:32], rows[32:40], rows[40:]]


def _neox():  # qkv.view(B, T, H, 3·hd).chunk(3, dim=-1): per head [q | k | v]
    cfg = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    rows = torch.arange(3 * 32).view(4, 3, 8)
    return (
        cfg,
        "gpt_neox.layers.{}.attention.query_key_value.weight",
        [rows[:, i].flatten() for i in range(3)],
    )


@pytest.mark.parametrize("adapter", [TracedAdapter, HFAdapter], ids=["traced", "hf"])
@pytest.mark.parametrize(
    ("build", "implementation"),
    [(_bloom, "eager"), (_falcon, "eager"), (_falcon, "sdpa"), (_bigcode, "sdpa"), (_neox, "eager")],
    ids=["bloom", "falcon-multi-query", "falcon-multi-query-sdpa", "gpt-bigcode-multi-query", "gpt-neox"],
)
def test_fused_parts_are_split_as_the_modeling_source_splits_them(tmp_path, build, implementation, adapter):
    """Bloom's query_key_value is laid out per head as [q, k, v] and its scores come from one baddbmm (ALiBi
    + q·kᵀ) on (batch·heads, T, hd) tensors; multi-query Falcon's is [Q: d | K: hd | V: hd] and its linear is
    a written-out x @ W.T; GPTBigCode's c_attn is [Q: d | K: hd | V: hd]; GPT-NeoX's per head [q | k | v].
    Each part is the rows the modeling source's views and splits take, found from the forward by the adapter
    found from it and by Hugging Face's (the Monitor's, which recorded the fused matrices whole and no part)."""
    cfg, name, expected = build()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation).eval()
    observer = adapter(model)
    with torch.no_grad():
        observer.observe(_ids(2), kinds=("attention",))
    layers = [name.format(i) for i in range(2)]
    for layer in layers:
        assert {p: r.sort().values.tolist() for p, r in observer.parts[layer].items()} == {
            p: r.tolist() for p, r in zip("qkv", expected)
        }
    if adapter is HFAdapter:
        with Monitor(model, every=1, batch=_ids(2), out=tmp_path / "run") as monitor:
            ranks = parse_record(monitor(0)).by_matrix("stable_rank")
        W = model.get_parameter(layers[1]).detach()
        for p, rows in zip("qkv", expected):
            assert ranks[f"{layers[1]}[{p}]"] == pytest.approx(_exact_stable_rank(W[rows]), rel=1e-4)


class _SelectingMixer(nn.Module):
    """Multi-query attention whose key and value are copies of some of the fused product's elements, as Falcon's
    before transformers 5.25 took them: ``fused[..., [-2], :]`` and ``index_select``."""

    def __init__(self, eager: bool, gather: bool = False):
        super().__init__()
        self.wqkv, self.eager, self.gather = nn.Linear(D, (HEADS + 2) * HD, bias=False), eager, gather

    def forward(self, x):
        B, L, _ = x.shape
        fused = self.wqkv(x).view(B, L, HEADS + 2, HD)
        q, k = fused[..., :-2, :], fused[..., [-2], :]
        if self.gather:  # an index the follower does not read: k is taken as made of every row it spans
            k = fused.gather(-2, torch.full((B, L, 1, HD), HEADS))
        v = fused.index_select(-2, torch.tensor([HEADS + 1]))
        q, k, v = (t.transpose(1, 2) for t in (q, k.expand_as(q), v.expand_as(q)))
        if self.eager:
            s = (q @ k.transpose(-2, -1)).masked_fill(
                ~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")
            )
            y = torch.softmax(s, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, L, HEADS * HD)


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager-softmax"])
def test_parts_copied_out_by_an_index_are_the_rows_it_selects(eager):
    """A part taken by an index (a list, index_select) is a copy of the product's elements; its rows are those
    the index selects (before, the copy was made of all the rows the indexed view spans, every part overlapped,
    and the fused matrix was recorded whole with no line)."""
    model = Decoder(eager)
    for layer in model.stack:
        layer.mix = _SelectingMixer(eager)
    observer = TracedAdapter(model)
    with torch.no_grad():
        observer.observe(_ids(2), kinds=("attention",))
    rows = torch.arange((HEADS + 2) * HD)
    for i in range(len(model.stack)):
        assert {
            p: r.sort().values.tolist() for p, r in observer.parts[f"stack.{i}.mix.wqkv.weight"].items()
        } == {
            "q": rows[: HEADS * HD].tolist(),
            "k": rows[HEADS * HD : (HEADS + 1) * HD].tolist(),
            "v": rows[(HEADS + 1) * HD :].tolist(),
        }


def test_a_fused_matrix_whose_parts_cannot_be_told_apart_is_said_to_be_recorded_whole(tmp_path, caplog):
    """Where q, k and v are all made of one matrix but followed to overlapping rows, the Monitor records the
    matrix whole and says so once, naming each such matrix (before, it said nothing)."""
    model = Decoder()
    for layer in model.stack:
        layer.mix = _SelectingMixer(eager=False, gather=True)
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        with Monitor(model.eval(), every=1, batch=_ids(2), out=tmp_path / "run") as monitor:
            ranks = [parse_record(monitor(step)).by_matrix("stable_rank") for step in (0, 1)]
    said = [r.getMessage() for r in caplog.records if "could not be told apart" in r.getMessage()]
    assert len(said) == 1
    for i in range(len(model.stack)):
        assert f"stack.{i}.mix.wqkv.weight" in said[0]
        assert f"stack.{i}.mix.wqkv.weight" in ranks[1] and f"stack.{i}.mix.wqkv.weight[q]" not in ranks[1]


def test_the_monitor_learns_a_hugging_face_models_fused_parts_at_its_start(tmp_path):
    """Following the parts keeps every product of the forward alive, so the Monitor does it once at its start
    on one sequence, for a Hugging Face model as for any other (before, the first observation followed them with
    the whole held-out batch: on the engines, up to 8 training steps' peak memory)."""
    cfg, name, expected = _neox()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with Monitor(model, every=1, batch=_ids(4), out=tmp_path / "run") as monitor:
        assert isinstance(monitor.adapter, HFAdapter) and monitor.adapter.parts is not None
        ranks = parse_record(monitor(0)).by_matrix("stable_rank")
    W = model.get_parameter(name.format(1)).detach()
    for p, rows in zip("qkv", expected):
        assert ranks[f"{name.format(1)}[{p}]"] == pytest.approx(_exact_stable_rank(W[rows]), rel=1e-4)


@pytest.fixture
def opaque_kernel():
    """An attention implementation registered by name whose kernel no torch function mode sees, as a compiled or
    external kernel (flash attention, a hub kernel) is seen: SDPA called with torch functions disabled."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def forward(*args, **kwargs):
        with torch._C.DisableTorchFunction():
            return sdpa_attention_forward(*args, **kwargs)

    transformers.AttentionInterface.register("opaque", forward)
    yield "opaque"
    del transformers.AttentionInterface._global_mapping["opaque"]


def test_fused_parts_are_found_where_the_attention_kernel_is_hidden(opaque_kernel):
    """The queries, keys and values of a Hugging Face attention call are read where the interface hands them to
    the kernel, so a fused matrix's parts are found whatever the kernel (before, only an SDPA or eager product
    the adapter could see found them, and under another kernel the matrix was recorded whole, no line)."""
    cfg, name, expected = _neox()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=opaque_kernel).eval()
    observer = HFAdapter(model)
    with torch.no_grad():
        observer.observe(_ids(2), kinds=("attention",))
    for layer in (name.format(i) for i in range(2)):
        assert {p: r.sort().values.tolist() for p, r in observer.parts[layer].items()} == {
            p: r.tolist() for p, r in zip("qkv", expected)
        }


def test_a_norm_that_returns_its_scale_is_measured_by_its_formula():
    """HY-V4's hyper-connection input_norm returns rsqrt(mean(x²) + ε), one number per row, not a normed
    row: its factor over the ideal 1/σ is σ/√(σ² + ε), computed here from each call's input."""
    cfg = hf_tiny.tiny_config("hy_v4")
    cfg.num_key_value_heads = cfg.num_attention_heads  # HY-V4's attention repeats no key heads
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = _ids(2, 16) % cfg.vocab_size
    scale_norms = {n: m for n, m in model.named_modules() if type(m).__name__ == "HYV4UnweightedRMSNorm"}
    assert len(scale_norms) == 5
    inputs: dict[str, list[torch.Tensor]] = {}
    hooks = [
        m.register_forward_pre_hook(lambda _m, a, n=n: inputs.setdefault(n, []).append(a[0].double()))
        for n, m in scale_norms.items()
    ]
    result = measure_activations(model, ids, ids)
    for h in hooks:
        h.remove()
    for name in scale_norms:  # ε from the config that built them: the attribute's name moves between releases
        ms = torch.cat([x.flatten(0, -2) for x in inputs[name]]).pow(2).mean(-1)
        reference = torch.sqrt(ms / (ms + cfg.rms_norm_eps)).mean().item()
        assert result.norm_factor[name] == pytest.approx(reference, rel=1e-6), name
        assert reference < 0.95  # ε is felt, so reading the scale as a normed row would show


def _exact_stable_rank(W: torch.Tensor) -> float:
    s = torch.linalg.svdvals(W.double())
    return (s.pow(2).sum() / s[0] ** 2).item()


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager-softmax"])
def test_the_monitor_watches_every_matrix_and_each_part_of_a_fused_one(tmp_path, eager):
    model, ids = Decoder(eager=eager).eval(), _ids(2)
    with Monitor(model, every=1, batch=ids, out=tmp_path / "run") as monitor:
        record = monitor(0)
    ranks = parse_record(record).by_matrix("stable_rank")
    weights = {n for n, p in model.named_parameters() if p.dim() == 2}  # every matrix, the table too
    wqkv = model.stack[1].mix.wqkv.weight
    q, k, v = wqkv[: HEADS * HD], wqkv[HEADS * HD : (HEADS + KV_HEADS) * HD], wqkv[(HEADS + KV_HEADS) * HD :]
    assert weights <= set(ranks)
    for name, W in {"": wqkv, "[q]": q, "[k]": k, "[v]": v}.items():
        assert ranks[f"stack.1.mix.wqkv.weight{name}"] == pytest.approx(_exact_stable_rank(W), rel=1e-4)
    assert len(ranks) == len(weights) + 3 * len(model.stack)
    with pytest.raises(
        ConfigError, match=r"^matrices pattern '\*\.q_proj\.weight' matches no weight matrix of Decoder"
    ):
        Monitor(
            model, every=1, batch=ids, out=tmp_path / "other", matrices=["*.wo.weight", "*.q_proj.weight"]
        )


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager-softmax"])
def test_the_parts_are_followed_once_and_later_observations_keep_no_product_alive(eager):
    """Following which rows of a fused matrix make q, k and v keeps every product of the forward alive until
    it ends (on torchtitan's debug model, more memory than a training step): the first observation of
    attention learns the parts, later ones keep no product the measurements do not read and give the same
    parts. Read here: whether the first block's w_gate output is still alive when the readout runs."""
    model, ids = Decoder(eager=eager).eval(), _ids(2)
    adapter, outputs, alive = TracedAdapter(model), [], []
    model.stack[0].ffn.w_gate.register_forward_hook(lambda _m, _a, out: outputs.append(weakref.ref(out)))
    model.readout.register_forward_pre_hook(lambda _m, _a: alive.append(outputs[-1]() is not None))
    with torch.no_grad():
        adapter.observe(ids, kinds=("residual",))  # the blocks are found; nothing asks for the parts
        alive.clear()
        adapter.observe(ids, kinds=("attention",))
        parts = {name: {p: r.clone() for p, r in rows.items()} for name, rows in adapter.parts.items()}
        adapter.observe(ids, kinds=("attention", "residual", "norms"))
    assert alive == [True, False]  # followed on the first observation, not on the second
    assert set(parts) == {f"stack.{i}.mix.wqkv.weight" for i in range(3)}
    assert {n: {p: r.tolist() for p, r in rows.items()} for n, rows in adapter.parts.items()} == {
        n: {p: r.tolist() for p, r in rows.items()} for n, rows in parts.items()
    }


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_compiled_flex_attention_with_a_score_mod_is_measured_as_flex_computes_it():
    """A compiled flex_attention with a score_mod (ALiBi's distance penalty, soft-capped), measured on the CPU
    by smallinit's math path of it: the sink per layer is the weight flex_attention itself puts on token 1
    (its output for values that are 1 on token 1 and 0 elsewhere, on the q and k of the measured forward),
    and the logits while measuring are those of the same model with flex_attention uncompiled."""
    from smallinit.measures.sink import sink_from_attention

    model, ids = Decoder(eager="flex-mod").eval(), _ids(2)
    with torch.no_grad():
        observed = TracedAdapter(model).observe(ids, kinds=("attention",))
        assert not observed.missing and "math path" in observed.notes["attention"], observed.notes
        sink = sink_from_attention(observed.attention)
        expected = []
        for layer in model.stack:
            q, k = layer.mix.qk
            ones = torch.zeros_like(k)
            ones[:, :, 0, 0] = 1.0  # v: 1 on token 1, so the output is the weight on it
            causal = create_block_mask(lambda b, h, i, j: j <= i, None, None, T, T, device="cpu")
            weight = flex_attention(q, k, ones, score_mod=_alibi_capped, block_mask=causal)[..., 0]
            expected.append(weight[:, :, 1:].double().mean().item())
        assert sink.per_layer == pytest.approx(expected, rel=1e-5)
        uncompiled = Decoder(eager="flex-mod-eager").eval()
        torch.testing.assert_close(observed.logits, uncompiled(ids), rtol=1e-5, atol=1e-6)
    # a score_mod written for one score alone (a reduction over its last axis: the identity there) cannot be
    # evaluated on all the scores at once: one line, never a number
    broken = Decoder(eager="flex-mod").eval()
    for layer in broken.stack:
        layer.mix.score_mod = lambda score, b, h, q_idx, kv_idx: score.sum(-1, keepdim=True)
    with torch.no_grad():
        got = measure_activations(broken, ids)
    assert (
        got.sink is None
        and "score_mod cannot be evaluated on broadcast index tensors" in (got.not_measured["sink"])
    ), got.not_measured


class SharpDecoder(nn.Module):
    """Eager attention sharp enough that many queries' weight on token 1 underflows to exactly 0 although
    their mask lets them see it: scores scaled by ``sharp``, GQA by repeated keys, an optional sliding window
    filled with −inf and a causal mask added as the dtype's minimum, in ``dtype``. Keeps its probabilities and
    the mask it built, so the test reads both from the model itself."""

    def __init__(self, kv_heads: int, window: int | None, dtype: torch.dtype, sharp: float = 60.0):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(VOCAB, D)
        self.stack = nn.ModuleList(nn.Linear(D, (HEADS + 2 * kv_heads) * HD, bias=False) for _ in range(2))
        self.readout = nn.Linear(D, VOCAB, bias=False)
        self.kv_heads, self.window, self.sharp = kv_heads, window, sharp
        self.probs: list[torch.Tensor] = []
        self.to(dtype)

    def forward(self, ids):
        B, L = ids.shape
        h, self.probs = self.table(ids), []
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        self.sees = causal if self.window is None else causal & ~torch.ones(L, L).tril(-self.window).bool()
        for qkv in self.stack:
            q, k, v = qkv(h).split((HEADS * HD, self.kv_heads * HD, self.kv_heads * HD), dim=-1)
            q, k, v = (t.view(B, L, -1, HD).transpose(1, 2) for t in (q, k, v))
            rep = HEADS // self.kv_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = (q @ k.transpose(-2, -1)) * self.sharp
            s = s + torch.zeros(L, L, dtype=s.dtype).masked_fill(~causal, torch.finfo(s.dtype).min)
            if self.window is not None:
                s = s.masked_fill(~self.sees, float("-inf"))
            self.probs.append(torch.softmax(s.float(), dim=-1))
            h = h + (self.probs[-1].to(s.dtype) @ v).transpose(1, 2).reshape(B, L, D)
        return self.readout(h)


@pytest.mark.parametrize(
    "kv_heads,window,dtype",
    [
        (HEADS, None, torch.float32),
        (KV_HEADS, None, torch.float32),
        (HEADS, 5, torch.float32),
        (KV_HEADS, 5, torch.float16),
    ],
    ids=["mha", "gqa", "sliding-window", "gqa-fp16"],
)
def test_a_query_whose_weight_on_token_1_underflows_counts_with_weight_0(kv_heads, window, dtype):
    """The sink averages over every query i ≥ 2 its mask lets see token 1, whatever weight it puts there: a
    query whose weight underflowed to 0 counts as 0, not as a query that cannot see token 1."""
    model, ids = SharpDecoder(kv_heads, window, dtype).eval(), _ids(2, 16)
    result = measure_activations(TracedAdapter(model, call=lambda m, t: m(t).float()), ids)
    model(ids)
    sees = model.sees[1:, 0]  # queries i ≥ 2 (1-based) whose mask lets them see token 1
    reference = [p[:, :, 1:, 0][..., sees].double().mean().item() for p in model.probs]
    underflowed = [(p[:, :, 1:, 0][..., sees] == 0).double().mean().item() for p in model.probs]
    assert min(underflowed) > 0.2  # the case in question: many visible queries put exactly 0 on token 1
    np.testing.assert_allclose(result.sink.per_layer, reference, rtol=1e-6, atol=0)


class Adapter(nn.Module):
    """A residual bottleneck adapter, wider than a decoder layer."""

    def __init__(self):
        super().__init__()
        self.down, self.up = nn.Linear(D, 512), nn.Linear(512, D)

    def forward(self, x):
        return x + self.up(F.gelu(self.down(x)))


class AdaptedDecoder(Decoder):
    """The decoder with a stack of adapters after its final norm: a larger stack of modules of one class,
    through which the residual stream does not pass."""

    def __init__(self):
        super().__init__()
        self.adapters = nn.ModuleList(Adapter() for _ in range(4))

    def forward(self, ids):
        h = self.table(ids)
        for layer in self.stack:
            h = layer(h)
        h = self.last(h)
        for adapter in self.adapters:
            h = adapter(h)
        return self.readout(h)


class Scan(nn.Module):
    """A state-space mixer's stand-in: a gated causal depthwise convolution, no softmax."""

    def __init__(self):
        super().__init__()
        self.inp, self.conv, self.out = (
            nn.Linear(D, 2 * D),
            nn.Conv1d(D, D, 4, groups=D, padding=3),
            nn.Linear(D, D),
        )

    def forward(self, x):
        u, gate = self.inp(x).chunk(2, dim=-1)
        u = self.conv(u.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)
        return self.out(F.silu(u) * torch.sigmoid(gate))


class Experts(nn.Module):
    """Top-1 routing over a stack of expert FFNs, each run on its own tokens."""

    def __init__(self, n: int = 4):
        super().__init__()
        self.router, self.experts = nn.Linear(D, n, bias=False), nn.ModuleList(Ffn() for _ in range(n))

    def forward(self, x):
        flat = x.reshape(-1, D)
        choice, out = self.router(flat).argmax(-1), torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            out[choice == i] = expert(flat[choice == i])
        return out.view_as(x)


class ScanLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre_mix, self.pre_ffn = nn.RMSNorm(D, eps=1e-3), nn.RMSNorm(D, eps=1e-3)
        self.mix, self.ffn = Scan(), Experts()

    def forward(self, x):
        x = x + self.mix(self.pre_mix(x))
        return x + self.ffn(self.pre_ffn(x))


class Hybrid(Decoder):
    """Attention and state-space layers in one stack (two classes), the scan layers' FFNs mixtures of experts."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stack = nn.ModuleList([Layer(False), ScanLayer(), Layer(False), ScanLayer()])


@pytest.mark.parametrize("model", [AdaptedDecoder, Hybrid], ids=["adapters-after-final-norm", "hybrid-moe"])
def test_the_layers_are_the_blocks_the_residual_stream_passes_through(model):
    """e is the input of the first decoder layer and h_L that of the final norm, read here by hooks on the
    modules the model's forward names; neither the adapters after the norm nor an MoE layer's experts are the
    layers."""
    model, ids = model().eval(), _ids()
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_pre_hook(lambda _m, a, n=n: seen.__setitem__(n, a[0].double()))
        for n, m in (("e", model.stack[0]), ("h_L", model.last))
    ]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    e, h_L = seen["e"], seen["h_L"]
    result = measure_activations(model, ids, ids)
    assert result.residual_flow == pytest.approx(
        ((h_L - e).norm(dim=-1) / e.norm(dim=-1)).mean().item(), rel=1e-9
    )
    assert result.notes == () and "residual_flow" not in result.not_measured


class _Readout(nn.Module):
    """The final norm and the readout in one module, as a pipeline's last stage holds them."""

    def __init__(self):
        super().__init__()
        self.norm, self.out = nn.RMSNorm(D, eps=1e-3), nn.Linear(D, VOCAB, bias=False)

    def forward(self, h):
        return self.out(self.norm(h))


@pytest.mark.parametrize("norm_inside", [False, True], ids=["norm-a-stage", "norm-in-the-readout"])
def test_a_pipeline_style_sequential_is_read_at_its_blocks(norm_inside):
    """A model that is one nn.Sequential (embedding, dropout, layers, final norm, readout: the stages a pipeline
    cuts): the blocks are the layers between the dropout and the norm, so e is the first layer's input and h_L
    the final norm's, and each layer's output (not the dropout's) is a row of massive activations, all read
    here by hooks."""
    torch.manual_seed(0)
    table = nn.Embedding(VOCAB, D)
    with torch.no_grad():
        table.weight.mul_(0.05)
    layers = [Layer(False) for _ in range(3)]
    tail = [_Readout()] if norm_inside else [nn.RMSNorm(D, eps=1e-3), nn.Linear(D, VOCAB, bias=False)]
    model, ids = nn.Sequential(table, nn.Dropout(0.1), *layers, *tail).eval(), _ids()  # dropout: no block
    final = tail[0].norm if norm_inside else tail[0]
    seen: dict[str, list[torch.Tensor]] = {"e": [], "out": [], "h_L": []}
    hooks = [layers[0].register_forward_pre_hook(lambda _m, a: seen["e"].append(a[0].double()))]
    hooks += [m.register_forward_hook(lambda _m, _a, o: seen["out"].append(o)) for m in layers]
    hooks += [final.register_forward_pre_hook(lambda _m, a: seen["h_L"].append(a[0].double()))]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    (e,), (h_L,) = seen["e"], seen["h_L"]
    result = measure_activations(model, ids, ids)
    assert result.residual_flow == pytest.approx(
        ((h_L - e).norm(dim=-1) / e.norm(dim=-1)).mean().item(), rel=1e-9
    )
    assert result.massive.ratio == pytest.approx(
        [(o.abs().max() / o.abs().median()).item() for o in seen["out"]]
    )
    assert result.sink.layers == ("2.mix", "3.mix", "4.mix")
    assert result.notes == () and not result.not_measured


def test_the_logits_are_read_by_what_they_are_not_by_their_position():
    """A forward returning (hidden, logits): the logits are the tensor of shape (batch, T, vocabulary)."""

    class HiddenFirst(Decoder):
        def forward(self, ids):
            h = self.table(ids)
            for layer in self.stack:
                h = layer(h)
            return h, self.readout(self.last(h))

    model, ids = HiddenFirst().eval(), _ids() % D  # ids < D: the hidden state would give a loss too
    with torch.no_grad():
        logits = model(ids)[1]
    result = measure_activations(model, ids, ids)
    assert result.loss == pytest.approx(F.cross_entropy(logits.flatten(0, 1), ids.flatten()).item(), rel=1e-6)


@pytest.mark.parametrize("eager", [False, True], ids=["sdpa", "eager-softmax"])
def test_compiled_blocks_are_measured_as_the_same_blocks_uncompiled(eager):
    """torch.compile on each block (torchtitan's apply_compile): measured as the uncompiled model, the
    compiled regions run eagerly while measuring, said in a note."""
    ids = _ids()
    plain, compiled = Decoder(eager=eager).eval(), Decoder(eager=eager).eval()
    for i, layer in enumerate(list(compiled.stack)):
        compiled.stack[i] = torch.compile(layer)
    want, got = measure_activations(plain, ids, ids), measure_activations(compiled, ids, ids)
    # eager softmax is read as probabilities, compiled or not: no logits, said so
    assert set(got.not_measured) == set(want.not_measured) == ({"max_attention_logit"} if eager else set())
    assert got.notes == ("sink: torch.compile'd modules run eagerly while measuring",)
    assert got.sink.per_layer == want.sink.per_layer and got.residual_flow == want.residual_flow
    assert list(got.norm_factor.values()) == list(want.norm_factor.values()) and got.loss == want.loss


def test_sdpa_on_3d_tensors_is_one_line_and_the_rest_measured():
    """Heads folded into the batch, (batch·heads, T, head_dim): the sink is not measured, said in one line."""

    class Folded(Mixer):
        def forward(self, x):
            B, L, _ = x.shape
            q, k, v = self.wqkv(x).split((HEADS * HD, KV_HEADS * HD, KV_HEADS * HD), dim=-1)
            q, k, v = (t.reshape(B, L, -1, HD).transpose(1, 2) for t in (q, k, v))
            k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
            y = F.scaled_dot_product_attention(*(t.flatten(0, 1) for t in (q, k, v)), is_causal=True)
            return self.wo(y.view(B, HEADS, L, HD).transpose(1, 2).reshape(B, L, HEADS * HD))

    model = Decoder().eval()
    for layer in model.stack:
        layer.mix = Folded(False)
    result = measure_activations(model, _ids(), _ids())
    assert (
        set(result.not_measured) == {"sink", "max_attention_logit"}
        and "\n" not in result.not_measured["sink"]
    )
    assert result.not_measured["max_attention_logit"] == result.not_measured["sink"]  # one call, one reason
    assert result.not_measured["sink"].startswith("stack.0.mix: scaled_dot_product_attention on 3-d queries")
    assert result.residual_flow is not None and result.norm_factor


class _TorchBlock(nn.Module):
    """A pre-norm block whose attention is torch's nn.MultiheadAttention (in_proj_weight: [W_q | W_k | W_v])."""

    def __init__(self, need_weights: bool, float_mask: bool):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.need_weights, self.float_mask = need_weights, float_mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(L) if self.float_mask else None
        mask = torch.ones(L, L, dtype=torch.bool).triu(1) if mask is None else mask  # True / −inf: blocked
        h = self.norm(x)
        return x + self.attn(h, h, h, attn_mask=mask, need_weights=self.need_weights)[0]


@pytest.mark.parametrize(
    ("need_weights", "float_mask", "training"),
    [(False, False, False), (True, True, False), (False, True, True)],
    ids=["sdpa-bool-mask", "weights-float-mask", "train-mode"],
)
def test_torch_multihead_attention_is_measured_from_its_own_projections(need_weights, float_mask, training):
    """nn.MultiheadAttention's forward reaches a torch function mode as one call (multi_head_attention_forward),
    which hid its SDPA or softmax: the sink was 'no softmax attention' on a model made of nothing else. Its
    sink, largest logit and the parts of in_proj_weight against q and k projected here by hand."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, D), _TorchBlock(need_weights, float_mask))
    model.append(_TorchBlock(need_weights, float_mask)).append(nn.LayerNorm(D)).append(nn.Linear(D, VOCAB))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)  # attention far from uniform
    model.train(training)
    ids = _ids(2)
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda _m, a: inputs.append(a[0])) for b in model[1:3]]
    result = measure_activations(model, ids)
    for h in hooks:
        h.remove()
    assert result.not_measured == {}
    sinks, logits = [], []
    for block, x in zip(model[1:3], inputs):
        W, b = block.attn.in_proj_weight, block.attn.in_proj_bias
        q, k = (F.linear(x, W[i * D : (i + 1) * D], b[i * D : (i + 1) * D]) for i in range(2))
        q, k = (t.view(2, T, HEADS, D // HEADS).transpose(1, 2) for t in (q, k))
        s = (q @ k.transpose(-1, -2) / math.sqrt(D // HEADS)).masked_fill(
            torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf
        )
        sinks.append(s.softmax(-1)[:, :, 1:, 0].mean().item())
        logits.append(s.max().item())
    assert result.sink.layers == ("1.attn", "2.attn")
    np.testing.assert_allclose(result.sink.per_layer, sinks, rtol=1e-5)
    np.testing.assert_allclose(result.max_attention_logit, logits, rtol=1e-5)
    assert min(logits) > 5  # far from uniform attention, so a wrong key, mask or scale would show
    adapter = TracedAdapter(model)
    with torch.no_grad():
        adapter.observe(ids, kinds=("attention",))
    rows = torch.arange(3 * D).view(3, D)
    assert {p: r.tolist() for p, r in adapter.parts["1.attn.in_proj_weight"].items()} == {
        p: rows[i].tolist() for i, p in enumerate("qkv")
    }


def test_torch_multihead_attention_with_keys_that_are_no_token_is_one_line():
    """add_bias_kv appends a learned key to every sequence: token 1 is no longer the first key, so the sink and
    the largest logit are named in one line, and the norms measured."""
    torch.manual_seed(0)
    block = _TorchBlock(need_weights=False, float_mask=False)
    block.attn = nn.MultiheadAttention(D, HEADS, batch_first=True, add_bias_kv=True)
    block.forward = lambda x: (
        x + block.attn(x, x, x, need_weights=False)[0]
    )  # no mask: it would need S + 1 keys
    model = nn.Sequential(nn.Embedding(VOCAB, D), block, nn.LayerNorm(D), nn.Linear(D, VOCAB)).eval()
    result = measure_activations(model, _ids(2))
    assert result.not_measured["sink"] == (
        "1.attn: nn.MultiheadAttention with bias_k, add_zero_attn or static_k attends to keys that are no token, "
        "so which token is first cannot be read"
    )
    assert result.not_measured["max_attention_logit"] == result.not_measured["sink"]
    assert result.norm_factor and result.loss is None
