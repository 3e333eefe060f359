"""How far a session of cells has come, and the time it has left."""

from __future__ import annotations

import statistics
import time

from smallinit.config import Config
from smallinit.model import Transformer
from smallinit.train.callbacks import format_hms


def cell_work(cfg: Config) -> float:
    """A cell's training compute in parameter-tokens (parameters × steps × tokens per step), its weight in an
    ETA: a cell of a larger or longer-trained model counts for what it costs."""
    return (
        float(Transformer.count_params(cfg.model)[0])
        * cfg.train.steps
        * cfg.train.batch_size
        * cfg.data.seq_len
    )


class SweepProgress:
    """How far a session of cells has come (one sweep, or every sweep of a recipe) and the time it has left.

    ``work`` maps each cell to run (by key) to its ``cell_work``. A cell's time is modelled as a fixed overhead
    (start-up, evaluation, checkpoints) plus its compute at a rate, both measured on the cells that finished:
    the overhead weighs most in short cells, the compute in long ones. The ETA scales the time since
    the session started by the modelled time left over the time done (which also accounts for cells run side by
    side), counting the logged share of the steps of cells still running.
    """

    def __init__(self, label: str, work: dict[str, float], *, after: str = ""):
        self.label, self.after = label, after
        self.left = dict(work)
        self.total, self.finished, self.wall_done = len(work), 0, 0.0
        self.timed: list[tuple[float, float, float]] = []  # (work, wall s, training s) of each finished cell
        self.t0 = time.monotonic()

    def drop(self, key: str) -> None:
        """A cell that will not run in this session after all (it finished or failed before)."""
        if self.left.pop(key, None) is not None:
            self.total -= 1

    def finish(self, key: str, wall_s: float, train_s: float | None) -> None:
        """A cell ended after ``wall_s`` seconds, ``train_s`` of them in training steps (None: unknown)."""
        if key in self.left:
            work = self.left.pop(key)
            self.finished += 1
            self.wall_done += wall_s
            if train_s:
                self.timed.append((work, wall_s, min(train_s, wall_s)))

    def cell_seconds(self, work: float) -> float:
        """Modelled seconds of one cell of this much work (needs a timed cell)."""
        overhead = statistics.fmean(wall - train for _, wall, train in self.timed)
        rate = sum(w for w, _, _ in self.timed) / max(sum(t for _, _, t in self.timed), 1e-9)
        return overhead + work / rate

    def eta(self, in_flight: dict[str, float] | None = None) -> float | None:
        """Seconds left; ``in_flight`` maps running cells to the fraction of their steps done. None until a cell
        has finished with its training time known."""
        if not self.timed:
            return None
        partial = sum(
            self.cell_seconds(self.left[k]) * f for k, f in (in_flight or {}).items() if k in self.left
        )
        left = sum(self.cell_seconds(w) for w in self.left.values()) - partial
        return (time.monotonic() - self.t0) * left / max(self.wall_done + partial, 1e-9)

    def line(self, in_flight: dict[str, float] | None = None) -> str:
        eta = self.eta(in_flight)
        return (
            f"[{self.label}] {self.finished}/{self.total} runs | elapsed {format_hms(time.monotonic() - self.t0)} | "
            f"ETA {'?' if eta is None else format_hms(eta)}{self.after}"
        )
