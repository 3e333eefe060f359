"""Run by tests/monitor/test_monitor_order.py under torchrun (gloo, 2 ranks): a plain FSDP2 loop on smallinit's
own model and on a decoder of no library (support.nanochat_style), trained with no Monitor and with one built
at each point a user may build it: before ``fully_shard``, after it and before the optimizer, after the
optimizer. Each run measures at steps 0, 2 and 4; rank 0 writes the losses and the weights (gathered) of
every order to OUT/order.pt.

    python -m torch.distributed.run --nproc_per_node 2 tests/_monitor_order_worker.py OUT"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from smallinit import ModelConfig, Monitor, Transformer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the tests' support package
from support.monitor import tokens  # noqa: E402
from support.nanochat_style import GPT, Config  # noqa: E402

ORDERS = ("none", "before-shard", "before-optimizer", "after-optimizer")
STEPS = 4


def build(kind: str) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The model (the same weights on every rank and in every run) and its blocks, each sharded alone."""
    torch.manual_seed(0)
    if kind == "smallinit":
        model = Transformer(
            ModelConfig(
                d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64, vocab_size=256, max_seq_len=64
            )
        )
        return model, list(model.blocks)
    model = GPT(Config(vocab=256, d=32, heads=4, layers=2))
    return model, list(model.h)


def loss_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x[:, :-1])
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())


def train(kind: str, order: str, out: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, blocks = build(kind)
    monitor = None

    def watch() -> Monitor:
        return Monitor(model, every=2, batch=tokens(2, seed=1), out=out / kind / order)

    if order == "before-shard":
        monitor = watch()
    mesh = init_device_mesh("cpu", (world,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if order == "before-optimizer":
        monitor = watch()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if order == "after-optimizer":
        monitor = watch()
    losses = []
    for step in range(STEPS + 1):
        if monitor is not None:
            monitor(step)
        if step == STEPS:
            break
        loss = loss_of(model, tokens(4, seed=100 + step)[rank::world])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if monitor is not None:
        monitor.close()
    weights = {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for n, p in model.named_parameters()
    }
    return {"losses": losses, "weights": weights}


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    dist.init_process_group("gloo")
    runs = {
        (kind, order): train(kind, order, folder) for kind in ("smallinit", "decoder") for order in ORDERS
    }
    if dist.get_rank() == 0:
        torch.save(runs, folder / "order.pt")
    dist.destroy_process_group()
