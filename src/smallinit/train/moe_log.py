"""Expert load and router losses of MoE layers, written to metrics.jsonl (the Trainer adds this itself).

Every ``train.log_every`` steps one record ``{"step", "event": "moe", "balance_loss", "z_loss",
"max_load_ratio", "load": {layer: [fraction per expert]}}``: averages over the training forwards since the
last record, read from each MoE layer's counters (``MoE.pop_stats``). ``load`` sums to 1 per layer (uniform
is 1/E); ``max_load_ratio`` is the busiest expert's load times E over all layers (1 = perfectly balanced).
Under data parallelism the counts are those of the logging rank's share of the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from smallinit.model.moe import MoE
from smallinit.train.callbacks import Callback

if TYPE_CHECKING:
    from smallinit.train.trainer import Trainer


def has_moe(model: nn.Module) -> bool:
    return any(isinstance(m, MoE) for m in model.modules())


class RouterLog(Callback):
    def on_train_start(self, trainer: Trainer) -> None:
        self._pop(trainer)  # start counting from this run's first step

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        step, tc = record["step"], trainer.cfg.train
        if step % tc.log_every and step != tc.steps:
            return
        stats = self._pop(trainer)
        if not stats:
            return
        n = len(stats)
        trainer.log(
            {
                "step": step,
                "event": "moe",
                "balance_loss": sum(s.balance_loss for s in stats.values()) / n,
                "z_loss": sum(s.z_loss for s in stats.values()) / n,
                "max_load_ratio": max(max(s.load) * len(s.load) for s in stats.values()),
                "load": {name: [round(x, 5) for x in s.load] for name, s in stats.items()},
            }
        )

    @staticmethod
    def _pop(trainer: Trainer) -> dict:
        found = ((name, m.pop_stats()) for name, m in trainer.model.named_modules() if isinstance(m, MoE))
        return {name: s for name, s in found if s is not None}
