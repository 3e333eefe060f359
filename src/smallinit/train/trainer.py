"""The training loop: AdamW, schedules, accumulation, evaluation, checkpoints and exact resume.

Exact resume rests on three facts: the batch of step s is a pure function of (seed, s) (data.batching), the
model and optimizer are restored bit for bit from safetensors (whole, or a distributed run's shards, on any
number of ranks), and nothing else draws random numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from smallinit import io
from smallinit.config import Config, TrainConfig
from smallinit.data import load_data, load_tokenizer
from smallinit.errors import CheckpointError, ConfigError, Preempted, TrainingError
from smallinit.model import Transformer
from smallinit.monitor.lock import RunLock
from smallinit.monitor.metrics import append_record, read_metrics, set_aside_metrics, truncate_metrics
from smallinit.monitor.records import NONFINITE, EvalRecord, StepRecord, parse_record
from smallinit.signals import stop_requests
from smallinit.train import checkpoint as ckpt
from smallinit.train import compiling
from smallinit.train.callbacks import AnalysisCallback, Callback, Progress
from smallinit.train.distributed import (
    Runtime,
    any_rank,
    check_layout,
    clip_grad_norm_,
    eval_pieces,
    gradient_sync,
    mean_over_ranks,
    on_main,
    parallelize,
    sum_over_ranks,
    tied_aliases,
    with_layout_of,
)
from smallinit.train.loggers import metric_loggers
from smallinit.train.memory import check_fits
from smallinit.train.moe_log import RouterLog, has_moe
from smallinit.train.optim import (
    OPTIMIZER_FILE,
    build_optimizer,
    first_changed_lr,
    lr_at,
    optimizer_split,
    set_lr,
    wsd_decay_start,
)
from smallinit.train.sharded import load_sharded, save_sharded

log = logging.getLogger("smallinit")
# How to continue a stopped run, when a sweep, recipe or demo started it (their runner sets it for each cell):
# the user continues the whole command, not the cell.
CONTINUE_ENV = "SMALLINIT_CONTINUE"


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16}[precision]


class Trainer:
    def __init__(
        self,
        cfg: Config,
        run_dir: str | Path,
        *,
        resume: bool = False,
        callbacks: list[Callback] | None = None,
        runtime: Runtime | None = None,
    ):
        self.run_dir = Path(run_dir)
        tc = cfg.train
        if tc.threads:
            torch.set_num_threads(tc.threads)

        self.tokenizer = load_tokenizer(cfg.data.tokenizer)
        cfg.model.vocab_size = self.tokenizer.vocab_size  # the tokenizer defines the vocabulary
        self.cfg = cfg.validate()
        if tc.steps < tc.warmup_steps:
            log.warning(
                f"train.steps={tc.steps} is shorter than train.warmup_steps={tc.warmup_steps}: the run ends "
                f"during warmup at learning rate {lr_at(tc.steps - 1, tc):.2g}, not the peak {tc.lr:.2g}, "
                "and never decays; raise train.steps or lower train.warmup_steps"
            )
        self.restored: ckpt.Checkpoint | None = None  # the checkpoint a resumed run continues from
        self.steps_before: int | None = None  # train.steps of that checkpoint, when this call changed it
        # after validation, so bad input fails on every rank alike before any process group exists
        self.runtime = runtime or Runtime.from_env(tc)
        check_layout(tc, self.runtime.world_size)
        self.callbacks = (
            ([Progress()] if self.runtime.is_main else []) if callbacks is None else list(callbacks)
        )
        loggers = metric_loggers(tc)  # TensorBoard / W&B; a missing package fails on every rank, early
        self.callbacks += loggers if self.runtime.is_main else []
        self.amp_dtype = autocast_dtype(tc.precision, self.runtime.device)
        check_fits(self.cfg, self.runtime.device, self.runtime.world_size, self.amp_dtype)
        self._lock: RunLock | None = None  # rank 0's, from here until fit returns (or close)
        on_main(self.runtime, lambda: self._lock_run_dir(resume))  # one rank reads and writes the run folder
        try:
            self._open(cfg, resume)
        except BaseException:
            self.close(failed=True)
            raise

    def _open(self, cfg: Config, resume: bool) -> None:
        tc = cfg.train
        self.init_source: ckpt.Checkpoint | None = None  # train.init_from, resolved
        if tc.init_from and not resume:  # config.json names the exact checkpoint, even if that run goes on
            self.init_source = on_main(self.runtime, lambda: ckpt.resolve_checkpoint(tc.init_from))
            tc.init_from = str(self.init_source.path.resolve())
        self.data = load_data(cfg.data, self.tokenizer)
        self.data.check(cfg.data.seq_len)  # before anything is written to the run folder
        repeats = self.data.repeats(tc.steps, tc.batch_size, cfg.data.seq_len, cfg.data.corpus)
        if repeats and self.runtime.is_main:
            log.warning(repeats)

        self.model = Transformer(cfg.model, seed=tc.seed).to(self.runtime.device)
        if tc.init_from and not (
            resume and on_main(self.runtime, lambda: ckpt.list_checkpoints(self.run_dir))
        ):
            self._load_initial_weights()
        if has_moe(self.model):  # expert load and router losses go to metrics.jsonl
            self.callbacks.append(RouterLog())
        if (cfg.analysis.every or cfg.analysis.norm_every) and not any(
            isinstance(cb, AnalysisCallback) for cb in self.callbacks
        ):
            self.callbacks.append(AnalysisCallback(cfg.analysis))  # the measurements the config asks for
        recorded = on_main(self.runtime, lambda: compiling.recorded_choice(self.run_dir)) if resume else None
        # config.json keeps the choice
        tc.compile = compiling.resolve(self.cfg, self.runtime.world_size, recorded)
        if tc.compile:
            self.callbacks.append(compiling.MarkWarm(self.cfg))
        self.engine: torch.nn.Module = parallelize(self.model, self.runtime, tc)
        self.optimizer = build_optimizer(self.model, tc)
        self.names = {id(p): n for n, p in self.model.named_parameters()}
        self.split = optimizer_split(self.model, tc)  # the banner shows it
        if not resume and self.runtime.is_main:  # written only once the inputs and the model proved usable
            io.write_json_atomic(self.run_dir / "config.json", self.cfg.to_dict())  # nothing to keep yet
            # which optimizer holds each parameter: config.json holds the config alone, so it lies beside it
            io.write_json_atomic(self.run_dir / OPTIMIZER_FILE, self.split)
        self.step, self.skipped = 0, 0
        if resume:
            self._restore()

    # -- run folder ---------------------------------------------------------------------------------------

    def _lock_run_dir(self, resume: bool) -> None:
        """Take the run folder's lock, then check what it holds; a refused check gives the lock back."""
        if resume and not (self.run_dir / "config.json").is_file():
            raise _not_a_run(self.run_dir)  # before the lock, which would make the folder
        self._lock = RunLock.take(self.run_dir)
        try:
            self._check_run_dir(resume)
        except BaseException:
            self.close(failed=True)
            raise

    def close(self, *, failed: bool = False) -> None:
        """Give up the run folder's lock (fit does, when it returns or raises); ``failed``: this trainer never
        started, so a folder it made only for the lock is removed."""
        if self._lock is not None:
            self._lock.release(failed=failed)
            self._lock = None

    def _check_run_dir(self, resume: bool) -> None:
        config_file = self.run_dir / "config.json"
        if resume:
            if not config_file.is_file():
                raise _not_a_run(self.run_dir)
            saved = io.read_json(config_file)
            if saved is None:
                raise CheckpointError(f"{config_file} is not valid JSON; the run folder is damaged")
            saved = Config.from_dict(saved).to_dict()  # keys added since the run was made take their defaults
            diff = _first_difference(saved, _as_planned(self.cfg.to_dict(), saved))
            if diff:
                raise ConfigError(
                    f"--resume: {diff}; resume with the run's own config (omit --config/--preset; --set may "
                    "change train.steps and the layout keys only)"
                )
            return
        if config_file.exists() or ckpt.list_checkpoints(self.run_dir):
            raise ConfigError(
                f"run folder {self.run_dir} already holds a run; pass --resume to continue it or choose another --out"
            )

    def _restore(self) -> None:
        rt = self.runtime  # ranks verify a checkpoint's files between them (load_sharded)
        found = on_main(rt, lambda: ckpt.newest_checkpoint(self.run_dir, verify=not rt.is_distributed))
        if found is None:  # killed before the first checkpoint: start over, with a fresh log and the new plan
            if self.runtime.is_main:
                earlier = set_aside_metrics(self.run_dir, ckpt.kept(self.run_dir))
                log.warning(
                    f"--resume: {self.run_dir} has no checkpoint yet, so training starts again from step 0"
                    + (f"; the earlier attempt's log is kept as {earlier}" if earlier else "")
                )
                self._write_config()
            return
        planned = Config.from_dict(found.state["config"])
        ckpt.check_config(
            found, _as_planned(self.cfg.to_dict(), planned.to_dict()), self.run_dir / "config.json"
        )
        if planned.train.steps != self.cfg.train.steps:
            self._check_new_length(planned.train, found.step)
            self.steps_before = planned.train.steps
        if rt.is_distributed:  # every rank reads the slices it holds
            load_sharded(self.model, self.optimizer, self.names, rt, found)
        else:
            ckpt.load_state(self.model, self.optimizer, self.names, found)
        self.step, self.skipped = found.step, int(found.state.get("skipped", 0))
        self.restored = found
        if self.runtime.is_main:
            truncate_metrics(self.run_dir, self.step)
            if self.steps_before is not None:  # the run's new length; metrics.jsonl keeps the old one
                self._write_config()
                self.log(
                    {
                        "step": self.step,
                        "event": "steps",
                        "before": self.steps_before,
                        "after": self.cfg.train.steps,
                    }
                )

    def _write_config(self) -> None:
        io.write_json_atomic(self.run_dir / "config.json", self.cfg.to_dict(), kept=ckpt.kept(self.run_dir))

    def _check_new_length(self, planned: TrainConfig, step: int) -> None:
        """A run may resume with another train.steps only if its steps so far keep their learning rates."""
        new = self.cfg.train
        how = (
            f"start a new run from its weights instead (fresh optimizer and warmup): smallinit train "
            f"--out NEW_RUN --init-from {self.run_dir} --set train.steps={max(1, new.steps - step)}"
        )
        if new.steps < step:
            raise ConfigError(
                f"--resume: train.steps={new.steps} is below step {step}, which the run has reached; "
                f"pass train.steps ≥ {step}"
            )
        changed = first_changed_lr(planned, new, step)
        if changed is None:
            return
        why = {
            "cosine": "a cosine schedule decays over all the steps, so its length is fixed once it leaves warmup",
            "wsd": f"a WSD run changes length only while its newest checkpoint is before the decay (step "
            f"{wsd_decay_start(planned)})",
        }.get(planned.schedule, "its schedule depends on train.steps")
        raise ConfigError(
            f"--resume cannot change train.steps from {planned.steps} to {new.steps}: step {changed} was trained at "
            f"learning rate {lr_at(changed, planned):.3g}, the new schedule gives it {lr_at(changed, new):.3g} "
            f"({why}); {how}"
        )

    def _load_initial_weights(self) -> None:
        """train.init_from: this run starts from another run's weights (its optimizer state is not taken)."""
        if self.init_source is None:  # resumed before its first checkpoint
            self.init_source = on_main(
                self.runtime, lambda: ckpt.resolve_checkpoint(self.cfg.train.init_from)
            )
        source = self.init_source
        theirs = Config.from_dict(source.state["config"])
        if load_tokenizer(theirs.data.tokenizer).fingerprint != self.tokenizer.fingerprint:
            raise ConfigError(
                f"train.init_from={source.path} was trained with data.tokenizer="
                f"{theirs.data.tokenizer!r}, this run uses {self.cfg.data.tokenizer!r}; use the same one"
            )
        try:
            ckpt.load_weights(self.model, source)
        except CheckpointError as e:
            diff = _first_difference(theirs.to_dict()["model"], self.cfg.to_dict()["model"], "model")
            raise ConfigError(
                f"train.init_from: {diff or e}; a run starts from the weights of a model of the same "
                "shape (omit --config/--preset to take that run's model)"
            ) from None

    def save(self) -> Path:
        """Checkpoint this step: one process writes whole tensors, the ranks of a distributed run their shards."""
        state = {"config": self.cfg.to_dict(), "aliases": tied_aliases(self.model), "skipped": self.skipped}
        keep = self.cfg.train.keep_checkpoints
        if self.runtime.is_distributed:
            return save_sharded(
                self.run_dir, self.step, self.model, self.optimizer, state, self.runtime, keep=keep
            )
        tensors, _ = ckpt.split_aliases(self.model.state_dict())
        optim = ckpt.optimizer_tensors(self.optimizer, self.names)
        return ckpt.save_checkpoint(self.run_dir, self.step, tensors, optim, state, keep=keep)

    def log(self, record: dict[str, Any]) -> None:
        """Append a record to metrics.jsonl and pass it to the callbacks' on_log (main process only)."""
        if self.runtime.is_main:
            append_record(self.run_dir, record, ckpt.kept(self.run_dir))
            for cb in self.callbacks:
                cb.on_log(self, record)

    # -- the loop -------------------------------------------------------------------------------------------

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.runtime.device.type, dtype=self.amp_dtype)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss of the validation batches; each batch is split over ranks and micro-batches."""
        self.engine.eval()
        tc, rt = self.cfg.train, self.runtime
        sums, rows = [], []
        for x, y in self.data.eval_batches(tc.batch_size, self.cfg.data.seq_len, tc.eval_batches):
            total = torch.zeros((), device=rt.device)
            for xp, yp, n in eval_pieces(x, y, rt, tc.grad_accum):
                with self.autocast():
                    loss = self.engine(xp.to(rt.device), yp.to(rt.device)).loss.float()
                if n:
                    total += loss * n
            sums.append(total)
            rows.append(x.shape[0])
        self.engine.train()
        per_batch = sum_over_ranks(torch.stack(sums), rt) / torch.tensor(rows, device=rt.device)
        return per_batch.mean().item()

    def train_step(self) -> dict[str, Any]:
        """One optimizer step over the global batch of this step; returns its record."""
        tc, d, rt = self.cfg.train, self.cfg.data, self.runtime
        lr = set_lr(self.optimizer, self.step, tc)
        x, y = self.data.batch(
            tc.batch_size, d.seq_len, tc.seed, self.step, rank=rt.rank, world_size=rt.world_size
        )
        x, y = x.to(rt.device), y.to(rt.device)
        loss_sum = torch.zeros((), device=rt.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(tc.grad_accum), y.chunk(tc.grad_accum))):
            with gradient_sync(self.engine, i == tc.grad_accum - 1):  # reduce gradients once per step
                with self.autocast():
                    out = self.engine(xm, ym)
                    loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
                (loss / tc.grad_accum).backward()
            loss_sum += out.loss.detach()
        grad_norm = clip_grad_norm_(self.model, tc.grad_clip or math.inf)  # the global norm, on every rank
        loss_value = mean_over_ranks(loss_sum, rt).item() / tc.grad_accum
        finite = math.isfinite(loss_value) and math.isfinite(grad_norm.item())
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        record = StepRecord(self.step, loss_value, lr, grad_norm.item()).to_dict()
        if not finite:
            self._nonfinite(record)
        return record

    def _nonfinite(self, record: dict[str, Any]) -> None:
        self.skipped += 1
        self.log({**record, "event": NONFINITE})
        last = ckpt.latest_checkpoint(self.run_dir)
        where = f"the last good checkpoint is {last.path}" if last else "no checkpoint was written yet"
        if self.cfg.train.nonfinite == "stop" or self.skipped > self.cfg.train.max_skips:
            raise TrainingError(
                f"non-finite loss or gradient at step {record['step']} (loss {record['loss']}); {where}; "
                "lower train.lr, or set train.nonfinite=skip to skip such batches"
            )

    @property
    def finished(self) -> bool:
        """Whether the run already reached train.steps (a resumed finished run: fit would train nothing)."""
        return self.step >= self.cfg.train.steps

    @property
    def lengthens(self) -> bool:
        """Whether ``--resume`` with a larger train.steps may continue this run: every step taken keeps its
        learning rate (a constant schedule, a WSD run before its decay, a cosine run still in warmup)."""
        longer = dataclasses.replace(self.cfg.train, steps=self.cfg.train.steps + 1)
        return first_changed_lr(self.cfg.train, longer, self.step) is None

    def fit(self) -> dict[str, Any]:
        """Train to ``train.steps``. On SIGTERM/SIGINT: finish the step, checkpoint, raise Preempted. The run
        folder's lock is given up when fit returns or raises."""
        try:
            return self._fit()
        finally:
            self.close()

    def _fit(self) -> dict[str, Any]:
        tc = self.cfg.train
        tokens_per_step = tc.batch_size * self.cfg.data.seq_len
        for cb in self.callbacks:
            cb.on_train_start(self)
        # a resumed run measured its checkpoint's step before it stopped
        if self.step == 0 and tc.evaluates(0):
            self._eval_and_log()
        t_last, step_last = time.perf_counter(), self.step
        # the newest measured value, so a resumed run's summary keeps it (read_metrics skips torn lines)
        val_loss = (
            next(
                (
                    r.val_loss
                    for r in map(parse_record, reversed(read_metrics(self.run_dir)))
                    if isinstance(r, EvalRecord)
                ),
                None,
            )
            if self.runtime.is_main
            else None
        )
        with stop_requests() as stop:
            while self.step < tc.steps:
                record = self.train_step()
                if self.step % tc.log_every == 0 or self.step == tc.steps:
                    now = time.perf_counter()
                    record["tokens_per_s"] = (
                        tokens_per_step * (self.step - step_last) / max(now - t_last, 1e-9)
                    )
                    t_last, step_last = now, self.step
                    self.log(record)
                else:
                    record["tokens_per_s"] = float("nan")
                for cb in self.callbacks:
                    cb.on_step_end(self, record)
                if tc.evaluates(self.step):
                    val_loss = self._eval_and_log()
                if (tc.checkpoint_every and self.step % tc.checkpoint_every == 0) or self.step == tc.steps:
                    self.save()
                elif self.stop_requested(stop):
                    self.save()
                    path = ckpt.checkpoint_dir(self.run_dir, self.step)
                    how = os.environ.get(CONTINUE_ENV) or f"smallinit train --out {self.run_dir} --resume"
                    raise Preempted(
                        f"stopped by {stop[0] if stop else 'a signal to another rank'} at step "
                        f"{self.step}, checkpoint {path}; to continue: {how}"
                    )
        for cb in self.callbacks:
            cb.on_train_end(self)
        summary = {
            "step": self.step,
            "val_loss": val_loss,
            "skipped": self.skipped,
            "params": self.model.num_params(),
            "params_active": self.model.num_params(active=True),
            "params_nonembed": self.model.num_params(embeddings=False),
        }
        if self.runtime.is_main:
            io.write_json_atomic(self.run_dir / "summary.json", summary, kept=ckpt.kept(self.run_dir))
        return summary

    def stop_requested(self, stop: list[str]) -> bool:
        """Whether a stop signal arrived on any rank (all ranks agree, so they save at the same step)."""
        return any_rank(bool(stop), self.runtime)

    def _eval_and_log(self) -> float:
        val = self.evaluate()
        record = EvalRecord(self.step, val).to_dict()
        self.log(record)
        for cb in self.callbacks:
            cb.on_eval(self, record)
        return val


def _not_a_run(run_dir: Path) -> CheckpointError:
    return CheckpointError(f"{run_dir} is not a run folder (no config.json); drop --resume")


def _as_planned(config: dict, planned: dict) -> dict:
    """``config`` with the layout keys and train.steps of ``planned``: what must match to resume ``planned``."""
    config = with_layout_of(config, planned)
    return {**config, "train": {**config["train"], "steps": planned["train"]["steps"]}}


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
            if d:
                return d
        return None
    return None if a == b else f"the run has {prefix}={a!r}, this call has {b!r}"
