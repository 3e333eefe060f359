"""Metric loggers: mirror every record the trainer writes to metrics.jsonl into TensorBoard or W&B.

Both are optional extras (``pip install 'smallinit[tensorboard]'``, ``pip install wandb``) and off by default
(``train.tensorboard``, ``train.wandb``; ``smallinit train --wandb``). A record's numbers become scalars at
its step, tagged by key; records with an ``event`` (e.g. ``moe``) are tagged ``event/key``; nested tables of
numbers are flattened with ``/``; lists and text are left to metrics.jsonl.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

from smallinit.config import TrainConfig
from smallinit.errors import ConfigError
from smallinit.train.callbacks import Callback

if TYPE_CHECKING:
    from smallinit.train.trainer import Trainer

TB_DIR = "tb"


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of a metrics record, tagged as described in the module docstring (``step`` excluded)."""
    prefix = f"{record['event']}/" if isinstance(record.get("event"), str) else ""
    out: dict[str, float] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, (int, float)):
            if math.isfinite(value):
                out[key] = float(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}/{k}", v)

    for k, v in record.items():
        if k not in ("step", "event"):
            walk(prefix + k, v)
    return out


class TensorBoardLogger(Callback):
    """Writes RUN/tb/ event files; on resume, events past the restored step are purged."""

    def __init__(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "train.tensorboard=true needs the tensorboard package; pip install 'smallinit[tensorboard]' "
                "or set train.tensorboard=false"
            ) from None
        self._writer_cls = SummaryWriter
        self.writer = None

    def on_train_start(self, trainer: Trainer) -> None:
        self.writer = self._writer_cls(
            log_dir=str(trainer.run_dir / TB_DIR), purge_step=trainer.step + 1 if trainer.step else None
        )

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=int(record.get("step", trainer.step)))

    def on_eval(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.writer.flush()  # evaluations are rare: a live TensorBoard shows them at once

    def on_train_end(self, trainer: Trainer) -> None:
        self.writer.close()
        self.writer = None


class WandbLogger(Callback):
    """Logs to Weights & Biases (project ``smallinit``, one W&B run per run folder, resumed with it)."""

    def __init__(self):
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "train.wandb needs the wandb package, which is not installed; pip install wandb"
            ) from None
        self.wandb = wandb
        self.run = None

    def on_train_start(self, trainer: Trainer) -> None:
        run_dir = trainer.run_dir.resolve()
        self.run = self.wandb.init(
            project="smallinit",
            name=run_dir.name,
            dir=str(run_dir),
            config=trainer.cfg.to_dict(),
            id=hashlib.sha256(str(run_dir).encode()).hexdigest()[:16],
            resume="allow",
        )

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log(scalars(record), step=int(record.get("step", trainer.step)))

    def on_train_end(self, trainer: Trainer) -> None:
        self.run.finish()
        self.run = None


def metric_loggers(cfg: TrainConfig) -> list[Callback]:
    """The loggers ``cfg`` asks for; a missing package is a ConfigError before anything is written."""
    loggers: list[Callback] = []
    if cfg.tensorboard:
        loggers.append(TensorBoardLogger())
    if cfg.wandb:
        loggers.append(WandbLogger())
    return loggers
