"""What `analyze`, `compare` and `init-hf` do with the Hugging Face folders users hand them: a folder saved
without a tokenizer, with an empty or foreign one, a transformers Trainer output_dir, and a comparison
given no token budget. Real tiny architectures, saved and loaded through transformers."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smallinit.analysis.measure import COMPARE_TOKENS  # noqa: E402
from smallinit.cli import main  # noqa: E402
from smallinit.data import EOS_TOKEN, load_tokenizer  # noqa: E402

LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
SMALL = ["--set", "train.eval_batches=1", "--set", "train.batch_size=2", "--set", "data.seq_len=32"]


def _init_hf(tmp_path, name: str, vocab: int, *extra: str) -> tuple[int, str]:
    (tmp_path / f"{name}.json").write_text(json.dumps({**LLAMA, "vocab_size": vocab}))
    return main(["init-hf", str(tmp_path / f"{name}.json"), "--out", str(tmp_path / name), *extra]), name


def _gpt2(path, seed: int = 0, tokenizer: bool = True):
    """A tiny GPT-2 as save_pretrained writes it, with smallinit's 257-token byte tokenizer."""
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=load_tokenizer("bytes").hf, eos_token=EOS_TOKEN
    )
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=1,
        n_head=4,
        n_positions=128,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    if tokenizer:
        tok.save_pretrained(path)
    return path


def _word_tokenizer(words: list[str]):
    """A whole-word tokenizer: <unk>, the words, end-of-text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<unk>", *words, EOS_TOKEN])}
    hf = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=hf, eos_token=EOS_TOKEN, unk_token="<unk>")


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_init_hf_saves_a_tokenizer_that_covers_the_model_or_says_it_did_not(tmp_path, capsys):
    code, name = _init_hf(tmp_path, "v512", 512)
    out = capsys.readouterr().out
    assert code == 0 and "tokenizer: smallinit's builtin 'bytes' (257 tokens" in out
    assert len(transformers.AutoTokenizer.from_pretrained(tmp_path / name)) == 257

    code, name = _init_hf(tmp_path, "v256", 256)  # no builtin one fits under 256 embeddings
    out = capsys.readouterr().out
    assert code == 0 and "no tokenizer saved" in out and "--tokenizer" in out
    assert (
        not (tmp_path / name / "tokenizer.json").exists()
        and not (tmp_path / name / "tokenizer_config.json").exists()
    )

    code, name = _init_hf(
        tmp_path, "v8192", 8192, "--tokenizer", "bytes"
    )  # given, but far from the vocabulary
    assert code == 2 and "257 tokens for the model's 8,192 embeddings" in _one_error_line(capsys)
    assert not (tmp_path / name).exists()
    code, name = _init_hf(tmp_path, "given", 8192, "--tokenizer", "default")
    assert code == 0 and "tokenizer: default (8,192 tokens) saved" in capsys.readouterr().out
    assert len(transformers.AutoTokenizer.from_pretrained(tmp_path / name)) == 8192


def test_analyze_refuses_a_missing_empty_or_foreign_tokenizer_and_takes_one_given(tmp_path, capsys):
    """Without these refusals analyze measured the `<unk>`/end-of-text stream of transformers' empty default
    tokenizer and printed a plausible loss, sink and flow (exit 0)."""
    code, name = _init_hf(tmp_path, "bare", 256)  # saved without a tokenizer
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / name), *SMALL]) == 2
    assert "holds no tokenizer" in (err := _one_error_line(capsys)) and "--tokenizer PATH_OR_FOLDER" in err

    folder = _gpt2(tmp_path / "gpt2", tokenizer=False)
    _word_tokenizer([]).save_pretrained(folder)  # 2 tokens for 257 embeddings: an empty one
    capsys.readouterr()
    assert main(["analyze", str(folder), *SMALL]) == 2
    assert "has 2 tokens for the model's 257 embeddings" in _one_error_line(capsys)

    # as many words as half the vocabulary, none of which the builtin corpus holds: every token <unk>
    _word_tokenizer([f"w{i}" for i in range(200)]).save_pretrained(folder)
    assert main(["analyze", str(folder), *SMALL]) == 2
    assert "encodes the text to 100% unknown or end-of-text tokens" in _one_error_line(capsys)

    assert main(["analyze", str(folder), *SMALL, "--tokenizer", "bytes", "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    result = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert result["tokens"] == 64 and "builtin corpus 'default'" in result["data"]
    assert "this is training text, not held out" in captured.out
    assert "analyze: measuring 64 tokens" in captured.err and "analyze: 64 tokens in" in captured.err


def test_compare_on_hf_folders_stops_at_its_default_budget_with_progress(corpus, tmp_path, capsys):
    """Without a budget, compare read the whole text silently (30 minutes on the builtin corpus)."""
    a, b = _gpt2(tmp_path / "a", seed=0), _gpt2(tmp_path / "b", seed=1)
    capsys.readouterr()
    assert (
        main(
            [
                "compare",
                str(a),
                str(b),
                "--data",
                str(corpus),
                "--set",
                "data.seq_len=64",
                "--set",
                "train.batch_size=64",
                "--out",
                str(tmp_path / "cmp"),
            ]
        )
        == 0
    )  # the corpus holds ~60,000 tokens, past the budget
    gap = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert gap["tokens"] == COMPARE_TOKENS  # the whole text (60,032 tokens) before the budget
    assert gap["meta"]["max_tokens"] == COMPARE_TOKENS
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"compare: measuring {COMPARE_TOKENS:,} tokens"
    assert err[-1].startswith(f"compare: {COMPARE_TOKENS:,} tokens in")
    assert "left" in err[1] and f"of {COMPARE_TOKENS:,} tokens" in err[1]

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert f"default {COMPARE_TOKENS:,}" in capsys.readouterr().out.replace("\n", " ")


def test_a_trainer_output_dir_is_read_at_its_top_else_at_its_latest_checkpoint(tmp_path, capsys):
    out = tmp_path / "trainer"
    for step in (5, 10):  # checkpoints saved without the tokenizer, which is kept at the top
        _gpt2(out / f"checkpoint-{step}", seed=step, tokenizer=False)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=load_tokenizer("bytes").hf, eos_token=EOS_TOKEN
    ).save_pretrained(out)
    assert main(["analyze", str(out), *SMALL, "--out", str(tmp_path / "a")]) == 0
    assert "measured its latest checkpoint, checkpoint-10" in capsys.readouterr().out
    assert json.loads((tmp_path / "a" / "analysis.json").read_text())["checkpoint"] == str(
        out / "checkpoint-10"
    )

    _gpt2(out, seed=99)  # the final save_model
    assert main(["analyze", str(out), *SMALL, "--out", str(tmp_path / "b")]) == 0
    assert "measured the model saved at its top, not its 2 checkpoint-N folders" in capsys.readouterr().out
    assert json.loads((tmp_path / "b" / "analysis.json").read_text())["checkpoint"] == str(out)

    other = tmp_path / "trainer2"  # the final model saved without the tokenizer its checkpoints hold
    _gpt2(other / "checkpoint-3", seed=3)
    _gpt2(other, seed=4, tokenizer=False)
    assert main(["analyze", str(other), *SMALL, "--out", str(tmp_path / "c")]) == 0
    assert "measured the model saved at its top" in capsys.readouterr().out
