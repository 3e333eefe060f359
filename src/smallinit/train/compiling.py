"""When a run is compiled: ``train.compile`` = true | false | "auto", and the compile cache runs share.

``torch.compile`` is applied per block (``distributed.parallelize``): the blocks share their code and
shapes, so Dynamo traces one block and every layer reuses that graph (one graph for 4 layers), and
Inductor keeps the compiled graph on disk (``TORCHINDUCTOR_CACHE_DIR``), where a later run of the same
shapes finds it. On one CPU thread at widths 16-128 (where it was measured, the demo's shape included)
the compiled step is faster by the fusion of the elementwise chain (RMSNorm, RoPE, the gate, SwiGLU); what it
costs is the compile, long with an empty cache and short with a warm one (benchmarks/README.md, "Tiny
widths", has both).

``"auto"`` compiles when the time a run saves pays for that compile: a CPU run (one process, dense
blocks, width ≤ ``TINY_WIDTH``) saves about ``SAVED_S_PER_ELEMENT`` seconds per activation element
(tokens per step × d_model × layers) per step. A sweep weighs the compile once for all its cells of one
graph (``compile_pays`` with several configs), since they share one cache. Anything else (a GPU, torchrun,
MoE, wider models) stays eager under "auto": compiling there was not measured to pay; set
``train.compile=true`` explicitly. The choice is written into the run's config.json (true or false), and a
resumed run keeps it, so a run never changes mode halfway and resume stays bit-exact.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from smallinit import io
from smallinit.config import Config
from smallinit.train.callbacks import Callback
from smallinit.train.distributed import names_gpu

# From the measurements in benchmarks/README.md, "Tiny widths" (1 thread, byte tokenizer, batch 16 × 128, 4 layers).
TINY_WIDTH = 128  # the widest model "auto" compiles: the widths the speedup was measured at
SAVED_S_PER_ELEMENT = (
    9.9e-9  # seconds a compiled step saves per token × d_model × layer (the lowest, at d = 64)
)
COLD_S = 15.0  # seconds to compile a block's forward and backward with an empty cache
WARM_S = 2.0  # ... and when the cache holds the graph (Dynamo still traces, Inductor loads)


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The Inductor cache a process with environment ``env`` uses."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(env.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()).absolute()


def graph_key(cfg: Config) -> str:
    """What the compiled block graph depends on: shapes, constants (ε), gate, precision, torch version.

    γ only changes the initial draws (unless ε is scaled by it, ``norm_eps_width``) and ``seed`` the data, so
    runs that differ in them share a graph.
    """
    model = cfg.to_dict()["model"]
    if not model.get("norm_eps_width"):
        del model["gamma"]
    tc = cfg.train
    fields = {
        "model": model,
        "micro_batch": tc.batch_size // tc.grad_accum,
        "seq_len": cfg.data.seq_len,
        "precision": tc.precision,
        "device": tc.device,
        "checkpointing": tc.activation_checkpointing,
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _marker(cfg: Config, env: Mapping[str, str]) -> Path:
    return cache_dir(env) / "smallinit" / f"{graph_key(cfg)}.done"


def is_warm(cfg: Config, env: Mapping[str, str] = os.environ) -> bool:
    """Whether a run of this graph has compiled into the cache ``env`` points at."""
    return _marker(cfg, env).is_file()


def mark_warm(cfg: Config) -> None:
    """Record that this graph is in the cache (called once a compiled step has run forward and backward)."""
    path = _marker(cfg, os.environ)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass  # only a hint for later runs: they compile cold and pay for it in time, nothing else


class MarkWarm(Callback):
    """Marks the graph warm in the cache after the first step, whose forward and backward compiled it."""

    def __init__(self, cfg: Config):
        self.cfg, self.done = cfg, False

    def on_step_end(self, trainer, record) -> None:
        if not self.done:
            mark_warm(self.cfg)
            self.done = True


def eligible(cfg: Config) -> bool:
    """Runs whose compile "auto" weighs: one CPU process, dense blocks, a tiny width."""
    return not names_gpu(cfg.train.device) and cfg.model.moe is None and cfg.model.d_model <= TINY_WIDTH


def saved_s(cfg: Config) -> float:
    """Seconds compiling saves over a whole run (its training steps; one thread)."""
    tc, m = cfg.train, cfg.model
    return SAVED_S_PER_ELEMENT * tc.batch_size * cfg.data.seq_len * m.d_model * m.n_layers * tc.steps


def compile_pays(configs: list[Config], *, warm: bool, jobs: int = 1) -> bool:
    """Whether compiling these runs of one graph saves more time than compiling costs.

    With an empty cache the first ``jobs`` runs (started side by side) compile cold, the others warm.
    """
    if not configs or not all(eligible(c) for c in configs):
        return False
    n = len(configs)
    cold = 0 if warm else min(jobs, n)
    return sum(saved_s(c) for c in configs) > cold * COLD_S + (n - cold) * WARM_S


def resolve(cfg: Config, world_size: int, recorded: bool | None) -> bool:
    """``train.compile`` as a choice: explicit true/false as given, "auto" by ``compile_pays`` for this run.

    ``recorded`` is the choice a resumed run made when it started (from its config.json): it is kept.
    """
    choice = cfg.train.compile
    if isinstance(choice, bool):
        return choice
    if recorded is not None:
        return recorded
    return world_size == 1 and compile_pays([cfg], warm=is_warm(cfg))


def recorded_choice(run_dir: Path) -> bool | None:
    """The compile choice a run folder's config.json holds (None: no folder, or "auto" not yet resolved)."""
    try:
        value = io.read_json(run_dir / "config.json")["train"]["compile"]
    except (KeyError, TypeError):
        return None
    return value if isinstance(value, bool) else None
