"""The CLI's training run as a process: its command line on the tiny model and a wait for a logged step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from support.runs import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=8",
    "train.warmup_steps=5",
    "train.eval_batches=2",
    "train.log_every=5",
]


def train_cmd(run: Path, *extra: str) -> list[str]:
    sets = [a for s in (*TINY, *extra) for a in ("--set", s)]
    return [sys.executable, "-m", "smallinit", "train", "--out", str(run), *sets]


def wait_for_step(run: Path, step: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run / "metrics.jsonl").exists():
            steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x]
            if steps and max(steps) >= step:
                return
        time.sleep(0.05)
    raise AssertionError(f"{run} did not reach step {step}")


def resume(run: Path, env: dict[str, str]) -> None:
    """``smallinit train --out RUN --resume`` in a process of its own, which must finish."""
    resumed = subprocess.run(
        [sys.executable, "-m", "smallinit", "train", "--out", str(run), "--resume"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
