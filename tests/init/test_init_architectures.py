"""γ-init on every causal-LM architecture the installed transformers builds from a tiny config offline.

Every parameter is checked against what its own module measures (tests/hf_tiny.py): a drawn matrix's
gain through its module, a norm's output scale, a bias's zero, a kept parameter unchanged. The fast
suite runs a representative set of families; the rest run under ``-m slow``.
"""

import pytest
import torch

hf_tiny = pytest.importorskip("support.hf_tiny")
from smallinit import gamma_init_  # noqa: E402

FAST = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "olmo",
    "olmo2",
    "olmoe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "cohere",
    "cohere2",
    "gpt2",
    "gpt_bigcode",
    "gpt_neo",
    "gpt_neox",
    "bloom",
    "opt",
    "phi",
    "stablelm",
    "starcoder2",
    "gpt_oss",
    "mamba",
    "falcon_mamba",
    "jamba",
    "llama4_text",
    "aria_text",
    "granitemoe",
    "qwen2_moe",
    "bert",
    "xglm",
    "mpt",
    "persimmon",
    "qwen3_next",
    "nemotron_h",
    "diffllama",
]
SLOW = [
    "afmoe",
    "apertus",
    "arcee",
    "bart",
    "big_bird",
    "biogpt",
    "bitnet",
    "camembert",
    "cohere2_moe",
    "ctrl",
    "cwm",
    "data2vec-text",
    "doge",
    "electra",
    "ernie",
    "ernie4_5",
    "exaone4",
    "exaone_moe",
    "falcon_h1",
    "flex_olmo",
    "flint",
    "fuyu",
    "glm",
    "glm4",
    "glm4_moe",
    "gpt_neox_japanese",
    "granite",
    "granite_swa",
    "granitemoeshared",
    "helium",
    "hy_v3",
    "jais2",
    "jetmoe",
    "kolibri1",
    "laguna",
    "lara_mini",
    "lfm2",
    "mbart",
    "megatron-bert",
    "mellum",
    "mimo_v2_flash",
    "minimax",
    "minimax_m2",
    "moshi",
    "nanochat",
    "olmo3",
    "olmo_hybrid",
    "openai-gpt",
    "pegasus",
    "phimoe",
    "qwen3_5",
    "roberta",
    "seed_oss",
    "solar_open",
    "vaultgemma",
    "xlm",
    "zaya",
]


def check(arch: str) -> "hf_tiny.Verdict":
    model = hf_tiny.build(arch)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    return hf_tiny.judge(arch, model, before, report)


def _assert_right(verdict) -> None:
    assert not verdict.wrong, "\n".join(verdict.wrong)
    assert not verdict.unmeasured, "no expectation for: " + ", ".join(verdict.unmeasured)


def test_fast_set_covers_thirty_families():
    assert len(set(FAST)) >= 30 and not set(FAST) & set(SLOW)


@pytest.mark.parametrize("arch", FAST)
def test_every_parameter_right(arch):
    _assert_right(check(arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", SLOW)
def test_every_parameter_right_more_architectures(arch):
    _assert_right(check(arch))
