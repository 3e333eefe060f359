"""The Monitor under torchrun: real processes (gloo, 2 ranks, CPU), DDP, FSDP2, and torchtitan's path (built on
meta, fully_shard, to_empty, γ-init). Every rank takes part in the forward and the gathering of sharded
matrices; rank 0 alone writes; the records equal one process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smallinit.cli import main

pytest.importorskip("transformers")
WORKER = Path(__file__).parents[1] / "_monitor_dist_worker.py"


def run(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}
    r = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def records(folder: Path) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == "analysis"]


def flat(rec: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)):
            out[prefix + k] = v
    return out


STEPS = 100


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("single")
    run(str(WORKER), "single", str(out), str(STEPS))
    return records(out)


@pytest.mark.parametrize("layout", ["ddp", "fsdp", "titan"])
def test_two_ranks_record_what_one_process_records(tmp_path, single, layout):
    out = tmp_path / layout
    run(
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        str(WORKER),
        layout,
        str(out),
        str(STEPS),
    )
    two = records(out)
    assert (
        [r["step"] for r in two] == [r["step"] for r in single] == [0, 25, 50, 75, 100]
    )  # one writer: each step once
    for a, b in zip(single, two):
        fa, fb = flat(a), flat(b)
        assert fa.keys() == fb.keys() and fa["loss"] > 0
        assert fb == pytest.approx(fa, rel=1e-5, abs=1e-6)
    assert two[-1]["loss"] < two[0]["loss"] - 1  # it trained
    assert json.loads((out / "monitor.json").read_text())["world_size"] == 2
    assert main(["report", str(out)]) == 0


def test_smallinits_trainer_measures_under_fsdp_as_in_one_process(tmp_path):
    from support.runs import TINY_MODEL

    sets = [
        a
        for s in [
            *TINY_MODEL,
            "data.corpus=shakespeare",
            "train.batch_size=8",
            "train.steps=6",
            "train.warmup_steps=2",
            "train.eval_every=3",
            "analysis.every=3",
            "analysis.snapshots=2",
        ]
        for a in ("--set", s)
    ]
    assert main(["train", "--out", str(tmp_path / "single"), *sets]) == 0
    run(
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        "-m",
        "smallinit",
        "train",
        "--out",
        str(tmp_path / "fsdp"),
        *sets,
        "--set",
        "train.parallel=fsdp",
    )
    one, two = records(tmp_path / "single"), records(tmp_path / "fsdp")
    assert (
        [r["step"] for r in two] == [r["step"] for r in one] == [0, 3, 6]
    )  # it measured (it was off under FSDP), each step once
    for a, b in zip(one, two):
        assert flat(b) == pytest.approx(flat(a), rel=1e-4, abs=1e-6)
