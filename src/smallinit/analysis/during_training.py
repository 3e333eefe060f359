"""Measurements during training: a callback that observes the model every N steps.

Every ``every`` steps (and once at the start of a fresh run) it measures, on a fixed held-out batch (the
first validation windows): sink score per layer, residual flow, measured RMSNorm factors, and stable rank
and mean |cos| of the chosen matrices. One record per measurement goes to metrics.jsonl
(``{"event": "analysis", "step": ...}``); row-cosine heatmaps of a few matrices are saved at a few steps
as RUN/analysis/rowcos_step_NNNNNNN.npz (float16, one array per matrix) so condensation can be plotted
over training. Enabled by ``analysis.every > 0``; ``smallinit train`` attaches it.

``analysis.norm_every > 0`` adds the RMSNorm factors alone, every N steps (one forward of the same batch,
``{"event": "norm_factor", "step": ..., "norm_factor": {norm: factor}}``; also at every full measurement), so
the share of training the norms spend saturated can be timed finely (``smallinit.analysis.saturation``).

It runs on the main process only, in eval mode without gradients, and restores train mode; it never
changes what the trainer computes. Under FSDP (sharded weights) it does nothing and says so once.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..config import AnalysisConfig
from ..errors import ConfigError
from ..io import write_atomic
from ..measures.condensation import named_matrices, row_cosine, sampled_mean_abs_cos, stable_rank
from ..measures.norm_factor import measured_norm_factors
from ..train.callbacks import Callback
from ..train.checkpoint import kept
from .measure import measure_activations

if TYPE_CHECKING:
    from ..train.trainer import Trainer

SNAPSHOT_DIR = "analysis"
COS_ROWS = 512  # rows sampled for the logged mean |cos| of large matrices


def snapshot_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR / f"rowcos_step_{step:07d}.npz"


class AnalysisCallback(Callback):
    """``AnalysisCallback(cfg.analysis)``, or fields directly: ``AnalysisCallback(every=50, snapshots=3)``."""

    def __init__(self, cfg: AnalysisConfig | None = None, **fields: Any):
        cfg = dataclasses.replace(cfg or AnalysisConfig(), **fields)
        cfg.validate()
        if cfg.every < 1 and cfg.norm_every < 1:
            raise ConfigError(f"the analysis callback needs analysis.every or analysis.norm_every ≥ 1, got "
                              f"{cfg.every} and {cfg.norm_every}")
        self.cfg = cfg
        self.batch: torch.Tensor | None = None
        self.snapshot_steps: set[int] = set()
        self.active = True

    def on_train_start(self, trainer: Trainer) -> None:
        self.active = trainer.runtime.is_main and trainer.cfg.train.parallel != "fsdp"
        if trainer.runtime.is_main and not self.active:
            logging.getLogger("smallinit").warning("analysis.every is ignored under FSDP (the weights are sharded)")
        if not self.active:
            return
        d = trainer.cfg.data
        x, _ = next(iter(trainer.data.eval_batches(self.cfg.batch_size, d.seq_len, 1)))
        self.batch = x.to(trainer.runtime.device)
        total, every, n = trainer.cfg.train.steps, self.cfg.every, self.cfg.snapshots
        if every:
            measured = list(range(0, total + 1, every))
            # each snapshot at the first measurement at or after its evenly spaced target step
            targets = [round(i * total / (n - 1)) for i in range(n)] if n > 1 else [0] * n
            self.snapshot_steps = {next((s for s in measured if s >= t), measured[-1]) for t in targets}
        if trainer.step == 0:
            self._at_step(trainer)

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if self.active:
            self._at_step(trainer)

    def _at_step(self, trainer: Trainer) -> None:
        every, norm_every, step = self.cfg.every, self.cfg.norm_every, trainer.step
        factors = self.measure(trainer)["norm_factor"] if every and step % every == 0 else None
        if norm_every and step % norm_every == 0:
            self.measure_norms(trainer, factors)

    @torch.no_grad()
    def measure_norms(self, trainer: Trainer, factors: dict[str, float] | None = None) -> dict[str, Any]:
        """The RMSNorm factors alone (``factors`` when the full measurement of this step already has them)."""
        if factors is None:
            model = trainer.model
            was_training = model.training
            model.eval()
            try:
                factors = measured_norm_factors(model, self.batch)
            finally:
                model.train(was_training)
        rec = {"event": "norm_factor", "step": trainer.step, "norm_factor": factors}
        trainer.log(rec)
        return rec

    @torch.no_grad()
    def measure(self, trainer: Trainer) -> dict[str, Any]:
        model = trainer.model
        was_training = model.training
        model.eval()
        try:
            acts = measure_activations(model, self.batch)
            mats = named_matrices(model, self.cfg.matrices)
            rec: dict[str, Any] = {
                "event": "analysis", "step": trainer.step,
                "sink": {str(i): v for i, v in enumerate(acts["sink"]["per_layer"])},
                "sink_mean": acts["sink"]["mean"],
                "sink_share": acts["sink"]["share_above"],
                "residual_flow": acts["residual_flow"],
                "norm_factor": acts["norm_factor"],
                "stable_rank": {n: stable_rank(W) for n, W in mats.items()},
                "mean_abs_cos": {n: sampled_mean_abs_cos(W, max_rows=COS_ROWS) for n, W in mats.items()},
            }
            if trainer.step in self.snapshot_steps:
                self._snapshot(trainer, model)
        finally:
            model.train(was_training)
        trainer.log(rec)
        return rec

    def _snapshot(self, trainer: Trainer, model: torch.nn.Module) -> None:
        arrays = {}
        for name, W in named_matrices(model, self.cfg.heatmaps).items():
            rc = row_cosine(W, max_rows=self.cfg.heatmap_rows)
            arrays[name] = rc.matrix.astype(np.float16)
            arrays[f"{name}/stable_rank"] = np.float64(stable_rank(W))
            arrays[f"{name}/mean_abs_cos"] = np.float64(rc.mean_abs)
        if not arrays:
            return
        path = snapshot_path(trainer.run_dir, trainer.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: np.savez(f, step=np.int64(trainer.step), **arrays), kept=kept(trainer.run_dir))


def load_snapshots(run_dir: str | Path) -> list[dict[str, Any]]:
    """The heatmap snapshots of a run, oldest first: ``{"step", "matrices": {name: array}, "stable_rank":
    {name: float}, "mean_abs_cos": {name: float}}``."""
    out = []
    for path in sorted((Path(run_dir) / SNAPSHOT_DIR).glob("rowcos_step_*.npz")):
        with np.load(path) as z:
            snap: dict[str, Any] = {"step": int(z["step"]), "matrices": {}, "stable_rank": {}, "mean_abs_cos": {}}
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
