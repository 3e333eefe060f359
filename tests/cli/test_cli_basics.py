"""The first things a newcomer types: --version, a command group alone, a tokenizer larger than its corpus
allows, and the file modes of an exported model."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from pathlib import Path

import pytest
import torch

import smallinit
from smallinit.cli import main
from smallinit.data import load_tokenizer, train_tokenizer


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"smallinit {smallinit.__version__} (torch {torch.__version__}, Python 3.")


@pytest.mark.parametrize(
    "argv,usage", [([], "usage: smallinit "), (["tokenizer"], "usage: smallinit tokenizer ")]
)
def test_a_command_group_alone_prints_its_help(argv, usage, capsys):
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(usage) and "train" in captured.out
    assert "required" not in captured.out + captured.err and captured.err == ""


def test_a_subcommand_still_runs_and_a_wrong_one_is_one_line(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be, that is the question\n" * 50)
    assert main(["tokenizer", "train", str(corpus), "--vocab-size", "270", "--out", str(tmp_path / "t")]) == 0
    assert "(vocab 270)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["tokenizer", "bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "invalid choice: 'bogus'" in err


def test_a_corpus_too_small_for_the_vocabulary_warns_with_the_size_reached(tmp_path, caplog):
    docs = ["hello world, hello there", "a few words of text"]
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        tok = train_tokenizer(docs, 8192, tmp_path / "tok.json")
    assert 258 <= tok.vocab_size < 8192
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "smallinit"]
    assert f"vocabulary of {tok.vocab_size}, not the 8192 asked" in warning
    assert load_tokenizer(tmp_path / "tok.json").vocab_size == tok.vocab_size  # kept at the size reached

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        train_tokenizer(docs, 260)  # reachable: no warning
    assert not caplog.records


def _modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_exported_files_share_the_umask_mode(tmp_path, umask_022):
    """safetensors writes 0600 by itself; every file of export-hf and init-hf folders must be 0644 here."""
    pytest.importorskip("transformers")
    from smallinit.config import Config
    from smallinit.export.hf import export_hf, init_hf
    from smallinit.train import Trainer

    cfg = Config.load(
        overrides=[
            "data.tokenizer=bytes",
            "model.d_model=16",
            "model.n_layers=1",
            "model.n_heads=2",
            "model.n_kv_heads=2",
            "model.d_ff=32",
            "model.max_seq_len=32",
            "data.seq_len=16",
            "train.steps=1",
            "train.batch_size=2",
            "train.warmup_steps=0",
            "train.eval_every=0",
            "train.eval_batches=1",
            "train.checkpoint_every=0",
            "model.gate=none",
            "model.qk_norm=false",
        ]
    )
    Trainer(cfg, tmp_path / "run", callbacks=[]).fit()
    export_hf(tmp_path / "run", tmp_path / "hf")
    modes = _modes(tmp_path / "hf")
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "vocab_size": 64,
            }
        )
    )
    init_hf(tmp_path / "config.json", tmp_path / "init")
    modes = _modes(tmp_path / "init")
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_the_licence_is_an_spdx_expression():
    """PEP 639's form (setuptools ≥ 77); the TOML table {text = ...} is deprecated and stops building in 2027."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in project["project"].get("classifiers", []))
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in project["build-system"]["requires"])


def test_the_demo_times_live_in_one_place_and_meet_their_budgets(capsys):
    """The measured demo times (the slowest of several runs) are quoted in docs/findings-cpu.md only, and meet the
    demos' budgets: the full demo ≤ 20 min, --quick ≤ 3 min. `smallinit --help`, the README's and
    docs/experiments.md's commands quote none (times drift with the code and the machine): they point there."""
    root = Path(__file__).resolve().parents[2]
    for argv in (["--help"], ["demo", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
    helps = " ".join(capsys.readouterr().out.split())
    assert not re.findall(r"\d+ min|\d+ s\b", helps) and "how long it takes: docs/findings-cpu.md" in helps
    for where in ("README.md", "docs/experiments.md"):
        commands = (root / where).read_text(encoding="utf-8").split("```")[1]
        assert not re.findall(r"\d+ min", commands) and "docs/findings-cpu.md" in commands, where
    demo = (
        (root / "docs" / "findings-cpu.md")
        .read_text(encoding="utf-8")
        .split("**How long**")[1]
        .split("\n\n")[0]
    )
    quoted = {
        m.group(1): int(m.group(2)) * 60 + int(m.group(3))
        for m in re.finditer(r"`smallinit demo( --quick)?` took (\d+) min (\d+) s", " ".join(demo.split()))
    }
    assert set(quoted) == {None, " --quick"}, quoted
    assert quoted[None] <= 20 * 60 and quoted[" --quick"] <= 3 * 60, quoted
