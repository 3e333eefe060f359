"""Callbacks observe training; the trainer calls them, they never change what it computes."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

import torch

from smallinit.config import AnalysisConfig
from smallinit.errors import ConfigError
from smallinit.monitor import Monitor
from smallinit.train.checkpoint import kept
from smallinit.train.optim import describe_split, steady_rms

if TYPE_CHECKING:
    from smallinit.train.trainer import Trainer


class Callback:
    """Observes training: override the hooks you need. Hooks run on every rank, in the order the callbacks
    were appended; ``trainer.runtime.is_main`` tells the main process, the only one that writes."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Once per ``fit``, before the first step (after a resume restored its checkpoint, ``trainer.step``
        is that checkpoint's step) and before the step-0 evaluation."""

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After every optimizer step, before that step's evaluation and checkpoint; ``record`` holds the
        step, loss, lr and grad norm (``tokens_per_s`` is nan on steps that are not logged)."""

    def on_eval(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After every evaluation (``{"step", "val_loss"}``), including the one at step 0 and the last."""

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After ``trainer.log`` appended ``record`` to metrics.jsonl (main process only)."""

    def on_train_end(self, trainer: Trainer) -> None:
        """Once, after the last step's evaluation and checkpoint; not when a stop signal ended the run."""


class Progress(Callback):
    """A start-up banner, then one line per logged step (step, loss, lr, tokens/s, ETA) and one per evaluation
    (the validation loss, shown only where it was measured)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr

    def on_train_start(self, trainer: Trainer) -> None:
        self.t0, self.step0 = time.perf_counter(), trainer.step
        print("\n".join(banner(trainer)), file=self.stream, flush=True)

    def on_eval(self, trainer: Trainer, record: dict[str, Any]) -> None:
        print(
            f"step {record['step']}/{trainer.cfg.train.steps} | val {record['val_loss']:.4f}",
            file=self.stream,
            flush=True,
        )

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        step, total = record["step"], trainer.cfg.train.steps
        if step % trainer.cfg.train.log_every and step != total:
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(1, step - self.step0) * (total - step)
        print(
            f"step {step}/{total} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
            f"{record['tokens_per_s']:,.0f} tok/s | ETA {format_hms(eta)}",
            file=self.stream,
            flush=True,
        )


def banner(trainer: Trainer) -> list[str]:
    """What a run is about to do: the model, the token budget, the data, where it runs and where it writes."""
    cfg, model = trainer.cfg, trainer.model
    params, nonembed = model.num_params(), model.num_params(embeddings=False)
    active = model.num_params(active=True)
    tokens = cfg.train.steps * cfg.train.batch_size * cfg.data.seq_len
    precision = (
        "fp32" if trainer.amp_dtype is None else f"{str(trainer.amp_dtype).removeprefix('torch.')} autocast"
    )
    layout = f", {cfg.train.parallel}" if cfg.train.parallel != "none" else ""
    threads = torch.get_num_threads()
    lines = [
        f"run folder {trainer.run_dir}",
        f"model: {params:,} parameters ({nonembed:,} without embeddings"
        + (f", {active:,} active per token)" if active != params else ")"),
        f"plan: {cfg.train.steps:,} steps × {cfg.train.batch_size} sequences × {cfg.data.seq_len} tokens = "
        f"{tokens:,} tokens, {tokens / params:.2f} per parameter, {tokens / nonembed:.2f} per non-embedding parameter",
        f"data: corpus {cfg.data.corpus} ({trainer.data.describe()}), tokenizer {cfg.data.tokenizer} "
        f"(vocab {trainer.tokenizer.vocab_size:,})",
        f"device: {trainer.runtime.device}, {precision}, {threads} thread{'s' if threads > 1 else ''}, "
        f"{trainer.runtime.world_size} process{'es' if trainer.runtime.world_size > 1 else ''}{layout}",
    ]
    if cfg.train.optimizer != "adamw":
        lines.append(describe_split(trainer.split))
    if trainer.init_source is not None and trainer.restored is None:
        lines.append(
            f"weights from {trainer.init_source.path} (its step {trainer.init_source.step}); "
            "fresh optimizer, step 0"
        )
    if trainer.restored is not None:
        lines.append(f"resumed from step {trainer.restored.step} ({trainer.restored.path})")
    if trainer.steps_before is not None:
        lines.append(f"train.steps changed from {trainer.steps_before:,} to {cfg.train.steps:,}")
    return lines


def format_hms(seconds: float) -> str:
    """H:MM:SS, for elapsed times and ETAs."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class AnalysisCallback(Callback):
    """smallinit's Trainer measured by a :class:`Monitor`; attached by the Trainer itself when
    ``analysis.every`` or ``analysis.norm_every`` is set, so the CLI and the Python API cannot differ."""

    def __init__(self, cfg: AnalysisConfig | None = None, **fields: Any):
        self.cfg = dataclasses.replace(cfg or AnalysisConfig(), **fields)
        self.cfg.validate()
        if self.cfg.every < 1 and self.cfg.norm_every < 1:
            raise ConfigError(
                f"the analysis callback needs analysis.every or analysis.norm_every ≥ 1, got "
                f"{self.cfg.every} and {self.cfg.norm_every}"
            )
        self.monitor: Monitor | None = None

    def on_train_start(self, trainer: Trainer) -> None:
        batch = next(iter(trainer.data.eval_batches(self.cfg.batch_size, trainer.cfg.data.seq_len, 1)))
        self.monitor = Monitor(
            trainer.model,
            self.cfg,
            batch=batch,
            out=trainer.run_dir,
            log=trainer.log,
            total_steps=trainer.cfg.train.steps,
            start_step=trainer.step,
            guard=not trainer.cfg.model.norm_eps_width,  # ε emulation saturates on purpose
            kept=kept(trainer.run_dir),
            steady_rms=steady_rms(trainer.model, trainer.optimizer, trainer.cfg.train),
        )
        if trainer.step == 0:
            self.monitor(0)

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.monitor(trainer.step)
