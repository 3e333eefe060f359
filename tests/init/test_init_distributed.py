"""γ-init on FSDP2-sharded parameters, with real torchrun ranks (gloo, 2 CPU processes): once gathered,
the weights are bit for bit those of the unsharded model initialised from the same seed, whether the
sharded model was built on the CPU (roles given) or on meta and materialised with to_empty (no roles:
they are found on the sharded model, without values)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

hf_tiny = pytest.importorskip("support.hf_tiny")
from smallinit import gamma_init_  # noqa: E402

WORKER = str(Path(__file__).parents[1] / "_init_dist_worker.py")


@pytest.fixture(scope="module")
def gathered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        WORKER,
        str(out),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _same_as_unsharded(arch: str, sharded: dict) -> None:
    model = hf_tiny.build(arch)
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    assert {r.name: r.rule for r in report.rows} == sharded["rules"], arch
    assert "kept" not in sharded["rules"].values()
    for name, p in model.named_parameters():
        assert torch.equal(sharded["weights"][name], p.detach()), f"{arch}: {name}"


@pytest.mark.parametrize("arch", ["gpt2", "mixtral", "gemma"])
def test_fsdp2_shards_get_the_unsharded_draw(gathered, arch):
    _same_as_unsharded(arch, torch.load(gathered / f"{arch}.pt"))


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_fsdp2_on_meta_without_roles_gets_the_unsharded_draw(gathered, arch):
    # experts and routers included: their roles come from a value-free trace of the sharded model
    _same_as_unsharded(arch, torch.load(gathered / f"meta-{arch}.pt"))
