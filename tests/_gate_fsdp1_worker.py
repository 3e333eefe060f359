"""Run by tests/init/test_attention_gate.py under torchrun (gloo): the attention gate added on the meta device,
then materialised by torch's FSDP1 as it materialises any meta model (each module's reset_parameters after
to_empty; Lightning Fabric's FSDP does the same).

    python -m torch.distributed.run --nproc_per_node 2 tests/_gate_fsdp1_worker.py OUT_DIR

Rank 0 writes OUT_DIR/gates.pt: each W_θ gathered from the sharded model, and the loss of one forward.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from smallinit import add_attention_gate_
from support.attention import decoder


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    with torch.device("meta"):
        model = decoder()
    add_attention_gate_(model, gamma=0.5, generator=torch.Generator().manual_seed(7), example_inputs=None)
    model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    loss = model(x).square().mean()  # the gates' forward runs: each was drawn
    with FSDP.summon_full_params(model):
        gates = {n: p.detach().clone() for n, p in model.named_parameters() if "g_proj" in n}
    if dist.get_rank() == 0:
        torch.save({"gates": gates, "loss": loss.item()}, out / "gates.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
