"""transformers' ``Trainer`` measured along training, and γ-initialised models for ``Trainer(model_init=…)``.

    from smallinit.integrations.hf import model_init, watch

    trainer = Trainer(model_init=model_init(config, gamma=1.0, norm_eps=1e-12), args=args,
                      train_dataset=train, eval_dataset=held_out)
    watch(trainer, every=50)          # records under args.output_dir/smallinit; scalars through trainer.log
    trainer.train()

The monitor measures at ``state.global_step``, which counts optimizer steps: gradient accumulation and
evaluations add none, and a run resumed from a Trainer checkpoint continues its records from that step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from smallinit.errors import ConfigError
from smallinit.init import gamma_init_, set_norm_eps_
from smallinit.integrations._engine import engine
from smallinit.monitor import Monitor, scalars

transformers = engine("transformers", "hf", "smallinit.integrations.hf")

OUT = "smallinit"  # the monitor's folder inside args.output_dir


def model_init(
    config: Any, *, gamma: float = 1.0, norm_eps: float | None = 1e-12, seed: int = 0
) -> Callable[..., torch.nn.Module]:
    """A ``Trainer(model_init=…)`` function: the causal LM of ``config`` with every matrix drawn by the γ rule
    (seeded, so each call gives the same weights) and every norm's ε set to ``norm_eps`` (None: kept)."""

    def build(trial: Any = None) -> torch.nn.Module:
        model = transformers.AutoModelForCausalLM.from_config(config)
        gamma_init_(model, gamma, generator=torch.Generator().manual_seed(seed))
        if norm_eps is not None:
            set_norm_eps_(model, norm_eps)
        return model

    build.settings = {"model.gamma": gamma, **({"model.norm_eps": norm_eps} if norm_eps is not None else {})}
    return build


class SmallinitCallback(transformers.TrainerCallback):
    """The Monitor inside a ``Trainer``; made and added by :func:`watch`, which gives it the trainer whose
    ``log`` carries the scalars to whatever ``report_to`` names."""

    def __init__(self, trainer: Any, **monitor: Any):
        self.trainer, self.kwargs = trainer, monitor
        self.monitor: Monitor | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        kw = dict(self.kwargs)
        if "batch" not in kw and "data" not in kw:
            kw["batch"] = self._eval_batch()
        kw.setdefault("settings", getattr(self.trainer.model_init, "settings", None))
        self.monitor = Monitor(
            model,
            out=Path(args.output_dir) / OUT,
            total_steps=state.max_steps,
            start_step=state.global_step,
            engine="transformers",
            **kw,
        )
        if state.global_step == 0:
            self._measure(0)

    def on_step_end(self, args, state, control, **kwargs):
        self._measure(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is not None:
            self.monitor.close()

    def _measure(self, step: int) -> None:
        record = self.monitor(step)
        if record is not None:
            self.trainer.log(scalars(record))

    def _eval_batch(self) -> dict[str, torch.Tensor]:
        if self.trainer.eval_dataset is None:
            raise ConfigError(
                "smallinit's monitor needs held-out text: give the Trainer an eval_dataset, or pass "
                "watch(trainer, batch=TOKEN_IDS) or data=ROWS"
            )
        batch = next(iter(self.trainer.get_eval_dataloader()))
        mask = batch.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise ConfigError(
                "the Trainer's first eval batch is padded, and the monitor measures whole sequences; "
                "pass watch(trainer, batch=TOKEN_IDS) with sequences of one length"
            )
        return batch


def watch(trainer: Any, **monitor: Any) -> SmallinitCallback:
    """Measure ``trainer``'s model along its training: the Monitor's keywords (every, batch, data, norm_every,
    …); without batch/data, the first batch of its eval_dataset. Call before ``trainer.train()``."""
    callback = SmallinitCallback(trainer, **monitor)
    trainer.add_callback(callback)
    return callback
