"""How cells share the machine: how many run side by side, with how many threads, and one compile cache.

``jobs`` cells run side by side, each with ``cores // jobs`` threads (through OMP_NUM_THREADS, so
a cell's config and hence its results do not depend on the packing). Default rule: on CPU, models of at most
``SMALL_MODEL_PARAMS`` parameters run one single-threaded cell per core (small matmuls do not use two threads
well; benchmarks/README.md, "Packing", has the measured ratios); larger models, which were not measured,
and any cell on a GPU, run one at a time with every thread.

The cells share one compile cache (``TORCHINDUCTOR_CACHE_DIR``: the user's, else ``compile/`` in
smallinit's cache folder), and cells that leave ``train.compile`` at "auto" get one choice per graph, weighed
over all the cells of that graph (``smallinit.train.compiling``), passed as ``--set train.compile=...``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from smallinit.config import Config
from smallinit.data.cache import default_cache_dir
from smallinit.model import Transformer
from smallinit.study.running.spec import Cell
from smallinit.train import compiling
from smallinit.train.distributed import names_gpu

SMALL_MODEL_PARAMS = 25_000_000  # ≤ this (every CPU preset, the demo's shapes): pack one cell per core


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def compile_cache_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The compile cache of the cells: the user's TORCHINDUCTOR_CACHE_DIR, else one under smallinit's cache
    folder, shared by the cells of every sweep, so a graph compiled once loads in seconds in later cells."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": environ.get("TORCHINDUCTOR_CACHE_DIR")
        or str(default_cache_dir() / "compile")
    }


def default_jobs(configs: list[Config], cores: int | None = None) -> int:
    """The packing rule: small CPU models one single-threaded cell per core, anything else one at a time."""
    cores = cores or available_cores()
    if not configs or any(names_gpu(c.train.device) for c in configs):
        return 1
    if max(Transformer.count_params(c.model)[0] for c in configs) <= SMALL_MODEL_PARAMS:
        return max(1, min(cores, len(configs)))
    return 1


def compile_choices(cells: list[Cell], configs: dict[str, Config], jobs: int) -> dict[str, bool]:
    """train.compile for each cell left at "auto": one choice per graph, its cells weighed together, since
    they share the compile cache (the first ``jobs`` of them compile cold side by side, the rest load)."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        if configs[cell.id].train.compile == "auto":
            groups.setdefault(compiling.graph_key(configs[cell.id]), []).append(cell)
    env = compile_cache_env()
    choices = {}
    for group in groups.values():
        cfgs = [configs[c.id] for c in group]
        pays = compiling.compile_pays(cfgs, warm=compiling.is_warm(cfgs[0], env), jobs=jobs)
        choices.update((c.id, pays) for c in group)
    return choices
