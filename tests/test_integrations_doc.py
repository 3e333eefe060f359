"""docs/integrations.md runs as written: each Python block (one per engine) in a fresh namespace, then
`smallinit report` on the folder it wrote."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from smallinit.cli import main
from test_monitor import records

pytest.importorskip("transformers")
DOC = Path(__file__).resolve().parents[1] / "docs" / "integrations.md"
# the DeepSpeed ZeRO-3 example is a torchrun script: tests/test_zero3.py runs it
ONE_PROCESS = DOC.read_text(encoding="utf-8").split("\n## DeepSpeed ZeRO-3\n")[0]
BLOCKS = re.findall(r"^```python\n(.*?)^```$", ONE_PROCESS, re.S | re.M)
FOLDERS = {"plain": "runs/loop", "transformers": "runs/hf/smallinit", "lightning": "runs/lightning/smallinit"}


def test_one_example_per_engine():
    assert len(BLOCKS) == len(FOLDERS)


@pytest.mark.parametrize(("engine", "block"), zip(FOLDERS, BLOCKS), ids=list(FOLDERS))
def test_the_example_runs_and_is_reported(tmp_path, monkeypatch, engine, block):
    if engine == "lightning":
        pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"{DOC}:{engine}", "exec"), {})
    assert [r["step"] for r in records(tmp_path / FOLDERS[engine])] == [0, 10, 20, 30]
    assert main(["report", FOLDERS[engine].removesuffix("/smallinit")]) == 0
