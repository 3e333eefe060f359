"""Run by tests/integrations/test_zero3.py under torchrun (2 gloo ranks): transformers' Trainer with DeepSpeed ZeRO-3.

_zero3_worker.py init OUT     model_init under ZeRO-3; rank 0 saves every parameter gathered whole
_zero3_worker.py script FILE  a script (the docs' example) run as written
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from pathlib import Path

import torch


def config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )


ZERO3 = {
    "zero_optimization": {"stage": 3},
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
}


def init(out: Path) -> None:
    import deepspeed
    from transformers import TrainingArguments

    from smallinit.init.partitioned import is_partitioned
    from smallinit.integrations.hf import model_init

    # the arguments turn ZeRO-3 on for what is built next (transformers builds it inside zero.Init)
    args = TrainingArguments(output_dir=str(out), deepspeed=ZERO3, report_to="none")  # noqa: F841
    model = model_init(config(), gamma=1.0, norm_eps=1e-12, seed=0)()
    params = dict(model.named_parameters())
    partitioned = [n for n, p in params.items() if is_partitioned(p) and p.numel() < p.ds_numel]
    whole = {}
    for name, p in params.items():
        with deepspeed.zero.GatheredParameters([p]):
            whole[name] = p.detach().clone()
    if torch.distributed.get_rank() == 0:
        torch.save({"partitioned": partitioned, "weights": whole}, out / "zero3.pt")


def main() -> None:
    # DeepSpeed compiles a shared-memory all-reduce for CPU ranks at start-up (minutes); gloo does without it
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed

    mode, path = sys.argv[1], Path(sys.argv[2])
    if mode == "script":
        runpy.run_path(str(path), run_name="__main__")
        return
    deepspeed.init_distributed("gloo")
    init(path)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # the work is written: leave without the interpreter's teardown, where a rank still holding a C++ thread
    # aborts ("terminate called without an active exception", exit -6) on a loaded machine, even after the
    # process group is destroyed (the engines stage failed so twice)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
