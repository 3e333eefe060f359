"""Many processes, one run: torchrun's process group, DDP or FSDP2 wrapping, agreement between ranks.

``torchrun --nproc_per_node N -m smallinit train ...`` starts N copies of the trainer. Each reads the same
config, builds the same model from the seed (full fp32 tensors on the CPU, so the weights never depend on
the layout), then hands it to PyTorch's own engines: DistributedDataParallel (``train.parallel=ddp``) or
FSDP2 ``fully_shard`` per block and then the root (``train.parallel=fsdp``). Every rank computes the global
batch of each step and keeps its own contiguous slice, so the data, schedule and results do not depend on
the number of ranks (up to the order of floating-point reductions).

Checkpoints are written and read by every rank, each its own shards (train/sharded.py), keyed by parameter
name, so a run saved on N ranks resumes on M. Apart from the shards, only rank 0 touches the run folder;
what it finds (a checkpoint, or a user error) is broadcast, so every rank continues or fails with the same
one-line error. A crashed rank ends the job: torchrun stops the others when one exits, and collectives time
out after ``train.dist_timeout`` seconds. A killed launcher ends it too: each worker notices that its parent
is gone and stops as if torchrun had sent SIGTERM (signals.stop_with_parent).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from smallinit.config import TrainConfig
from smallinit.errors import ConfigError, SmallinitError
from smallinit.signals import stop_with_parent

T = TypeVar("T")


@dataclass
class Runtime:
    """Where this process trains: its device and its place among ranks (1 of 1 unless under torchrun)."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @staticmethod
    def local(device: str = "auto") -> Runtime:
        return Runtime(resolve_device(device))

    @staticmethod
    def from_env(train: TrainConfig) -> Runtime:
        """This process's place under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

        One process (no torchrun, or ``--nproc_per_node 1``) trains locally and ignores ``train.parallel``.
        Otherwise the layout is checked first (the same check, so the same error, on every rank), then the
        process group is created: NCCL with one GPU per process (cuda:LOCAL_RANK), or gloo on CPUs.
        A torchrun worker stops when its launcher dies, even by SIGKILL: it checkpoints the step in flight
        and exits, within the grace torchrun itself gives its workers (TORCH_ELASTIC_SHUTDOWN_TIMEOUT).
        """
        if "TORCHELASTIC_RUN_ID" in os.environ:  # set by torchrun for its workers
            stop_with_parent(float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")))
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return Runtime.local(train.device)
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        check_layout(train, world_size)
        device = _rank_device(train.device, local_rank)
        if dist.is_initialized():
            if dist.get_world_size() != world_size or dist.get_rank() != rank:
                raise ConfigError("a process group of another size is already initialized; destroy it first")
        else:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                timeout=timedelta(seconds=train.dist_timeout),
                device_id=device if device.type == "cuda" else None,
            )
        return Runtime(device, rank, world_size, local_rank)


def names_gpu(device: str) -> bool:
    """Whether ``train.device`` asks for a GPU ("auto": whether one is present), without checking it exists."""
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but no CUDA GPU is available; use train.device=cpu")
    return device


def _rank_device(name: str, local_rank: int) -> torch.device:
    device = resolve_device(name)
    if device.type != "cuda":
        return device
    if device.index is not None:
        raise ConfigError(
            f"train.device={name} under torchrun: each process takes cuda:LOCAL_RANK; use train.device=cuda or auto"
        )
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"local rank {local_rank} but only {torch.cuda.device_count()} GPUs on this node; "
            "set --nproc_per_node to at most the number of GPUs"
        )
    return torch.device("cuda", local_rank)


def check_layout(train: TrainConfig, world_size: int) -> None:
    """What a run on ``world_size`` ranks needs of the config (checked before any process group exists)."""
    if world_size > 1 and train.parallel == "none":
        raise ConfigError(
            f"torchrun started {world_size} processes but train.parallel=none; set train.parallel=ddp or fsdp"
        )
    if train.batch_size % (world_size * train.grad_accum):
        raise ConfigError(
            f"train.batch_size={train.batch_size} must divide into {world_size} ranks × "
            f"train.grad_accum={train.grad_accum} micro-batches; use a multiple of {world_size * train.grad_accum}"
        )


def shutdown() -> None:
    """Destroy the default process group if one exists (end of a torchrun job)."""
    if dist.is_initialized():
        dist.destroy_process_group()


# -- wrapping ----------------------------------------------------------------------------------------------


def parallelize(model: nn.Module, rt: Runtime, train: TrainConfig) -> nn.Module:
    """Apply activation checkpointing, ``torch.compile`` and DDP / FSDP2 to ``model``; return what to call.

    ``model`` must already hold its initial weights (drawn in full from the seed). Checkpointing and
    compilation work per block and in place, and FSDP2 shards in place, so ``model`` keeps its parameter
    names; only DDP wraps it (the returned module). Every layout runs the same numerical model: fp32
    weights, and under bf16 the autocast of one process, with fp32 gradient reduction.
    """
    blocks = list(model.blocks)
    if train.activation_checkpointing:
        from torch.distributed._composable import checkpoint

        for block in blocks:  # keep only each block's input; recompute the rest in backward
            checkpoint(block)
    if train.compile:
        for block in blocks:  # the blocks share one graph, and FSDP2 hooks stay outside it
            compile_for_training(block)
    if not rt.is_distributed:
        return model
    if train.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # buffers (RoPE tables, MoE counters) need no sync before each forward: equal, or rank-local counts
        new_api = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        # every parameter gets a gradient each step (MoE experts are batched tensors): no unused-param search
        return DistributedDataParallel(
            model,
            device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
            gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no second copy
            **({"forward_sync_buffers": False} if new_api else {"broadcast_buffers": False}),
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    # no param_dtype: gathered weights stay fp32 and autocast casts what it casts in one process. FSDP2's bf16
    # policy would also cast each block's inputs (the residual stream, the RoPE tables) and the norms' and
    # router's weights to bf16: another numerical model than one process or DDP trains
    mp = MixedPrecisionPolicy()
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # the root: embedding, final norm, LM head
    return model


def compile_for_training(block: nn.Module) -> None:
    """``torch.compile`` the block's forward for calls with gradients (the training step).

    Calls without gradients (evaluation, the analysis callbacks' captures) stay eager: compiling them would
    trace and compile graphs of their own, each as costly as the training graph, for a few batches.
    """
    eager, compiled = block.forward, torch.compile(block.forward)
    block.forward = lambda *args, **kwargs: (compiled if torch.is_grad_enabled() else eager)(*args, **kwargs)


def is_fsdp(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def gradient_sync(engine: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch of an accumulation."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(engine, DistributedDataParallel) and not enabled:
        with engine.no_sync():
            yield
        return
    if is_fsdp(engine):
        engine.set_requires_gradient_sync(enabled)
    yield


def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip by the global gradient norm (over all shards under FSDP) and return that norm as a plain tensor."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


# -- agreement and reductions --------------------------------------------------------------------------------


def on_main(rt: Runtime, fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and give every rank its (picklable) result or its SmallinitError.

    For work on the run folder: one rank reads or writes it, and all ranks continue or fail alike.
    """
    if not rt.is_distributed:
        return fn()
    payload: list = [None]
    if rt.is_main:
        try:
            payload[0] = ("ok", fn())
        except SmallinitError as e:
            payload[0] = ("error", type(e), str(e))
    dist.broadcast_object_list(payload, src=0)
    if payload[0][0] == "error":
        _, cls, message = payload[0]
        raise cls(message)
    return payload[0][1]


def mean_over_ranks(value: torch.Tensor, rt: Runtime) -> torch.Tensor:
    if rt.is_distributed:
        value = value.clone()
        dist.all_reduce(value)  # gloo has no AVG: sum, then divide
        value /= rt.world_size
    return value


def sum_over_ranks(value: torch.Tensor, rt: Runtime) -> torch.Tensor:
    if rt.is_distributed:
        value = value.clone()
        dist.all_reduce(value)
    return value


def any_rank(flag: bool, rt: Runtime) -> bool:
    """True on every rank if it is true on one (e.g. a stop signal that reached only some processes)."""
    if not rt.is_distributed:
        return flag
    t = torch.tensor([int(flag)], device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def eval_pieces(
    x: torch.Tensor, y: torch.Tensor, rt: Runtime, micro_batches: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """This rank's share of an evaluation batch, in ``micro_batches`` pieces: (inputs, targets, rows).

    The batch is cut into world_size × micro_batches contiguous pieces and rank r takes its run of them,
    so every rank runs the same number of forwards (FSDP gathers parameters in each). A piece with no rows
    (a short last batch) is replaced by the first row, with ``rows`` = 0 so that its loss is not counted.
    """
    pieces = list(
        zip(x.tensor_split(rt.world_size * micro_batches), y.tensor_split(rt.world_size * micro_batches))
    )
    for xp, yp in pieces[rt.rank * micro_batches : (rt.rank + 1) * micro_batches]:
        rows = xp.shape[0]
        yield (xp, yp, rows) if rows else (x[:1], y[:1], 0)


# -- checkpoints ---------------------------------------------------------------------------------------------


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Parameter names that refer to an earlier one (tied embeddings): {alias: name}."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


# Train keys that say how a run is spread over devices, not what it computes: a run may resume under
# another layout (N ranks → M ranks, DDP → FSDP, compiled or not).
LAYOUT_KEYS = ("parallel", "compile", "activation_checkpointing", "dist_timeout", "device", "threads")


def with_layout_of(config: dict, other: dict) -> dict:
    """``config`` (a Config.to_dict()) with the layout keys of ``other``, for comparing what two runs compute."""
    theirs = other.get("train") if isinstance(other.get("train"), dict) else {}
    train = {k: v for k, v in config["train"].items() if k not in LAYOUT_KEYS}
    train.update({k: theirs[k] for k in LAYOUT_KEYS if k in theirs})  # a key they lack (older run) stays out
    return {**config, "train": train}
