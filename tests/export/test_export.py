"""Hugging Face export and init-hf, checked against our own model with the real transformers package.

Every export is loaded by AutoModelForCausalLM from its folder (offline) and compared with the smallinit
model it came from: logits (fp32, max abs diff ≤ 1e-4) and greedy generation, for every gate mode, with and
without QK-norm and tying, and for MoE. Checkpoints come from a few real training steps with the Trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smallinit.cli import main  # noqa: E402
from smallinit.config import Config  # noqa: E402
from smallinit.data import EOS_TOKEN, load_tokenizer  # noqa: E402
from smallinit.export.hf import ExportError, export_hf, init_hf  # noqa: E402
from smallinit.train import Trainer, load_model  # noqa: E402
from support.runs import TINY_GQA  # noqa: E402

TINY = [
    *TINY_GQA,
    "model.gamma=0.5",
    "train.steps=3",
    "train.batch_size=4",
    "train.warmup_steps=1",
    "train.lr=3e-2",
    "train.eval_every=0",
    "train.eval_batches=1",
    "train.checkpoint_every=0",
]
PROMPTS = ["To be, or not to be, that is the", "ROMEO:\nO, she doth teach the torches"]


def train_run(run: Path, corpus: Path, overrides: list[str]) -> Path:
    cfg = Config.load(overrides=[*TINY, f"data.corpus={corpus}", *overrides])
    Trainer(cfg, run, callbacks=[]).fit()
    return run


def greedy(model, ids: list[int], n: int, eos: int) -> list[int]:
    """Greedy decoding with our model, recomputing the whole prefix each step (no cache to share bugs with)."""
    out = []
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(x).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
            x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    return out


CASES = {
    # name: (overrides, expected transformers class)
    "none-tied": (
        ["model.gate=none", "model.qk_norm=false", "model.tie_embeddings=true"],
        "LlamaForCausalLM",
    ),
    "none-qknorm-untied": (
        ["model.gate=none", "model.qk_norm=true", "model.tie_embeddings=false"],
        "Qwen3ForCausalLM",
    ),
    "elementwise-qknorm-tied": (
        ["model.gate=elementwise", "model.qk_norm=true", "model.tie_embeddings=true"],
        "Qwen3NextForCausalLM",
    ),
    "elementwise-qknorm-untied": (
        ["model.gate=elementwise", "model.qk_norm=true", "model.tie_embeddings=false"],
        "Qwen3NextForCausalLM",
    ),
    "elementwise-untied": (
        ["model.gate=elementwise", "model.qk_norm=false", "model.tie_embeddings=false"],
        "SmallinitForCausalLM",
    ),
    "headwise-tied": (
        ["model.gate=headwise", "model.qk_norm=false", "model.tie_embeddings=true"],
        "SmallinitForCausalLM",
    ),
    "headwise-qknorm-untied": (
        ["model.gate=headwise", "model.qk_norm=true", "model.tie_embeddings=false"],
        "SmallinitForCausalLM",
    ),
    "moe-elementwise-shared-sigmoid": (
        [
            "model.gate=elementwise",
            "model.moe.num_experts=4",
            "model.moe.top_k=2",
            "model.moe.d_expert=16",
            "model.moe.shared_expert=true",
            "model.moe.score=sigmoid",
            "model.moe.every_n_layers=2",
        ],
        "SmallinitForCausalLM",
    ),
    "moe-none-qknorm-top1-every2": (
        [
            "model.gate=none",
            "model.qk_norm=true",
            "model.moe.num_experts=4",
            "model.moe.top_k=1",
            "model.moe.d_expert=16",
            "model.moe.every_n_layers=2",
        ],
        "Qwen3MoeForCausalLM",
    ),
    "moe-none-top2-untied": (
        [
            "model.gate=none",
            "model.qk_norm=false",
            "model.tie_embeddings=false",
            "model.moe.num_experts=4",
            "model.moe.top_k=2",
            "model.moe.d_expert=16",
        ],
        "MixtralForCausalLM",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_matches_our_model(case, corpus, tmp_path):
    overrides, expected_class = CASES[case]
    run = train_run(tmp_path / "run", corpus, overrides)
    result = export_hf(run, tmp_path / "hf")
    remote = expected_class == "SmallinitForCausalLM"
    assert (result.architecture, result.remote_code) == (expected_class, remote)

    ours = load_model(run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=remote).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=remote)
    assert type(hf).__name__ == expected_class
    assert all(p.dtype == torch.float32 for p in hf.parameters())
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == ours.config.tie_embeddings

    text = torch.tensor([tok(PROMPTS[1])["input_ids"][:40]])
    rand = torch.randint(0, ours.config.vocab_size, (3, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for x in (text, rand):
            diff = (hf(x).logits - ours(x).logits).abs().max().item()
            assert diff <= 1e-4, f"{case}: max abs logit difference {diff:.3g}"

    eos = tok.eos_token_id
    expected = []
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        new = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8)[0, len(ids) :].tolist()
        expected.append(greedy(ours, ids, 8, eos))
        assert new == expected[-1], f"{case}: greedy generation differs"
    # a left-padded batch generates what each prompt generates alone (positions and masks under padding)
    tok.padding_side = "left"
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    out = hf.generate(**batch, do_sample=False, max_new_tokens=8)[:, batch["input_ids"].shape[1] :]
    for row, exp in zip(out.tolist(), expected):
        assert row[: len(exp)] == exp


def test_tokenizer_export_matches_ours(corpus, tmp_path):
    run = train_run(tmp_path / "run", corpus, ["data.tokenizer=default", "model.gate=none"])
    export_hf(run, tmp_path / "hf")
    ours = load_tokenizer("default")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf.eos_token == EOS_TOKEN and hf.eos_token_id == ours.eos_id and len(hf) == ours.vocab_size
    for text in [
        "To be, or not to be",
        "床前明月光，疑是地上霜。",
        "tabs\tand\nnewlines 🙂",
        f"a{EOS_TOKEN}b",
    ]:
        ids = hf(text)["input_ids"]
        assert ids == ours.encode(text)  # text never encodes to EOS, as in training
        assert hf.decode(ids) == text
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == ours.eos_id


def test_export_refuses_occupied_folder_and_cli(corpus, tmp_path, capsys):
    run = train_run(tmp_path / "run", corpus, ["model.gate=headwise"])
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not empty"):
        export_hf(run, occupied)
    assert main(["export-hf", str(run), "--out", str(occupied)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not empty" in err
    assert [p.name for p in occupied.iterdir()] == ["notes.txt"]
    assert (occupied / "notes.txt").read_text() == "keep me"

    assert main(["export-hf", str(run / "checkpoints" / "step_0000003"), "--out", str(tmp_path / "hf")]) == 0
    assert "SmallinitForCausalLM" in capsys.readouterr().out
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "configuration_smallinit.py",
        "modeling_smallinit.py",
    } <= names
    assert not any(n.startswith(".") for n in names) and not list(tmp_path.glob(".hf.tmp*"))


# -- init-hf ------------------------------------------------------------------------------------------------

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def _expected_fan_in(module: torch.nn.Module) -> int:
    if isinstance(module, torch.nn.Linear):
        return module.in_features
    assert isinstance(module, torch.nn.Embedding)
    return module.embedding_dim


@pytest.mark.parametrize("raw,gamma,as_folder", [(LLAMA, 1.0, False), (QWEN3, 0.5, True)])
def test_init_hf_sets_every_std_and_eps(raw, gamma, as_folder, tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(raw))
    arg = src if as_folder else src / "config.json"
    assert (
        main(
            [
                "init-hf",
                str(arg),
                "--out",
                str(tmp_path / "out"),
                "--set",
                f"model.gamma={gamma}",
                "--set",
                "model.norm_eps=1e-12",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"γ = {gamma:g}" in printed and "model.embed_tokens.weight" in printed

    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.config.rms_norm_eps == 1e-12
    matrices, norms = 0, 0
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            std = _expected_fan_in(mod) ** -gamma
            assert abs(w.std().item() / std - 1) < 0.1, f"{name}: std {w.std().item():.4g}, want {std:.4g}"
            assert abs(w.mean().item()) < 0.1 * std
            matrices += 1
        elif "norm" in type(mod).__name__.lower():
            assert torch.equal(w, torch.ones_like(w)), name
            assert getattr(mod, "variance_epsilon", getattr(mod, "eps", None)) == 1e-12, name
            norms += 1
    L = raw["num_hidden_layers"]
    assert matrices == 7 * L + 2  # q k v o gate up down per layer, embedding, lm_head (tied or not)
    assert norms == (4 if raw["model_type"] == "qwen3" else 2) * L + 1
    if raw["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_init_hf_offset_norms_start_neutral(tmp_path):
    """Gemma's RMSNorm scales by (1 + w): the neutral start is w = 0, which the probe finds."""
    raw = {
        "model_type": "gemma",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 256,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    result = init_hf(tmp_path / "config.json", tmp_path / "out")
    assert len(result.offset_norms) == 3  # input, post-attention and final norms
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    norm = model.model.norm
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12), atol=1e-6)
    assert model.config.rms_norm_eps == 1e-12


def test_init_hf_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "unknown.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    for arg in ("missing.json", "bad.json", "unknown.json"):
        assert main(["init-hf", str(tmp_path / arg), "--out", str(tmp_path / "out")]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_init_hf_takes_per_role_scales(tmp_path, capsys):
    """--set model.init_scales overrides the γ rule by role as gamma_init_ does: the embedding at σ 1, the output
    projections (o_proj, down_proj) zero, every other matrix d_in^(−γ); a role the model lacks and a value that is
    no list are one line each, exit 2, with nothing written."""
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "tie_word_embeddings": False}))
    out = tmp_path / "out"
    scales = '["embedding=std:1", "output=zero"]'
    args = [
        "init-hf",
        str(tmp_path / "config.json"),
        "--out",
        str(out),
        "--set",
        f"model.init_scales={scales}",
    ]
    assert main(args) == 0
    assert "output=zero" in capsys.readouterr().out
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Embedding):
            assert abs(mod.weight.std().item() - 1) < 0.1, name
        elif isinstance(mod, torch.nn.Linear) and name.endswith(("o_proj", "down_proj")):
            assert not mod.weight.any(), name
        elif isinstance(mod, torch.nn.Linear):
            assert abs(mod.weight.std().item() * mod.in_features - 1) < 0.1, name
    capsys.readouterr()  # transformers' loading bar
    for bad in ('["tail=zero"]', "output=zero"):
        dest = tmp_path / f"bad-{len(bad)}"
        assert main([*args[:2], "--out", str(dest), "--set", f"model.init_scales={bad}"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1 and not dest.exists()
