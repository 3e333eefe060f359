"""Checkpoints of a distributed run: every rank writes and reads its own shards (torch.distributed.checkpoint).

Layout (next to one process's, train/checkpoint.py)::

    RUN/checkpoints/step_0000100/shards/shard-0000R-model-00001-of-00001.safetensors   written by rank R-1
    RUN/checkpoints/step_0000100/state.json                                            written last, by rank 0

A rank's shard holds what it owns: its FSDP2 pieces of the weights and AdamW state (under DDP the replicated
tensors are dealt out among the ranks), under their full names — the names of one process's files — with
each piece's offsets in the file's JSON header. They are written and read by PyTorch's DCP with its
safetensors storage (``HuggingFaceStorageWriter`` / ``Reader``), whose index lives in those headers; DCP's
default ``FileSystemWriter`` would keep it in a pickled ``.metadata`` file, which we never read. Each file is
written by safetensors' ``save_file``, which streams the tensors to disk (``shard_writer``).

Saving: the ranks write into the checkpoint's temporary folder at once, each hashes its own files, rank 0
gathers the sizes and checksums into state.json and renames the folder when all are done (io.publishing),
so a named checkpoint is complete, as in one process. Loading: the ranks hash the files between them (each
a share), check names, shapes and dtypes against the model, then each reads only the slices it holds —
from a sharded checkpoint of any number of ranks, or from one process's whole files. No rank ever holds
the whole state.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from smallinit import io
from smallinit.errors import CheckpointError
from smallinit.train import checkpoint as ckpt
from smallinit.train.distributed import Runtime, on_main, tied_aliases


def shard_writer(folder: Path):
    """DCP's safetensors writer, each rank to its own file, written by ``save_file``, which streams the tensors
    to disk: DCP's own path builds the whole file in memory first, twice (2 × the rank's part, measured)."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint._hf_utils import CUSTOM_METADATA_KEY, SAVED_OFFSETS_KEY, _gen_file_name
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class ShardWriter(HuggingFaceStorageWriter):
        def write_data(self, plan, planner) -> Future:
            results = []
            if plan.items:  # the file name and header DCP's reader expects (hf_storage.py)
                path = Path(self.path) / _gen_file_name(1, 1, plan.storage_data["shard_index"])
                items = plan.items
                tensors = {i.index.fqn: planner.resolve_data(i).detach().cpu().contiguous() for i in items}
                offsets = {i.index.fqn: {SAVED_OFFSETS_KEY: list(i.tensor_data.chunk.offsets)} for i in items}
                save_file(tensors, path, metadata={CUSTOM_METADATA_KEY: json.dumps(offsets), "format": "pt"})
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
                results = [WriteResult(i.index, tensors[i.index.fqn].nbytes, None) for i in items]
            done: Future = Future()
            done.set_result(results)
            return done

    return ShardWriter(str(folder), save_distributed=True)


def local_tensors(model: nn.Module, optimizer) -> dict[str, torch.Tensor]:
    """This rank's model and optimizer tensors (FSDP2: DTensor shards, not copies), keyed as in a checkpoint."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    aliases = tied_aliases(model)
    tensors = {k: v for k, v in get_model_state_dict(model).items() if k not in aliases}
    if optimizer.state:  # an untouched optimizer has nothing to save (and reading it would initialise it)
        for name, state in get_optimizer_state_dict(model, optimizer)["state"].items():
            tensors.update(
                {f"{name}.{k}": v if torch.is_tensor(v) else torch.tensor(v) for k, v in state.items()}
            )
    return tensors


def save_sharded(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer,
    state: dict[str, Any],
    rt: Runtime,
    *,
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` from every rank (collective), then prune to the newest ``keep``."""
    from torch.distributed.checkpoint import save

    final = ckpt.checkpoint_dir(run_dir, step)
    with contextlib.ExitStack() as publish:  # rank 0's io.publishing, open while all ranks write
        tmp = on_main(rt, lambda: publish.enter_context(io.publishing(final, kept=ckpt.kept(run_dir))))
        shards = tmp / ckpt.SHARDS
        save(local_tensors(model, optimizer), storage_writer=shard_writer(shards))
        mine = {
            f"{ckpt.SHARDS}/{p.name}": ckpt.file_record(p) for p in shards.glob(f"shard-{rt.rank + 1:05d}-*")
        }
        written: list[dict[str, Any]] = [{}] * rt.world_size
        dist.all_gather_object(written, mine)

        def finish() -> None:
            files = {k: v for part in written for k, v in part.items()}
            unclaimed = sorted({f"{ckpt.SHARDS}/{p.name}" for p in shards.iterdir()} - set(files))
            if unclaimed:  # DCP named a file after no rank: it would go unverified
                raise CheckpointError(
                    f"{unclaimed[0]} was written but no rank hashed it; checkpoint not kept"
                )
            ckpt.write_state(tmp, state, ckpt.SHARDED, step, files, run_dir)
            publish.close()  # the rename: the checkpoint now exists
            ckpt.prune(run_dir, keep)

        on_main(rt, finish)
    return final


def verify_shared(found: ckpt.Checkpoint, rt: Runtime) -> None:
    """Every tensor file's sha256, the ranks taking turns; a mismatch stops every rank with the same line."""
    files = sorted(found.state["files"])
    errors: list[str | None] = [None] * rt.world_size
    mine = None
    for fname in files[rt.rank :: rt.world_size]:
        try:
            ckpt.verify_file(found, fname)
        except CheckpointError as e:
            mine = str(e)
            break
    dist.all_gather_object(errors, mine)
    first = next((e for e in errors if e), None)
    if first:

        def refuse() -> None:
            raise ckpt.refused(found.path, CheckpointError(first))

        on_main(rt, refuse)


def load_sharded(
    model: nn.Module,
    optimizer,
    names: dict[int, str],
    rt: Runtime,
    found: ckpt.Checkpoint,
) -> None:
    """Restore model and optimizer state (an AdamW, or MuonAdamW's two) on every rank from ``found`` (read with ``verify=False``; verified here)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader, load
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    verify_shared(found, rt)
    reader = HuggingFaceStorageReader(str(found.tensor_folder))
    stored = {  # shapes and dtypes only
        k: torch.empty(v.size, dtype=v.properties.dtype, device="meta")
        for k, v in ckpt.stored_spec(reader).items()
    }
    model_state = get_model_state_dict(model)  # this rank's part of the parameters themselves
    spec = ckpt.tensor_spec(model_state)  # global shapes
    optim_keys = {k for k in stored if ckpt.is_optimizer_key(k, spec)}
    weights = {k: v for k, v in stored.items() if k not in optim_keys}
    weights.update({a: weights[t] for a, t in (found.state.get("aliases") or {}).items() if t in weights})
    ckpt.check_model_tensors(weights, spec, found.path)  # the same tensors on every rank: the same error
    saved = ckpt.check_optimizer_tensors(
        {k: stored[k] for k in optim_keys},
        {n: spec[n] for n in names.values()},
        ckpt.held_state(optimizer, names),
    )

    aliases = tied_aliases(model)
    load({k: v for k, v in model_state.items() if k not in aliases}, storage_reader=reader)
    set_model_state_dict(model, model_state)
    if not saved:
        return  # saved before the first step: the optimizer starts empty, as it did then
    current = get_optimizer_state_dict(model, optimizer)  # creates AdamW's state (a step at learning rate 0)
    state = {n: st for n, st in current["state"].items() if n in saved}  # a parameter without state stays so
    load({f"{n}.{k}": v for n, st in state.items() for k, v in st.items()}, storage_reader=reader)
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": current["param_groups"]})
