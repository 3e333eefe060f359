"""One formatter and one import style over the tree, as CI checks them: ruff's formatter, and its linter with
absolute imports only (pyproject.toml, [tool.ruff])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREE = ["src", "tests", "scripts", "benchmarks"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *TREE], cwd=ROOT, capture_output=True, text=True
    )


@pytest.mark.parametrize("args", [("check",), ("format", "--check")], ids=["lint", "format"])
def test_the_tree_is_formatted_and_linted_by_ruff(args):
    result = _ruff(*args)
    assert result.returncode == 0, (
        f"ruff {' '.join(args)} (fix with: ruff {args[0]} {' '.join(TREE)}):\n{result.stdout}"
    )


def test_a_relative_import_is_refused(tmp_path):  # the rule is on: a relative import fails the lint
    bad = tmp_path / "bad.py"
    bad.write_text("from .sibling import x\n\nprint(x)\n")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), str(bad)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "TID252" in result.stdout
