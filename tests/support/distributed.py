"""Real torchrun ranks on the CPU, and run folders compared and cut as a kill would leave them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from smallinit.train import checkpoint as ckpt


def torchrun(*args, timeout: float = 240, ranks: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(ranks),
        "--standalone",
        *map(str, args),
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def cut_at(src: Path, dst: Path, step: int) -> Path:
    """A copy of run ``src`` as if it had been killed right after the checkpoint of ``step``."""
    shutil.copytree(src, dst)
    (dst / "summary.json").unlink(missing_ok=True)
    for path in ckpt.list_checkpoints(dst):
        if int(path.name[5:]) > step:
            shutil.rmtree(path)
    return dst


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bit for bit: the same names, dtypes, shapes and bytes."""
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
