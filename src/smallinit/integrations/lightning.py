"""A Lightning ``Callback`` measuring the model along training.

    from smallinit.integrations.lightning import SmallinitCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[SmallinitCallback(every=50)])
    trainer.fit(module, train_loader, val_loader)   # records under default_root_dir/smallinit

The measured model is the LightningModule itself when an adapter is made for it (a smallinit Transformer or a
Hugging Face causal LM), else its attribute ``model`` (or the one named by ``attr``), read from its own
forward when it has no adapter of its own. Steps are
``trainer.global_step`` (optimizer steps: accumulation adds none); scalars go to every logger of the trainer.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import nn

from smallinit.adapters import has_own_adapter
from smallinit.errors import ConfigError
from smallinit.integrations._engine import engine
from smallinit.monitor import Monitor, scalars

L = engine("lightning.pytorch", "lightning", "smallinit.integrations.lightning")

OUT = "smallinit"  # the monitor's folder inside the trainer's default_root_dir


class SmallinitCallback(L.Callback):
    """``SmallinitCallback(every=N, batch=… | data=…, attr="model", …)``: the Monitor's keywords; without batch
    or data, the first batch of the validation dataloader."""

    def __init__(self, *, attr: str = "model", **monitor: Any):
        self.attr, self.kwargs = attr, monitor
        self.monitor: Monitor | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        kw = dict(self.kwargs)
        if "batch" not in kw and "data" not in kw:
            loaders = trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
            if loader is None:
                raise ConfigError(
                    "smallinit's monitor needs held-out text: pass a val dataloader to fit, or "
                    "SmallinitCallback(batch=TOKEN_IDS) or data=ROWS"
                )
            kw["batch"] = next(iter(loader))
        estimated = trainer.estimated_stepping_batches  # inf when neither max_steps nor max_epochs bounds it
        total = (
            trainer.max_steps
            if trainer.max_steps > 0
            else (int(estimated) if math.isfinite(estimated) else None)
        )
        self.monitor = Monitor(
            self._model(pl_module),
            out=Path(trainer.default_root_dir) / OUT,
            total_steps=total,
            start_step=trainer.global_step,
            engine="lightning",
            **kw,
        )
        if trainer.global_step == 0:
            self._measure(trainer, 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._measure(trainer, trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.monitor is not None:
            self.monitor.close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.on_train_end(trainer, pl_module)

    def _measure(self, trainer, step: int) -> None:
        record = self.monitor(step)
        if record is not None:
            for logger in trainer.loggers:
                logger.log_metrics(scalars(record), step=step)

    def _model(self, pl_module):
        """The model the monitor reads: the LightningModule or its ``attr`` where one of them has an adapter
        made for it, else the ``attr`` module (read from its own forward), else the LightningModule."""
        held = getattr(pl_module, self.attr, None)
        for candidate in (pl_module, held):
            if candidate is not None and has_own_adapter(candidate):
                return candidate
        return held if isinstance(held, nn.Module) else pl_module
