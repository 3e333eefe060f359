"""One monitor for any training loop: the paper's measurements every N steps on a fixed held-out batch.

    monitor = Monitor(model, every=50, batch=held_out_ids, out="runs/mine")
    for step in range(steps):
        ...                      # the user's own step
        monitor(step + 1)        # measures when the step is due; monitor(0) before the first step
    monitor.close()

Each measurement takes one forward of the held-out batch through the model's adapter (smallinit.adapters:
smallinit's Transformer, any Hugging Face causal LM, an adapter of your own, or for any other nn.Module
the one found from its forward) and records the sink per layer and Sink_ε, the residual flow, every norm's
factor, the loss, and the stable rank and mean |cos| of chosen matrices (on a model read from its forward,
every matrix and each part of a fused one): one ``{"event": "analysis", "step": ...}`` record in metrics.jsonl (its type and schema:
smallinit.monitor.records.AnalysisRecord), the format that ``smallinit report`` reads, and row-cosine
heatmaps as analysis/rowcos_step_NNNNNNN.npz at a few steps.
In a folder of its own it also writes the held-out loss as ``{"step", "val_loss"}``, the validation curve
of the report. At its first measurement of a fresh run it warns, in one line, when a norm is saturated
(factor < 0.5).

It observes and never changes training: eval mode and no gradients while measuring, the model's mode
restored. Under torch.distributed every rank must call it at the same steps (a sharded model's forward and
its matrices need them all); rank 0 alone writes. smallinit's Trainer reaches it through
:class:`AnalysisCallback`, the integrations (smallinit.integrations) through their engines' callbacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import logging
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from smallinit import io
from smallinit.adapters import HFAdapter, ModelAdapter, TracedAdapter, TransformerAdapter, as_adapter
from smallinit.config import AnalysisConfig
from smallinit.errors import ConfigError
from smallinit.init import GammaEstimate, measure_gamma, param_roles
from smallinit.init.partitioned import full_numel, gathered, is_partitioned
from smallinit.measures.activations import evaluating, measure_activations
from smallinit.measures.condensation import (
    MatrixStat,
    named_matrices,
    rms,
    row_cosine,
    sampled_mean_abs_cos,
    stable_rank,
)
from smallinit.measures.norm_factor import SATURATED, norm_factors_from_observed
from smallinit.monitor.lock import RunLock
from smallinit.monitor.metrics import append_record, set_aside_metrics, truncate_metrics
from smallinit.monitor.records import AnalysisRecord, EvalRecord, NormFactorRecord, parse_record

log = logging.getLogger("smallinit")

SNAPSHOT_DIR = "analysis"
MONITOR_FILE = "monitor.json"  # what a folder written by a monitor outside smallinit's trainer holds
COS_ROWS = 512  # rows sampled for the logged mean |cos| of large matrices
DEFAULT_EVERY = 100  # the monitor's cost at this interval is benchmarked in benchmarks/bench_callbacks.py


def snapshot_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR / f"rowcos_step_{step:07d}.npz"


class Monitor:
    """``Monitor(model, every=N, batch=… | data=…, out=DIR)``; the other AnalysisConfig fields (norm_every,
    matrices, heatmaps, snapshots, heatmap_rows, batch_size) may be passed too.

    ``batch``: held-out token ids, (B, T) (the targets are the next tokens), an ``(x, y)`` pair, or a dict
    with ``input_ids`` (and ``labels``, Hugging Face style); ``data``: an iterable of such batches or rows
    (a DataLoader, a tokenized dataset), of which the first ``batch_size`` sequences are kept.
    ``out``: the folder the records and heatmaps go to, held by this monitor alone while it runs; with ``log``
    each record goes to that writer of the caller's instead (smallinit's Trainer: its metrics.jsonl), and the
    caller holds the folder. ``total_steps`` spreads the heatmap snapshots over the run; ``start_step``
    continues the records of a resumed run (later ones are dropped); ``name`` is what a report calls the run
    (default: the folder's name; the integrations give their engine's folder); ``settings`` (e.g.
    ``{"model.gamma": 1.0}``) are what the report groups runs by; ``guard=False`` silences the saturation
    warning where saturation is asked for. ``steady_rms`` (parameter name → √(η/λ), its optimizer's peak rate
    over its weight decay, for the parameters that decay: :func:`smallinit.train.optim.steady_rms` gives it for
    a torch optimizer) puts each recorded matrix's RMS beside the norm weight decay drives it to. Without
    ``cfg``, ``every`` is 100.
    """

    def __init__(
        self,
        model: Any,
        cfg: AnalysisConfig | None = None,
        *,
        batch: Any = None,
        data: Iterable | None = None,
        out: str | Path,
        log: Callable[[dict[str, Any]], None] | None = None,
        total_steps: int | None = None,
        start_step: int = 0,
        settings: Mapping[str, Any] | None = None,
        engine: str = "loop",
        name: str | None = None,
        guard: bool = True,
        kept: io.Kept | None = None,
        steady_rms: Mapping[str, float] | None = None,
        **fields: Any,
    ):
        cfg_given = cfg is not None
        if not cfg_given:
            fields.setdefault("every", DEFAULT_EVERY)
        cfg = dataclasses.replace(cfg or AnalysisConfig(), **fields)
        cfg.validate()
        if cfg.every < 1 and cfg.norm_every < 1:
            raise ConfigError(
                f"the monitor needs every or norm_every ≥ 1, got {cfg.every} and {cfg.norm_every}"
            )
        self.cfg, self.total_steps, self.start_step, self.kept = cfg, total_steps, start_step, kept
        self.steady_rms = dict(steady_rms or {})
        self.adapter = as_adapter(_unwrapped(model))
        self.module = self.adapter.module
        self.writes = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        self.tokens, self.targets = self._held_out(batch, data)
        with _eval_mode(self.module):
            if isinstance(self.adapter, (TracedAdapter, HFAdapter)):
                # a forward that cannot run says so now, and the parts of fused matrices become known on one
                # sequence: following them keeps every product of the forward alive (several steps' memory)
                with torch.no_grad():
                    self.adapter.observe(self.tokens[:1], kinds=("attention",))
            example = getattr(self.adapter, "example_inputs", None)  # the forward γ-init's trace runs
            # fixed in training
            self.roles = param_roles(self.module, example(self.tokens[:1]) if example else None)
        # a ZeRO-3 partitioned matrix is a (0,) slice on each rank: whole while its names are listed
        with gathered(p for n, p in self.module.named_parameters() if self.roles[n].drawn):
            self.matrices = self._chosen("matrices", fields, cfg, cfg_given)
            self.heatmaps = set(self._chosen("heatmaps", fields, cfg, cfg_given))
        self.snapshot_steps = self._snapshot_steps()
        # the saturation guard speaks at the start of a fresh run only
        self.warned = start_step > 0 or not guard
        self.told: set[str] = set()  # fused matrices already said to be recorded whole
        self.last_step: int | None = None
        self.last_loss: float | None = None
        self.out = Path(out)
        self._lock: RunLock | None = None
        self._log = log or self._append
        self.own_folder = log is None  # else the caller writes the records and holds the folder
        # the γ the weights were drawn with, read from them before the first step (every rank: a sharded
        # matrix is gathered), so a report can say it when the caller did not
        start = measure_gamma(self.module, self.roles) if self.own_folder and not start_step else None
        if self.own_folder and self.writes:
            self._open(engine, name or self.out.name, dict(settings or {}), start)

    # -- the held-out batch and what is measured ------------------------------------------------------------

    @property
    def _ours(self) -> bool:
        return isinstance(self.adapter, TransformerAdapter)

    def _held_out(self, batch: Any, data: Iterable | None) -> tuple[torch.Tensor, torch.Tensor]:
        if (batch is None) == (data is None):
            raise ConfigError(
                "pass the monitor a held-out batch= (token ids) or data= (an iterable of batches), "
                "not " + ("both" if batch is not None else "neither")
            )
        x, y = _as_xy(batch) if batch is not None else _first_rows(data, self.cfg.batch_size)
        limit = _context(self.module)
        if limit is not None and x.shape[1] > limit:
            raise ConfigError(
                f"the held-out batch has {x.shape[1]} positions, more than the model's context of "
                f"{limit}; pass shorter sequences"
            )
        device = next(self.module.parameters()).device
        return x.to(device), y.to(device)

    def _chosen(self, key: str, fields: dict[str, Any], cfg: AnalysisConfig, cfg_given: bool) -> list[str]:
        """The matrices (by name) ``key`` ("matrices", "heatmaps") names: on a model that is not smallinit's,
        where no pattern is given, every weight matrix (heatmaps: those of the first block); a given pattern
        that matches no matrix is an error (one line), never an empty record."""
        patterns = fields.get(key, getattr(cfg, key))
        given = key in fields or (cfg_given and patterns != getattr(AnalysisConfig(), key))
        if not given and not self._ours:
            every = list(named_matrices(self.module, roles=self.roles))
            if key == "matrices":
                return every
            first = getattr(self.adapter, "blocks", None) or []
            return [n for n in every if first and n.startswith(f"{first[0][0]}.")][:8] or every[:4]
        names = list(named_matrices(self.module, patterns, roles=self.roles))
        unmatched = [p for p in patterns if given and not any(fnmatch.fnmatchcase(n, p) for n in names)]
        if unmatched:
            shown = ", ".join(list(named_matrices(self.module, roles=self.roles))[:6])
            raise ConfigError(
                f"{key} pattern {unmatched[0]!r} matches no weight matrix of {type(self.module).__name__} "
                f"(its matrices: {shown}, …); pass patterns of its parameter names"
            )
        return names

    def _snapshot_steps(self) -> set[int]:
        every, n = self.cfg.every, self.cfg.snapshots
        if not every or not n:
            return set()
        if self.total_steps is None:  # length unknown: the start, then at doubling intervals
            return {0} | {every * 2**k for k in range(n - 1)}
        measured = self.cfg.steps(self.total_steps)
        targets = [round(i * self.total_steps / (n - 1)) for i in range(n)] if n > 1 else [0]
        return {next((s for s in measured if s >= t), measured[-1]) for t in targets}

    # -- the folder ----------------------------------------------------------------------------------------

    def _open(self, engine: str, name: str, settings: dict[str, Any], start: GammaEstimate | None) -> None:
        out = self.out
        self._lock = RunLock.take(out, "out=")
        # the folder is given up when the monitor goes, closed or not (a training that raised)
        self._release = weakref.finalize(self, self._lock.release)
        if self.start_step:
            truncate_metrics(out, self.start_step)
            for path in (out / SNAPSHOT_DIR).glob("rowcos_step_*.npz"):
                if int(path.stem.rsplit("_", 1)[1]) > self.start_step:
                    path.unlink()
        else:
            set_aside_metrics(out, self.kept)  # a fresh start keeps an earlier attempt's records beside it
        if start is None:  # a resumed run keeps what its fresh start measured
            before = io.read_json(out / MONITOR_FILE)
            start_gamma = before.get("gamma_at_start") if isinstance(before, dict) else None
        else:
            start_gamma = start.to_dict()
        io.write_json_atomic(
            out / MONITOR_FILE,
            {
                "engine": engine,
                "name": name,
                "gamma_at_start": start_gamma,
                "model": describe_model(self.adapter),
                "settings": settings,
                "every": self.cfg.every,
                "norm_every": self.cfg.norm_every,
                "total_steps": self.total_steps,
                "batch": list(self.tokens.shape),
                "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
            },
        )

    def _append(self, record: dict[str, Any]) -> None:
        if self.writes:
            append_record(self.out, record, self.kept)

    def close(self) -> None:
        """The run's summary (the last step measured and its loss), and the folder given up."""
        if self._lock is not None:
            try:
                io.write_json_atomic(
                    self.out / "summary.json",
                    {
                        "step": self.last_step,
                        "val_loss": self.last_loss,
                        "params": sum(full_numel(p) for p in self.module.parameters()),
                        "params_nonembed": _params_nonembed(self.module),
                    },
                )
            finally:
                self._release()
                self._lock = None

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- measuring -----------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return self.cfg.analyses(step) or self.cfg.measures_norms(step)

    def __call__(self, step: int) -> dict[str, Any] | None:
        """Measure at ``step`` what is due there (the full record, the norms' record, or both from one forward);
        the full record where one was taken, else the norms', else None."""
        if step == self.last_step or not self.due(step):
            return None
        self.last_step = step
        full = self.measure(step) if self.cfg.analyses(step) else None
        if self.cfg.measures_norms(step):
            norms = self.measure_norms(step, None if full is None else full.get("norm_factor"))
            return full or norms
        return full

    @torch.no_grad()
    def measure(self, step: int) -> dict[str, Any]:
        """Every measurement at ``step``, recorded whether or not it is due."""
        with _eval_mode(self.module):
            acts = measure_activations(self.adapter, self.tokens, self.targets)
        mats = self._gathered()  # once FSDP2's sharded parameters are registered again
        rec = AnalysisRecord(
            **vars(acts),
            step=step,
            matrices=tuple(
                MatrixStat(
                    n,
                    tuple(W.shape),
                    stable_rank(W),
                    sampled_mean_abs_cos(W, max_rows=COS_ROWS),
                    rms(W),
                    self._steady(n),
                )
                for n, W in mats.items()
            ),
        )
        self.last_loss = rec.loss
        self._guard(step, rec.norm_factor)
        written = rec.to_dict()
        self._log(written)
        if self.own_folder and self.last_loss is not None:  # the validation curve the report draws
            self._log(EvalRecord(step, self.last_loss).to_dict())
        if step in self.snapshot_steps:
            self._snapshot(step, {n: W for n, W in mats.items() if n in self.heatmaps})
        return written

    @torch.no_grad()
    def measure_norms(self, step: int, factors: dict[str, float] | None = None) -> dict[str, Any]:
        """The norm factors alone (one forward), or ``factors`` measured already at this step."""
        if factors is None:
            with _eval_mode(self.module):
                observed = self.adapter.observe(self.tokens, kinds=("norms",))
            # as measure's: read off each norm's forward
            factors = norm_factors_from_observed(self.adapter, observed)[0]
        self._guard(step, factors)
        rec = NormFactorRecord(step, factors).to_dict()
        self._log(rec)
        return rec

    def _steady(self, matrix: str) -> float | None:
        """√(η/λ) of the parameter a recorded matrix is (NAME) or is part of (NAME.i: an expert, NAME[q]: a
        fused part), where the caller gave it."""
        for name, value in self.steady_rms.items():
            if matrix == name or matrix.startswith((name + ".", name + "[")):
                return value
        return None

    def _gathered(self) -> dict[str, torch.Tensor]:
        """The recorded matrices, whole (a sharded or ZeRO-3 partitioned tensor is gathered: every rank takes
        part), and each part of a fused one (NAME[q], NAME[k], NAME[v]: the rows the forward makes each
        attention input of)."""
        if not self.matrices:
            return {}
        params = [
            p
            for n, p in self.module.named_parameters()
            if any(m == n or m.startswith(n + ".") for m in self.matrices)
        ]
        with gathered(params):
            mats = named_matrices(self.module, self.matrices, roles=self.roles)
            # a partitioned parameter goes back to its slice when the block ends: its matrices are copied
            copy = any(is_partitioned(p) for p in params)
            whole = {
                n: W.full_tensor() if hasattr(W, "full_tensor") else W.clone() if copy else W
                for n, W in mats.items()
            }
        unsplit = sorted(set(getattr(self.adapter, "unsplit", ())) & set(whole) - self.told)
        if unsplit and self.writes:
            log.warning(
                f"{', '.join(unsplit)}: the queries, keys and values are all made of this matrix, but their rows "
                "could not be told apart in the forward, so its statistics are the whole matrix's, not each part's"
            )
        self.told.update(unsplit)
        for name, rows in (getattr(self.adapter, "parts", None) or {}).items():
            if name in whole:
                whole.update(
                    {f"{name}[{part}]": whole[name][r.to(whole[name].device)] for part, r in rows.items()}
                )
        return whole

    def _guard(self, step: int, factors: dict[str, float]) -> None:
        if self.warned or not factors:
            return
        self.warned = True
        name, factor = min(factors.items(), key=lambda kv: kv[1])
        if factor < SATURATED and self.writes:
            n = sum(f < SATURATED for f in factors.values())
            log.warning(
                f"{n} of {len(factors)} norms are saturated at step {step} (the lowest, {name}, has factor "
                f"{factor:.3f} < {SATURATED}): their ε, not their input, sets the scale, which undoes a small "
                "initialization; lower ε (smallinit.set_norm_eps_(model, 1e-12)) or use a larger init scale"
            )

    def _snapshot(self, step: int, mats: dict[str, torch.Tensor]) -> None:
        if not self.writes or not mats:
            return
        arrays = {}
        for name, W in mats.items():
            rc = row_cosine(W, max_rows=self.cfg.heatmap_rows)
            arrays[name] = rc.matrix.astype(np.float16)
            arrays[f"{name}/stable_rank"] = np.float64(stable_rank(W))
            arrays[f"{name}/mean_abs_cos"] = np.float64(rc.mean_abs)
        path = snapshot_path(self.out, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        io.write_atomic(path, lambda f: np.savez(f, step=np.int64(step), **arrays), kept=self.kept)


def load_snapshots(run_dir: str | Path) -> list[dict[str, Any]]:
    """The heatmap snapshots of a run, oldest first: ``{"step", "matrices": {name: array}, "stable_rank":
    {name: float}, "mean_abs_cos": {name: float}}``."""
    out = []
    for path in sorted((Path(run_dir) / SNAPSHOT_DIR).glob("rowcos_step_*.npz")):
        with np.load(path) as z:
            snap: dict[str, Any] = {
                "step": int(z["step"]),
                "matrices": {},
                "stable_rank": {},
                "mean_abs_cos": {},
            }
            for key in z.files:
                if key == "step":
                    continue
                name, _, stat = key.partition("/")
                if stat:
                    snap[stat][name] = float(z[key])
                else:
                    snap["matrices"][name] = z[key].astype(np.float32)
        out.append(snap)
    return out


def scalars(record: dict[str, Any], prefix: str = "smallinit/") -> dict[str, float]:
    """A monitor record (what a :class:`Monitor` call returns) as flat scalars, for an engine's own loggers
    (TensorBoard, W&B, …)."""
    rec = parse_record(record)
    full = isinstance(rec, AnalysisRecord)  # else a norm-factor record: its factors alone
    out: dict[str, float] = {}
    if full:
        for key, value in (
            ("sink_mean", rec.sink.mean if rec.sink else None),
            ("residual_flow", rec.residual_flow),
            ("loss", rec.loss),
            ("max_attention_logit", max(rec.max_attention_logit, default=None)),
            ("massive_ratio", max(rec.massive.ratio, default=None) if rec.massive else None),
        ):
            if value is not None:
                out[prefix + key] = value
        if rec.sink and 0.3 in rec.sink.share_above:
            out[prefix + "sink_share_0.3"] = rec.sink.share_above[0.3]
    factors = rec.norm_factor if isinstance(rec, (AnalysisRecord, NormFactorRecord)) else {}
    if factors:
        out[prefix + "norm_factor_min"] = min(factors.values())
        out[prefix + "norm_factor_mean"] = float(np.mean(list(factors.values())))
    for m in rec.matrices if full else ():
        out[f"{prefix}stable_rank/{m.name}"] = m.stable_rank
        if m.mean_abs_cos is not None:
            out[f"{prefix}mean_abs_cos/{m.name}"] = m.mean_abs_cos
    return out


def describe_model(adapter: ModelAdapter) -> dict[str, Any]:
    """What a monitored folder says of its model, under the keys smallinit's own runs use where they exist."""
    module = adapter.module
    config = getattr(module, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if config is None and hasattr(module, "cfg"):  # smallinit's Transformer
        config = module.cfg
    if config is None:  # a model that keeps its shape on itself (OLMo-core's Transformer: d_model, n_layers)
        config = module
    desc: dict[str, Any] = {"class": type(module).__name__}
    for key, names in (
        ("d_model", ("d_model", "hidden_size", "n_embd", "dim")),  # dim: torchtitan's
        ("n_layers", ("n_layers", "num_hidden_layers", "n_layer")),
        ("n_heads", ("n_heads", "num_attention_heads", "n_head")),
        ("d_ff", ("d_ff", "intermediate_size", "n_inner")),
    ):
        value = next((getattr(config, n) for n in names if isinstance(getattr(config, n, None), int)), None)
        if value is not None:
            desc[key] = value
    eps = [form.eps for form in adapter.norms().values()]
    if eps:
        desc["norm_eps"] = min(eps)
    return desc


def _params_nonembed(module: nn.Module) -> int:
    embedded = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    return sum(full_numel(p) for p in module.parameters() if id(p) not in embedded)


def _unwrapped(model: Any) -> Any:
    """The model inside a DDP / DataParallel wrapper (its forward would sync buffers across ranks) or Lightning
    Fabric's (``fabric.setup``: its forward moves and casts the inputs, and its names are prefixed)."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    for where in ("lightning.fabric.wrappers", "lightning_fabric.wrappers"):  # loaded where Fabric made it
        wrappers = sys.modules.get(where)
        if wrappers is not None and isinstance(model, wrappers._FabricModule):
            return _unwrapped(model.module)
    return model


def _context(module: nn.Module) -> int | None:
    cfg = getattr(module, "cfg", None) or getattr(module, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg  # a multimodal model's text part
    for name in ("max_seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            return value
    return None


def _as_xy(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, next-token targets) from the forms a held-out batch comes in."""
    if (
        isinstance(batch, (tuple, list))
        and len(batch) == 2
        and all(isinstance(t, torch.Tensor) for t in batch)
    ):
        x, y = batch
    else:
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else batch
        if not isinstance(ids, torch.Tensor):
            ids = torch.as_tensor(ids)
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        labels = ids if labels is None else torch.as_tensor(labels)
        if ids.dim() == 1:
            ids, labels = ids[None], labels[None]
        x, y = ids[:, :-1], labels[:, 1:]
    if x.dim() != 2 or x.shape != y.shape or x.dtype not in (torch.int32, torch.int64) or x.shape[1] < 2:
        raise ConfigError(
            f"the held-out batch must be token ids of shape (sequences, positions ≥ 2), got "
            f"{tuple(x.shape)} of {x.dtype}"
        )
    return x.long(), y.long()


def _first_rows(data: Iterable, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` sequences of an iterable of batches or rows, as one batch."""
    xs, ys = [], []
    for item in data:
        x, y = _as_xy(item)
        xs.append(x)
        ys.append(y)
        if sum(len(t) for t in xs) >= n:
            break
    if not xs:
        raise ConfigError("the monitor's data= yielded nothing; pass a non-empty held-out set")
    if len({t.shape[1] for t in xs}) > 1:
        raise ConfigError("the held-out rows differ in length; pass batch= with sequences of one length")
    return torch.cat(xs)[:n], torch.cat(ys)[:n]


@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """The model in eval mode inside, and afterwards as it was: each module in its own mode, and under FSDP2 its
    sharded parameters registered again. A forward without a backward leaves FSDP2's root holding the unsharded
    ones (it reshards after the backward), which an optimizer built next would update as copies."""
    try:
        with evaluating(module):
            yield
    finally:
        fsdp = sys.modules.get("torch.distributed.fsdp")  # none to reshard before fully_shard imports it
        for m in module.modules() if fsdp is not None else ():
            if isinstance(m, fsdp.FSDPModule):
                m.reshard()
