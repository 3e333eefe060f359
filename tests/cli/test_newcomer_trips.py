"""What a newcomer trips over first, each answered by one line that says what to do: a γ given as text, an ε
with no norm to go to, a tokenizer hint that suggests what cannot fit, a demo folder on top of a run's, the
report screenshot outside smallinit's environment; and output piped into a reader that stops early, which is no
error and says nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from smallinit import gamma_init_, set_norm_eps_
from smallinit.errors import ConfigError
from smallinit.init.eps import NormEpsError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("gamma", ["1", None, True])
def test_a_gamma_that_is_not_a_number_is_one_line(gamma):
    with pytest.raises(ConfigError, match=r"gamma must be a positive number such as 1\.0, got"):
        gamma_init_(nn.Linear(4, 4), gamma)


def test_an_eps_with_no_norm_to_go_to_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(NormEpsError, match="has no norm layer"):
        set_norm_eps_(model, 1e-12)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ConfigError, match="norm eps must be a positive number"):
        set_norm_eps_(nn.LayerNorm(4), "1e-12")


def _hf_folder(tmp_path, vocab: int) -> Path:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
    )
    folder = tmp_path / f"v{vocab}"
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def test_the_tokenizer_hint_suggests_only_what_fits(tmp_path, capsys):
    from smallinit.adapters.hf_folder import SUGGESTED_BUILTINS
    from smallinit.cli import main
    from smallinit.data import load_tokenizer

    assert {n: load_tokenizer(n).vocab_size for n in SUGGESTED_BUILTINS} == {
        n: size for n, (size, _) in SUGGESTED_BUILTINS.items()
    }

    # 100 embeddings: neither builtin fits (8,192 and 257 tokens are more), so none is suggested
    assert main(["analyze", str(_hf_folder(tmp_path, 100))]) == 2
    err = capsys.readouterr().err
    assert "holds no tokenizer" in err and "'default'" not in err and "'bytes'" not in err
    # 300 embeddings, 'default' given: refused, and the hint names the byte tokenizer, not 'default' again
    assert main(["analyze", str(_hf_folder(tmp_path, 300)), "--tokenizer", "default"]) == 2
    err = capsys.readouterr().err
    assert "8,192 tokens" in err and "'bytes'" in err and "'default' for" not in err


def test_a_demo_is_not_written_into_a_training_run(tmp_path):
    from smallinit.demo import run_demo

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="is a training run's folder"):
        run_demo(scale="micro", out=run, echo=None)
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]  # nothing written beside it


def test_the_screenshot_script_says_which_python_it_needs(tmp_path):
    """Outside smallinit's environment (no Pillow on PATH's python3) it says what to do, in one line."""
    report = tmp_path / "r.html"
    report.write_text("<html><body>x</body></html>")
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "dirname", "realpath"):
        os.symlink(shutil.which(tool), bare / tool)
    (bare / "chromium").write_text(
        "#!/bin/sh\nexit 0\n"
    )  # found, never reached: the Python check comes first
    (bare / "chromium").chmod(0o755)
    (bare / "python3").write_text("#!/bin/sh\nexit 1\n")  # a python3 without Pillow
    (bare / "python3").chmod(0o755)
    env = {"PATH": str(bare), "HOME": str(tmp_path)}
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/screenshot-report.sh"), str(report)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "set PYTHON=" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    # with PYTHON naming an interpreter that has Pillow it goes on (and would trim the screenshot)
    env["PYTHON"] = sys.executable
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/screenshot-report.sh"), str(report)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert "no Python with Pillow" not in out.stderr


def test_output_piped_into_a_reader_that_stops_early_is_no_error():
    """`smallinit info | head -1`: head leaves after one line; that is no disk, permission or path error."""
    read, write = os.pipe()
    os.close(read)  # the reader has left before the first line is written
    try:
        out = subprocess.run(
            [sys.executable, "-m", "smallinit", "info", "--preset", "cpu-1m"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write)
    assert out.stderr == "" and out.returncode == 141, out.stderr
