"""OLMo-core's ``Trainer``: a ``Callback`` that γ-initialises a fresh run and measures the model along it.

    from smallinit.integrations.olmo import SmallinitCallback

    trainer = TrainerConfig(save_folder=..., callbacks={"smallinit": SmallinitCallback(gamma=1.0, every=50,
                                                                                      batch=held_out)},
                            ...).build(train_module, data_loader)
    trainer.fit()                     # records under the trainer's save_folder/smallinit

At ``pre_train`` of a run that starts at step 0 (no checkpoint loaded), every matrix of the train module's
model (sharded or not) is drawn by the γ rule from the seeded generator, so every parallel layout gets the
same weights; a resumed run keeps its checkpoint's. The Monitor measures at step 0 and then at
``post_step``, on every rank (a sharded forward needs them all); its scalars go to the trainer's metrics
(``smallinit/residual_flow``, …) and so to every logger callback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from smallinit.init import gamma_init_, set_norm_eps_
from smallinit.integrations._engine import engine
from smallinit.monitor import Monitor, scalars

callbacks = engine("olmo_core.train.callbacks", "olmo", "smallinit.integrations.olmo")

OUT = "smallinit"  # the monitor's folder inside the trainer's save_folder


class SmallinitCallback(callbacks.Callback):
    """``SmallinitCallback(gamma=1.0, seed=0, norm_eps=None, every=N, batch=…, …)``: the γ of a fresh run
    (None: OLMo-core's own init is kept), the seed of its draw, every norm's ε (None: kept), and the
    Monitor's keywords (every, batch or data, norm_every, …; ``out`` defaults to save_folder/smallinit)."""

    def __init__(
        self, *, gamma: float | None = 1.0, seed: int = 0, norm_eps: float | None = None, **monitor: Any
    ):
        self.gamma, self.seed, self.norm_eps, self.monitor = gamma, seed, norm_eps, monitor
        self._watch: Monitor | None = None

    def pre_train(self) -> None:
        model, step = self.trainer.train_module.model, self.trainer.global_step
        if step == 0 and self.gamma is not None:
            gamma_init_(model, self.gamma, generator=torch.Generator().manual_seed(self.seed))
        if self.norm_eps is not None:  # ε is no parameter: a resumed run needs it set again
            set_norm_eps_(model, self.norm_eps)
        kw = dict(self.monitor)
        kw.setdefault("out", Path(self.trainer.save_folder) / OUT)
        settings = {"model.gamma": self.gamma, "model.norm_eps": self.norm_eps}
        kw.setdefault("settings", {k: v for k, v in settings.items() if v is not None})
        self._watch = Monitor(
            model, total_steps=self.trainer.max_steps, start_step=step, engine="olmo-core", **kw
        )
        if step == 0:
            self._measure(0)

    def post_step(self) -> None:
        self._measure(self.trainer.global_step)

    def post_train(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def on_error(self, exc: BaseException) -> None:
        self.post_train()

    def _measure(self, step: int) -> None:
        record = self._watch(step)
        if record is not None:
            for name, value in scalars(record).items():
                self.trainer.record_metric(name, value)
