"""Parameters that DeepSpeed ZeRO-3 partitions: each rank holds a slice, the tensor itself has shape (0,)
and its full shape and size are the ``ds_shape`` and ``ds_numel`` attributes. Whatever reads a
parameter's shape reads it here; whatever reads its values gathers it here, every rank together.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable, Iterator

import torch

from smallinit.errors import ConfigError


def is_partitioned(p: torch.Tensor) -> bool:
    return hasattr(p, "ds_id") and hasattr(p, "ds_shape")


def full_shape(p: torch.Tensor) -> torch.Size:
    """The parameter's shape as the model declares it (a partitioned one's, not its (0,) slice)."""
    return torch.Size(p.ds_shape) if is_partitioned(p) else p.shape


def full_numel(p: torch.Tensor) -> int:
    return int(p.ds_numel) if is_partitioned(p) else p.numel()


@contextlib.contextmanager
def gathered(params: Iterable[torch.Tensor], *, modifier_rank: int | None = None) -> Iterator[None]:
    """The partitioned ones among ``params`` whole on every rank inside the block (a collective: every rank
    enters it with the same parameters); with ``modifier_rank``, that rank's values are kept at the exit.
    Parameters that are not partitioned are left as they are."""
    parts = [p for p in params if is_partitioned(p)]
    if not parts:
        yield
        return
    try:
        deepspeed = importlib.import_module("deepspeed")
    except ImportError:
        raise ConfigError(
            f"{len(parts)} parameters are partitioned by DeepSpeed ZeRO-3 (ds_shape), but deepspeed does not "
            "import here: pip install 'smallinit[deepspeed]'"
        ) from None
    with deepspeed.zero.GatheredParameters(parts, modifier_rank=modifier_rank):
        yield
