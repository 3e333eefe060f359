"""Run by tests/monitor/test_monitor_distributed.py: a plain loop on a tiny Qwen3 with the Monitor, one process or
under torchrun (gloo, 2 ranks) with DDP or FSDP2 (fully_shard).

    python tests/_monitor_dist_worker.py single OUT STEPS
    python -m torch.distributed.run --nproc_per_node 2 tests/_monitor_dist_worker.py ddp|fsdp|titan OUT STEPS

titan is torchtitan's path: built on meta, sharded, materialised with to_empty, then γ-initialised. Each step's global batch is the same 8 sequences whatever the layout; each rank trains on its share, so the
averaged gradient, the weights and the monitor's records match the single process."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from smallinit import Monitor, gamma_init_, set_norm_eps_

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the tests' support package
from support.monitor import tiny_qwen3, tokens  # noqa: E402


def main(layout: str, out: str, steps: int) -> None:
    torch.manual_seed(0)
    rank, world = 0, 1
    if layout != "single":
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_qwen3()
    if layout == "titan":
        with torch.device("meta"):
            model = type(model)(model.config)
    engine = model
    if layout == "ddp":
        engine = torch.nn.parallel.DistributedDataParallel(model)
    elif layout in ("fsdp", "titan"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))  # the CPU, also for a model built on meta
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    if layout == "titan":
        model.to_empty(device="cpu")
        gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))  # as tiny_qwen3 draws on the CPU
        set_norm_eps_(model, 1e-12)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with Monitor(
        engine, every=max(1, steps // 4), batch=tokens(4, seed=1), out=out, total_steps=steps
    ) as mon:
        mon(0)
        for step in range(1, steps + 1):
            x = tokens(8, seed=100 + step)[rank::world]
            engine(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
            mon(step)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
