"""Run by tests/init/test_init_distributed.py under torchrun (gloo): γ-init of FSDP2-sharded models.

    python -m torch.distributed.run --nproc_per_node 2 tests/_init_dist_worker.py OUT_DIR

Each model is sharded with fully_shard (each block, then the root), γ-initialised from seed 0 and
gathered; rank 0 writes the gathered weights to OUT_DIR/<name>.pt. The models of ARCHS are built on the
CPU and given roles found before sharding; those of META_ARCHS are built on meta, sharded, materialised
with to_empty and initialised without roles, the way a model too large for one process is.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from smallinit import gamma_init_, param_roles
from support import hf_tiny

ARCHS = ("gpt2", "mixtral", "gemma")
META_ARCHS = ("qwen3_moe", "mixtral")


def _shard(model, mesh) -> None:
    for layer in model.base_model.layers if hasattr(model.base_model, "layers") else model.base_model.h:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert any(type(p).__name__ == "DTensor" for p in model.parameters())


def _save(model, report, out: Path) -> None:
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    if dist.get_rank() == 0:
        torch.save({"weights": full, "rules": {r.name: r.rule for r in report.rows}}, out)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for arch in ARCHS:
        model = hf_tiny.build(arch)
        roles = param_roles(model)  # before sharding: the documented path for a model that fits
        _shard(model, mesh)
        report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0), roles=roles)
        _save(model, report, out / f"{arch}.pt")
    for arch in META_ARCHS:
        model = hf_tiny.build(arch, "meta")
        _shard(model, mesh)
        model.to_empty(device="cpu")
        with torch.no_grad():  # what to_empty leaves: memory as it happened to be, made loud
            for p in model.parameters():
                p.to_local().fill_(float("nan"))
        report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
        _save(model, report, out / f"meta-{arch}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
