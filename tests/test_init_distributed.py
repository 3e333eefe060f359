"""γ-init on FSDP2-sharded parameters, with real torchrun ranks (gloo, 2 CPU processes): once gathered,
the weights are bit for bit those of the unsharded model initialised from the same seed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

hf_tiny = pytest.importorskip("hf_tiny")
from smallinit import gamma_init_  # noqa: E402

WORKER = str(Path(__file__).with_name("_init_dist_worker.py"))


def test_fsdp2_shards_get_the_unsharded_draw(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", WORKER, str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import _init_dist_worker as worker

    for arch in worker.ARCHS:
        sharded = torch.load(tmp_path / f"{arch}.pt")
        model = hf_tiny.build(arch)
        report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
        assert {r.name: r.rule for r in report.rows} == sharded["rules"], arch
        assert "normal" in sharded["rules"].values()
        for name, p in model.named_parameters():
            assert torch.equal(sharded["weights"][name], p.detach()), f"{arch}: {name}"
