"""Host memory of every rank while a distributed run writes one checkpoint (CPU, gloo).

    torchrun --standalone --nproc_per_node 2 benchmarks/checkpoint_memory.py --out /tmp/ckpt-mem \\
        [--preset cpu-20m] [--set model.d_model=1024 ...] [--json result.json]

Each rank trains one step (so AdamW state exists), then the peak resident memory (VmHWM, reset through
/proc/self/clear_refs just before) is read around ``Trainer.save``. Prints one JSON line: per rank, the
resident memory before the save, the peak during it, and the save's seconds; and the parameter count.
Linux only (procfs).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from smallinit import Config
from smallinit.train import Trainer
from smallinit.train.distributed import shutdown

BASE = [
    "data.tokenizer=bytes",
    "data.corpus=shakespeare",
    "data.seq_len=32",
    "train.batch_size=4",
    "train.steps=1",
    "train.warmup_steps=0",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.device=cpu",
    "train.parallel=fsdp",
]


def status_gib(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError(f"no {key} in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run folder to create")
    ap.add_argument("--preset", default="cpu-20m")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    trainer = Trainer(Config.load(preset=args.preset, overrides=[*BASE, *args.sets]), args.out, callbacks=[])
    trainer.train_step()
    rss = status_gib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = time.perf_counter()
    trainer.save()
    row = {"rss_before_gib": rss, "peak_gib": status_gib("VmHWM"), "save_s": time.perf_counter() - start}
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() == 0:
        result = {
            "params": trainer.model.num_params(),
            "ranks": rows,
            "max_peak_gib": max(r["peak_gib"] for r in rows),
        }
        print(json.dumps(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
