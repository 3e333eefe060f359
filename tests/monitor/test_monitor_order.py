"""The Monitor leaves FSDP2 training bit-identical wherever it is built: before ``fully_shard``, between it and
the optimizer, after the optimizer (real torchrun ranks, gloo, 2 CPU processes; smallinit's own model and a
decoder of no library). Its forward has no backward, after which FSDP2 would reshard: built before the
optimizer, it must not leave the root's unsharded parameters registered for the optimizer to update as copies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from support.monitor import records

WORKER = Path(__file__).parents[1] / "_monitor_order_worker.py"


def test_the_monitor_built_before_or_after_fully_shard_or_the_optimizer_leaves_training_bit_identical(
    tmp_path,
):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(WORKER.parent), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    args = [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        str(WORKER),
        str(tmp_path),
    ]
    r = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = torch.load(tmp_path / "order.pt")
    for kind in ("smallinit", "decoder"):
        plain = runs[kind, "none"]
        assert plain["losses"][-1] < plain["losses"][0], kind  # it trained
        for order in ("before-shard", "before-optimizer", "after-optimizer"):
            got = runs[kind, order]
            assert got["losses"] == plain["losses"], (kind, order)
            assert got["weights"].keys() == plain["weights"].keys()
            for name, W in plain["weights"].items():
                assert torch.equal(got["weights"][name], W), (kind, order, name)
            # and it measured, at each step due
            assert [rec["step"] for rec in records(tmp_path / kind / order)] == [0, 2, 4], (kind, order)
