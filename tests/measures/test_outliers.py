"""The largest attention logit and massive activations, each against a computation written here: on smallinit's
model (its own captured q, k), a Hugging Face Llama (logits from the q, k that transformers' attention interface
receives; the residual stream from hooks on its decoder layers), and a decoder of no library with a planted
sharp head and a planted massive dimension."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smallinit import ModelConfig, Transformer
from smallinit.measures.activations import measure_activations
from smallinit.measures.massive import MASSIVE_RATIO, massive_activations

transformers = pytest.importorskip("transformers")
hf_tiny = pytest.importorskip("support.hf_tiny")

VOCAB, D, HEADS, HD, T = 61, 32, 4, 8, 16


def _causal_max(q: torch.Tensor, k: torch.Tensor, scale: float) -> float:
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    L = s.shape[-1]
    return s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -math.inf).max().item()


def _massive_by_hand(outputs: list[torch.Tensor]) -> tuple[list[float], list[set[int]]]:
    ratios, dims = [], []
    for h in outputs:
        a = h.double().abs().reshape(-1, h.shape[-1])
        median = a.flatten().median()
        ratios.append((a.max() / median).item())
        dims.append({j for j in range(a.shape[1]) if a[:, j].max() >= MASSIVE_RATIO * median})
    return ratios, dims


def _ids(vocab: int, batch: int = 2, seq: int = T) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(3))


def test_smallinit_model_against_its_own_queries_and_keys():
    model = Transformer(
        ModelConfig(vocab_size=VOCAB, d_model=D, n_layers=2, n_heads=HEADS, d_ff=64, max_seq_len=T), seed=0
    ).eval()
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight.mul_(20.0)  # one sharp layer, so the layers differ
    ids = _ids(VOCAB)
    outputs = []
    hooks = [b.register_forward_hook(lambda _m, _a, out: outputs.append(out[0])) for b in model.blocks]
    with torch.no_grad():
        qk = model(ids, capture=("qk",)).qk
    for h in hooks:
        h.remove()
    got = measure_activations(model, ids)
    want = [_causal_max(q, k, q.shape[-1] ** -0.5) for q, k in qk]
    assert got.max_attention_logit == pytest.approx(want, rel=1e-5)
    assert want[1] > 5 * want[0]  # the planted layer: a comparison that would see a mix-up of layers
    ratios, dims = _massive_by_hand(outputs)
    assert got.massive.ratio == pytest.approx(ratios, rel=1e-5)
    assert [set(d) for d in got.massive.dims] == dims


def test_hugging_face_llama_against_what_its_attention_interface_receives():
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = hf_tiny.build("llama").eval()
    ids = hf_tiny.tokens(model, T)
    got = measure_activations(model, ids)
    seen: list[float] = []

    def recording(module, query, key, value, attention_mask, scaling=None, **kw):
        seen.append(_causal_max(query, key, scaling if scaling is not None else query.shape[-1] ** -0.5))
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kw)

    AttentionInterface.register("smallinit_test_recording", recording)
    outputs = []
    hooks = [
        layer.register_forward_hook(
            lambda _m, _a, out: outputs.append(out[0] if isinstance(out, tuple) else out)
        )
        for layer in model.model.layers
    ]
    backend = model.config._attn_implementation
    model.set_attn_implementation("smallinit_test_recording")
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        model.set_attn_implementation(backend)
        for h in hooks:
            h.remove()
    assert len(seen) == model.config.num_hidden_layers
    assert got.max_attention_logit == pytest.approx(seen, rel=1e-5)
    ratios, dims = _massive_by_hand(outputs)
    assert got.massive.ratio == pytest.approx(ratios, rel=1e-5)
    assert [set(d) for d in got.massive.dims] == dims


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(D, HEADS * HD, bias=False) for _ in range(3))
        self.o = nn.Linear(HEADS * HD, D, bias=False)
        self.up, self.down = nn.Linear(D, 64), nn.Linear(64, D)
        self.plant = torch.zeros(D)  # added to token 0's stream: a massive activation where it is nonzero

    def heads(self, x: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
        return proj(x).view(*x.shape[:2], HEADS, HD).transpose(1, 2)

    def forward(self, x):
        q, k, v = self.heads(x, self.q), self.heads(x, self.k), self.heads(x, self.v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + self.o(y)
        x = x + self.down(F.relu(self.up(x)).square())
        return torch.cat([x[:, :1] + self.plant, x[:, 1:]], dim=1)


class NoLibrary(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(F.rms_norm(h, (D,), eps=1e-6))


def test_a_decoder_of_no_library_with_a_planted_head_and_dimension():
    model = NoLibrary().eval()
    with torch.no_grad():
        model.blocks[1].q.weight.mul_(30.0)
    model.blocks[2].plant[5] = 1e4  # the last layer's output: dimension 5 of token 0 is massive
    ids = _ids(VOCAB)
    x, outputs, want = model.embed(ids), [], []
    with torch.no_grad():
        for b in model.blocks:
            want.append(_causal_max(b.heads(x, b.q), b.heads(x, b.k), HD**-0.5))
            x = b(x)
            outputs.append(x)
    got = measure_activations(model, ids)
    assert got.max_attention_logit == pytest.approx(want, rel=1e-5)
    ratios, dims = _massive_by_hand(outputs)
    assert got.massive.ratio == pytest.approx(ratios, rel=1e-5)
    assert [set(d) for d in got.massive.dims] == dims and dims[:2] == [set(), set()] and dims[2] == {5}
    assert massive_activations([outputs[0], *outputs]).ratio == got.massive.ratio  # e is not a layer's output


def test_attention_read_as_probabilities_names_the_logits_and_keeps_the_sink():
    model = hf_tiny.build("bloom").eval()  # eager attention outside transformers' interface
    got = measure_activations(model, hf_tiny.tokens(model, T))
    assert got.sink is not None and got.max_attention_logit == ()
    why = got.not_measured["max_attention_logit"]
    assert "probabilities only" in why and "\n" not in why
