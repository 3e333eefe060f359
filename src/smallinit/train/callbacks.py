"""Callbacks observe training; the trainer calls them, they never change what it computes."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from .trainer import Trainer


class Callback:
    """Override what you need. on_step_end runs after every optimizer step; ``trainer.log`` writes a record."""

    def on_train_start(self, trainer: Trainer) -> None: ...

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None: ...

    def on_eval(self, trainer: Trainer, record: dict[str, Any]) -> None: ...

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """Every record ``trainer.log`` wrote to metrics.jsonl (main process only)."""

    def on_train_end(self, trainer: Trainer) -> None: ...


class Progress(Callback):
    """One line per logged step: step, loss, val loss, lr, tokens/s and ETA."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.val_loss: float | None = None

    def on_train_start(self, trainer: Trainer) -> None:
        self.t0, self.step0 = time.perf_counter(), trainer.step

    def on_eval(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.val_loss = record["val_loss"]
        if record["step"] == 0:
            print(f"step 0/{trainer.cfg.train.steps} | val {self.val_loss:.4f}", file=self.stream, flush=True)

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        step, total = record["step"], trainer.cfg.train.steps
        if step % trainer.cfg.train.log_every and step != total:
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(1, step - self.step0) * (total - step)
        val = f" | val {self.val_loss:.4f}" if self.val_loss is not None else ""
        print(
            f"step {step}/{total} | loss {record['loss']:.4f}{val} | lr {record['lr']:.2e} | "
            f"{record['tokens_per_s']:,.0f} tok/s | ETA {_hms(eta)}",
            file=self.stream, flush=True,
        )


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
