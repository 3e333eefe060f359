"""Text generation: KV-cached decoding against full recomputation, greedy tokens against the exported Hugging
Face model, the sampling rules, seeded reproducibility, load_pretrained and the ``generate`` command.

Trained checkpoints come from a few real training steps of a tiny config with the Trainer.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

from smallinit import Transformer, load_pretrained
from smallinit.cli import main
from smallinit.config import Config, ModelConfig, MoEConfig
from smallinit.data import load_tokenizer
from smallinit.data.tokenizer import bytes_tokenizer
from smallinit.errors import CheckpointError, ConfigError
from smallinit.generate import Sampling, generate, generate_ids, next_token
from smallinit.train import Trainer
from support.runs import TINY_GQA

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
PROMPT = "ROMEO:\nO, she doth teach the torches"


def train_run(run: Path, corpus: Path, overrides: list[str]) -> Path:
    Trainer(Config.load(overrides=[*TINY, f"data.corpus={corpus}", *overrides]), run, callbacks=[]).fit()
    return run


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory) -> Path:
    return train_run(tmp_path_factory.mktemp("gen") / "run", corpus, ["model.gate=elementwise"])


# -- the cache ----------------------------------------------------------------------------------------------

MODELS = {
    "elementwise-gqa": dict(gate="elementwise", n_kv_heads=2),
    "headwise-qknorm": dict(gate="headwise", qk_norm=True),
    "none-untied": dict(gate="none", tie_embeddings=False),
    "moe-top2": dict(gate="none", moe=MoEConfig(num_experts=4, top_k=2, d_expert=16, every_n_layers=2)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_cached_decoding_matches_full_recomputation(name):
    cfg = ModelConfig(
        d_model=32, n_layers=3, n_heads=4, d_ff=64, vocab_size=97, max_seq_len=32, gamma=0.5, **MODELS[name]
    )
    model = Transformer(cfg, seed=1).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens).logits
        cache = model.new_cache(batch_size=2)
        # a prefill of 6, single tokens, a chunk of 4 after cached positions, single tokens again
        pieces, start = [], 0
        for n in (6, 1, 1, 4, 1, 1, 1, 5):
            pieces.append(model(tokens[:, start : start + n], cache=cache).logits)
            start += n
    assert start == tokens.shape[1] and cache.length == start
    diff = (torch.cat(pieces, dim=1) - full).abs().max().item()
    assert diff <= 1e-5, f"{name}: cached logits differ from full recomputation by {diff:.3g}"


def test_cache_refuses_capture_and_overflow():
    model = Transformer(ModelConfig(d_model=32, n_layers=1, n_heads=4, d_ff=64, vocab_size=50, max_seq_len=8))
    cache = model.new_cache()
    with pytest.raises(ValueError, match="capture"):
        model(torch.zeros(1, 2, dtype=torch.long), capture=("qk",), cache=cache)
    model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceeds max_seq_len 8"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)


def test_generation_feeds_one_position_per_step(run):
    """Not quadratic: after the prompt, each forward takes only the newest token."""
    model, tok = load_pretrained(run)
    lengths = []
    model.embed.register_forward_hook(lambda m, args, out: lengths.append(args[0].shape[1]))
    ids = generate_ids(model, tok.encode("To be"), 10, Sampling(temperature=0))
    assert lengths == [len(tok.encode("To be"))] + [1] * (len(ids) - 1)


# -- the exported Hugging Face model ------------------------------------------------------------------------

HF_CASES = {
    "llama-gqa": ["model.gate=none", "model.qk_norm=false"],
    "qwen3-moe": [
        "model.gate=none",
        "model.qk_norm=true",
        "model.moe.num_experts=4",
        "model.moe.top_k=1",
        "model.moe.d_expert=16",
        "model.moe.every_n_layers=2",
    ],
    "remote-headwise": ["model.gate=headwise"],
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_greedy_tokens_match_exported_hf_model(case, corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    from smallinit.export.hf import export_hf

    run = train_run(tmp_path / "run", corpus, HF_CASES[case])
    remote = export_hf(run, tmp_path / "hf").remote_code
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=remote).eval()
    model, tok = load_pretrained(run)
    for prompt in (PROMPT, "To be, or not"):
        ids = tok.encode(prompt)
        n = 64 - len(ids)  # up to the context's end
        theirs = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[0, len(ids) :].tolist()
        ours = generate_ids(model, ids, n, Sampling(temperature=0), eos_id=tok.eos_id)
        assert ours == theirs, f"{case}: greedy tokens differ for {prompt!r}"


# -- sampling -----------------------------------------------------------------------------------------------


def _draws(logits: torch.Tensor, sampling: Sampling, n: int = 400) -> set[int]:
    g = torch.Generator().manual_seed(0)
    return {next_token(logits, sampling, g) for _ in range(n)}


def test_top_k_and_top_p_keep_only_the_most_likely_tokens():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert _draws(logits, Sampling()) == {0, 1, 2, 3}
    assert _draws(logits, Sampling(top_k=2)) == {0, 1}
    assert _draws(logits, Sampling(top_p=0.7)) == {0, 1}  # 0.5 < 0.7 ≤ 0.5 + 0.3
    assert _draws(logits, Sampling(top_p=0.5)) == {0}
    assert _draws(logits, Sampling(top_p=0.9, top_k=3)) == {0, 1, 2}
    assert _draws(logits, Sampling(temperature=0)) == {0}
    # a low temperature sharpens: token 0 far more often than its 0.5
    g = torch.Generator().manual_seed(0)
    cold = [next_token(logits, Sampling(temperature=0.2), g) for _ in range(400)]
    assert cold.count(0) / len(cold) > 0.9


def test_seeded_sampling_is_reproducible(run):
    model, tok = load_pretrained(run)
    ids = tok.encode(PROMPT)
    a = generate_ids(model, ids, 20, Sampling(temperature=1.0, seed=7))
    b = generate_ids(model, ids, 20, Sampling(temperature=1.0, seed=7))
    c = generate_ids(model, ids, 20, Sampling(temperature=1.0, seed=8))
    assert a == b and a != c


def test_bad_sampling_and_lengths_are_refused(run):
    model, tok = load_pretrained(run)
    for bad in (
        Sampling(temperature=-1),
        Sampling(temperature=float("nan")),
        Sampling(top_k=0),
        Sampling(top_p=0),
        Sampling(top_p=1.01),
    ):
        with pytest.raises(ConfigError):
            generate_ids(model, [1, 2], 3, bad)
    with pytest.raises(ConfigError, match="≥ 0"):
        generate_ids(model, [1, 2], -1)
    with pytest.raises(ConfigError, match="at most 62 new tokens"):
        generate_ids(model, [1, 2], 63)
    with pytest.raises(ConfigError, match="more than the model's context of 64; shorten it"):
        generate_ids(model, [1] * 65, 0)
    with pytest.raises(ConfigError, match="no tokens"):
        generate_ids(model, [], 3)


# -- load_pretrained ----------------------------------------------------------------------------------------


def test_load_pretrained_returns_the_run_tokenizer(run):
    model, tok = load_pretrained(run / "checkpoints" / "step_0000003")
    assert not model.training and model.config.vocab_size == tok.vocab_size
    assert tok.fingerprint == load_tokenizer("bytes").fingerprint
    # an empty prompt starts a new document: the continuation of the end-of-text token
    expected = generate_ids(model, [tok.eos_id], 5, Sampling(temperature=0), eos_id=tok.eos_id)
    assert generate(model, tok, "", 5, Sampling(temperature=0)) == tok.decode(
        [i for i in expected if i != tok.eos_id]
    )


def test_load_pretrained_refuses_a_changed_tokenizer(corpus, tmp_path):
    path = bytes_tokenizer().save(tmp_path / "tok.json")
    run = train_run(tmp_path / "run", corpus, [f"data.tokenizer={path}"])
    load_tokenizer("default").save(path)  # another vocabulary under the same name
    with pytest.raises(CheckpointError, match="257"):
        load_pretrained(run)
    path.unlink()
    assert main(["generate", str(run), "--prompt", "x"]) == 2


# -- the command --------------------------------------------------------------------------------------------


def test_cli_generate_prints_the_prompt_and_its_continuation(run, capsys, monkeypatch):
    model, tok = load_pretrained(run)
    expected = generate(model, tok, PROMPT, 12, Sampling(temperature=0))
    assert (
        main(["generate", str(run), "--prompt", PROMPT, "--max-new-tokens", "12", "--temperature", "0"]) == 0
    )
    assert capsys.readouterr().out == PROMPT + expected + "\n"
    assert (
        main(
            [
                "generate",
                str(run),
                "--prompt",
                PROMPT,
                "--max-new-tokens",
                "12",
                "--temperature",
                "0",
                "--no-prompt",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == expected + "\n"

    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))  # not a TTY: the prompt comes from stdin
    assert main(["generate", str(run), "--max-new-tokens", "12", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == PROMPT + expected + "\n"

    args = [
        "generate",
        str(run),
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "12",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
    ]
    outs = []
    for seed in ("3", "3", "4"):
        assert main([*args, "--seed", seed]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] != outs[2]


@pytest.mark.parametrize(
    "bad,message",
    [
        (["--max-new-tokens", "-1"], "max-new-tokens must be ≥ 0"),
        (["--top-p", "0"], "top-p must be in (0, 1]"),
        (["--top-p", "1.5"], "top-p must be in (0, 1]"),
        (["--temperature", "-0.5"], "temperature must be ≥ 0"),
        (["--top-k", "0"], "top-k must be ≥ 1"),
        (["--max-new-tokens", "1000"], "exceed the model's context of 64 tokens"),
        (["--top-p", "high"], "invalid float value"),
    ],
)
def test_cli_generate_refuses_bad_values(bad, message, run, capsys):
    try:
        code = main(["generate", str(run), "--prompt", "hi", *bad])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err


def test_cli_generate_refuses_missing_run_and_prompt(tmp_path, run, capsys, monkeypatch):
    assert main(["generate", str(tmp_path / "nope"), "--prompt", "hi"]) == 2
    assert "does not exist" in capsys.readouterr().err

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    assert main(["generate", str(run)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "pass --prompt TEXT or pipe the prompt on stdin" in err
