"""docs/choosing-gamma.md runs as written: its Python blocks in order in one namespace, its smallinit commands
through the CLI, and each ```text block is exactly what the block before it printed."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from smallinit.cli import main  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "choosing-gamma.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def test_the_guide_runs_and_prints_what_it_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text(encoding="utf-8"))]
    assert [k for k, _ in blocks].count("python") >= 4 and [k for k, _ in blocks].count("text") >= 4
    namespace: dict = {}
    printed = None
    for kind, body in blocks:
        if kind == "python":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(body, str(DOC), "exec"), namespace)
            printed = out.getvalue()
        elif kind == "text":
            assert printed is not None, "an output block must follow a Python block"
            assert printed == body, f"the guide shows\n{body}\nbut the code printed\n{printed}"
            printed = None
        elif kind == "bash":
            for line in body.splitlines():
                assert line.startswith("smallinit "), line
                assert main(shlex.split(line)[1:]) == 0, line
            printed = None

    # What the prose promises: the ε set on the config survives save_pretrained / from_pretrained.
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "my-model-init")
    assert reloaded.config.rms_norm_eps == 1e-12
    assert all(m.variance_epsilon == 1e-12 for m in reloaded.modules() if type(m).__name__ == "LlamaRMSNorm")
