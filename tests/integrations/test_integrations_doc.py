"""docs/integrations.md runs as written: each Python block (one per engine) in a fresh namespace, then
`smallinit report` on the folder it wrote. The pretraining engines' blocks run in tests/integrations/test_engines.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from smallinit.cli import main
from support.monitor import records

pytest.importorskip("transformers")
DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
SECTIONS = {
    "plain": "A plain PyTorch loop",
    "transformers": "transformers' Trainer",
    "lightning": "Lightning",
}
FOLDERS = {"plain": "runs/loop", "transformers": "runs/hf/smallinit", "lightning": "runs/lightning/smallinit"}


def blocks(doc: str = DOC.read_text(encoding="utf-8")) -> dict[str, list[str]]:
    """Each section's Python blocks, by its heading."""
    sections = re.split(r"^## ", doc, flags=re.M)[1:]
    return {
        head: re.findall(r"^```python\n(.*?)^```$", body, re.S | re.M)
        for head, body in (s.split("\n", 1) for s in sections)
    }


BLOCKS = [blocks()[SECTIONS[engine]][0] for engine in FOLDERS]


def test_one_example_per_engine():
    found = {head: len(code) for head, code in blocks().items() if code}
    assert found == dict.fromkeys(
        [*SECTIONS.values(), "torchtitan", "OLMo-core", "litgpt", "DeepSpeed ZeRO-3"], 1
    )


@pytest.mark.parametrize(("engine", "block"), zip(FOLDERS, BLOCKS), ids=list(FOLDERS))
def test_the_example_runs_and_is_reported(tmp_path, monkeypatch, engine, block):
    if engine == "lightning":
        pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"{DOC}:{engine}", "exec"), {})
    assert [r["step"] for r in records(tmp_path / FOLDERS[engine])] == [0, 10, 20, 30]
    assert main(["report", FOLDERS[engine].removesuffix("/smallinit")]) == 0
