"""Built on the meta device, then ``to_empty`` and γ-init: the weights a CPU build gets, and no parameter left
holding whatever memory held."""

import pytest
import torch
from torch import nn

from smallinit import SmallinitError, gamma_init_

hf_tiny = pytest.importorskip("support.hf_tiny")


def test_mamba_built_on_meta_gets_the_cpu_draw_and_the_architectures_own_init():
    cpu = hf_tiny.build("mamba")
    own_before = {n: p.clone() for n, p in cpu.named_parameters()}
    want = gamma_init_(cpu, 1.0, generator=torch.Generator().manual_seed(1))
    kept = {r.name for r in want.rows if r.rule == "kept"}
    assert {n.rsplit(".", 1)[-1] for n in kept} == {"A_log", "D", "bias"}  # dt_proj.bias
    assert all(
        torch.equal(p, own_before[n]) for n, p in cpu.named_parameters() if n in kept
    )  # a CPU build keeps them

    meta = hf_tiny.build("mamba", "meta").to_empty(device="cpu")
    torch.manual_seed(
        5
    )  # the global RNG plays no part: the architecture's own draws follow the generator's seed
    got = gamma_init_(meta, 1.0, generator=torch.Generator().manual_seed(1))
    # transformers' own path for a model built on meta, seeded as the generator: what the architecture gives
    ref = hf_tiny.build("mamba", "meta").to_empty(device="cpu")
    torch.manual_seed(1)
    ref.initialize_weights()

    c, m, r = dict(cpu.named_parameters()), dict(meta.named_parameters()), dict(ref.named_parameters())
    assert c.keys() == m.keys()
    for name in c:
        if (
            name in kept
        ):  # the architecture's own init (dt_proj.bias is its random draw, from the generator's seed)
            assert torch.equal(m[name], r[name]), name
        else:  # the γ draw, bit for bit
            assert torch.equal(m[name], c[name]), name
    for name in c:
        if name.endswith(
            ("A_log", ".D")
        ):  # deterministic in the architecture: log(1..N) and 1, as on the CPU
            assert torch.equal(m[name], c[name]), name
    rows = got.by_name()
    assert all("built on meta" in rows[n].reason for n in kept)
    assert sum("not initialised by its architecture" in note for note in got.notes) == 1
    assert [(x.name, x.rule, x.fan_in, x.std) for x in got.rows] == [
        (x.name, x.rule, x.fan_in, x.std) for x in want.rows
    ]


@pytest.mark.parametrize("tie", [True, False])
def test_llama_built_on_meta_computes_what_a_cpu_build_computes(tie):
    """Nothing kept, but the rotary tables are buffers to_empty leaves as memory: the architecture's init
    recomputes them, so the model computes what the CPU build does."""
    transformers = hf_tiny.transformers
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        tie_word_embeddings=tie,
    )
    cpu = transformers.LlamaForCausalLM(cfg)
    gamma_init_(cpu, 1.0, generator=torch.Generator().manual_seed(2))
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    model.to_empty(device="cpu")
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(2))
    assert any("the buffers got LlamaForCausalLM's own init" in n for n in report.notes)
    for (name, a), b in zip(cpu.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    for (name, a), b in zip(cpu.named_buffers(), model.buffers()):
        assert torch.equal(a, b), name
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, cpu(ids).logits)


class _ScaledLlama(hf_tiny.transformers.LlamaForCausalLM):
    """A user's model: a real Llama with one parameter of its own that its _init_weights does not know."""

    def __init__(self, config):
        super().__init__(config)
        self.logit_scale = nn.Parameter(torch.ones(config.vocab_size))

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * self.logit_scale
        return out


def test_own_parameter_the_architecture_cannot_init_is_refused_in_one_line():
    transformers = hf_tiny.transformers
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    cpu = _ScaledLlama(cfg)  # on the CPU its value is its constructor's: kept
    assert gamma_init_(cpu, 1.0).by_name()["logit_scale"].rule == "kept"
    assert torch.equal(cpu.logit_scale, torch.ones(128))
    with torch.device("meta"):
        model = _ScaledLlama(cfg)
    model.to_empty(device="cpu")
    with pytest.raises(SmallinitError) as e:
        gamma_init_(model, 1.0)
    msg = str(e.value)
    assert "logit_scale" in msg and "_init_weights does not set" in msg and "\n" not in msg
