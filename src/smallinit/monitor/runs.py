"""Finished run folders, read back: the resolved config, the metric records and the summary.

What the claims and the HTML report see of the runs they look at (config.json, metrics.jsonl,
summary.json). A folder a Monitor wrote beside another engine's training (monitor.json in place of
config.json) reads as a run too, its config holding what the monitor knew of the model. Unreadable files
read as empty (a run still being written, or a line torn by a kill), never as an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path, PurePath
from typing import Any

from smallinit.config import Config, emulated_eps, flatten, set_dotted
from smallinit.io import read_json
from smallinit.model import Transformer
from smallinit.monitor.metrics import METRICS_FILE, read_metrics
from smallinit.monitor.monitor import MONITOR_FILE
from smallinit.monitor.records import (
    AnalysisRecord,
    EvalRecord,
    NormFactorRecord,
    Record,
    StepRecord,
    parse_record,
)


@dataclass
class Run:
    """A run folder: ``config`` is flat ("model.gamma" → 1.0), the selections' keys, and ``cfg`` the same as a
    Config; metrics.jsonl is read when first asked for and parsed once into its records' types
    (smallinit.monitor.records): ``evals``, ``train_log``, ``nonfinite``, ``analysis``, ``norm_records``."""

    path: Path
    name: str
    config: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)  # empty until the run finished
    error: str = ""  # why the run failed, where its sweep recorded a failure
    monitored: bool = False  # a Monitor's folder beside another engine's training: its config is no Config
    engine_folder: str = ""  # a monitored run's name for itself: the engine's folder it sits in, not its own
    planned = (
        False  # a cell of a plan (smallinit.study.planning.decidability.PlannedRun): its outcomes are unknown
    )

    @staticmethod
    def load(path: str | Path, name: str | None = None) -> Run | None:
        """The run in ``path``, or None if it holds no readable config.json (nor a monitor's monitor.json)."""
        path = Path(path)
        raw = read_json(path / "config.json")
        if isinstance(raw, dict) and isinstance(raw.get("model"), dict):
            config, monitored = flatten(raw), False
            config.setdefault("model.norm_eps_width", 0)  # runs written before ε emulation existed
        elif isinstance(known := read_json(path / MONITOR_FILE), dict) and isinstance(
            known.get("model"), dict
        ):
            batch = known.get("batch") or [None, None]  # the held-out batch: its length is what was measured
            config = {
                **flatten({"model": known["model"]}),
                "train.steps": known.get("total_steps"),
                "data.seq_len": batch[-1],
                "analysis.batch_size": batch[0],
                "engine": known.get("engine"),
                **(known.get("settings") or {}),
            }
            monitored = True
        else:
            return None
        summary = read_json(path / "summary.json")
        own = known.get("name") if monitored else None
        run = Run(
            path,
            path.name,
            config,
            summary if isinstance(summary, dict) else {},
            monitored=monitored,
            engine_folder=own if isinstance(own, str) else "",
        )
        return run.named(name or path.name)

    def named(self, relative: str) -> Run:
        """This run named by its path from a folder above it; a monitored run by its engine's folder in place
        of the monitor's subfolder (a Trainer's output_dir, not ``smallinit``)."""
        if self.engine_folder:
            relative = str(PurePath(relative).parent / self.engine_folder)
        return replace(self, name=relative)

    @property
    def norm_eps(self) -> float | None:
        """The ε the run's norms used: ``model.norm_eps``, scaled by ``model.norm_eps_width`` where the run
        emulates a wider model's saturation (smallinit.config.emulated_eps); None where the config lacks it."""
        c = self.config
        if not all(
            isinstance(c.get(k), (int, float)) for k in ("model.norm_eps", "model.d_model", "model.gamma")
        ):
            return None
        return emulated_eps(
            float(c["model.norm_eps"]),
            int(c.get("model.norm_eps_width") or 0),
            int(c["model.d_model"]),
            float(c["model.gamma"]),
        )

    @cached_property
    def cfg(self) -> Config | None:
        """The run's resolved config; None for a monitored folder, whose config holds what the monitor knew."""
        return None if self.monitored else config_from_flat(self.config)

    @cached_property
    def metrics(self) -> list[dict[str, Any]]:
        """The lines of metrics.jsonl as written (the typed views below are parsed from these)."""
        return read_metrics(self.path)

    @cached_property
    def _records(self) -> list[Record]:
        return [rec for rec in map(parse_record, self.metrics) if rec is not None]

    @cached_property
    def evals(self) -> list[EvalRecord]:
        """The held-out evaluations, as logged."""
        return [r for r in self._records if isinstance(r, EvalRecord)]

    @cached_property
    def train_log(self) -> list[StepRecord]:
        """The logged training steps (not the non-finite ones), as logged."""
        return [r for r in self._records if isinstance(r, StepRecord) and not r.nonfinite]

    @cached_property
    def nonfinite(self) -> list[StepRecord]:
        """The steps whose loss or gradient was not finite."""
        return [r for r in self._records if isinstance(r, StepRecord) and r.nonfinite]

    @cached_property
    def analysis(self) -> list[AnalysisRecord]:
        """The analysis callback's records, in step order."""
        return sorted((r for r in self._records if isinstance(r, AnalysisRecord)), key=lambda r: r.step)

    @cached_property
    def norm_records(self) -> list[NormFactorRecord]:
        """The norm-factor records of ``analysis.norm_every``, as logged."""
        return [r for r in self._records if isinstance(r, NormFactorRecord)]

    @cached_property
    def diverged_at(self) -> int | None:
        """The step at which the run's loss or gradient first went non-finite, if the run ended diverged: its
        final validation loss is not finite, or training stopped there (``train.nonfinite = stop``, or more
        skipped batches than ``train.max_skips``) before writing a summary. None for a run that did not diverge."""
        final = self.summary.get("val_loss")
        # a loss, or no evaluation at all
        if self.summary and not (_number(final) and not math.isfinite(final)):
            return None
        bad = [r.step for r in self.nonfinite] + [e.step for e in self.evals if not e.finite]
        if self.summary:
            return min(bad, default=int(self.summary.get("step") or 0))
        skipped = len(self.nonfinite)  # the trainer stops on the first, or
        stopped = skipped and (
            self.config.get("train.nonfinite", "stop") == "stop"  # past max_skips
            or skipped > int(self.config.get("train.max_skips", 10))
        )
        return min(bad, default=0) if stopped else None

    @property
    def lost(self) -> bool:
        """The run is not a loss to compare: it diverged, or failed (its sweep says so)."""
        return bool(self.error) or self.diverged_at is not None

    @property
    def val_loss(self) -> float | None:
        """The final validation loss: the summary's (None if not finite: the run ended diverged, and an earlier
        evaluation is not its end state), else, before the run has finished, the last one logged (None for a run
        that failed or diverged)."""
        if self.lost:
            return None
        if "val_loss" in self.summary:
            v = self.summary["val_loss"]
            return float(v) if _finite(v) else None
        vals = [e.val_loss for e in self.evals if e.finite]
        return vals[-1] if vals else None

    @cached_property
    def val_curve(self) -> list[tuple[int, float]]:
        """(step, validation loss) at every evaluation, in step order (the last one per step)."""
        return sorted({e.step: e.val_loss for e in self.evals if e.finite}.items())

    @property
    def tokens_per_step(self) -> int:
        return int(self.config.get("train.batch_size", 0)) * int(self.config.get("data.seq_len", 0))

    def tokens_per_param(self, step: int | None = None) -> float:
        """Training tokens per non-embedding parameter seen by ``step`` (default: the last step trained)."""
        step = int(self.summary.get("step", self.config.get("train.steps", 0))) if step is None else step
        return step * self.tokens_per_step / max(1, self.params_nonembed)

    @property
    def seed(self) -> int:
        return int(self.config.get("train.seed", 0))

    @property
    def size(self) -> tuple[int, int, int, int, int]:
        return model_shape(self.config)

    @cached_property
    def params_nonembed(self) -> int:
        """Parameters without the embedding (the scaling fits' N): the summary's, else counted from the config."""
        if isinstance(self.summary.get("params_nonembed"), int):
            return self.summary["params_nonembed"]
        return Transformer.count_params(Config.from_json_file(self.path / "config.json").model)[1]

    def matches(self, conditions: dict[str, Any]) -> bool:
        """Every ``key: value`` holds (floats compared to 1e-9 relative; the key "size" is the shape)."""
        for key, want in conditions.items():
            have = self.size if key == "size" else self.config.get(key)
            if isinstance(want, float) and isinstance(have, (int, float)) and not isinstance(have, bool):
                if not math.isclose(have, want, rel_tol=1e-9, abs_tol=0.0):
                    return False
            elif have != want:
                return False
        return True


def config_from_flat(keys: dict[str, Any]) -> Config:
    """The Config of a flat one ("model.gamma" → 1.0), checked as a config file is."""
    raw: dict[str, Any] = {}
    for key, value in keys.items():
        set_dotted(raw, key, value)
    return Config.from_dict(raw)


def model_shape(config: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """The model shape of a flat config, the same with or without the gate: (d_model, n_layers, n_heads, d_ff,
    experts)."""
    c = config
    return (
        int(c["model.d_model"]),
        int(c["model.n_layers"]),
        int(c["model.n_heads"]),
        int(c["model.d_ff"]),
        int(c.get("model.moe.num_experts") or 0),
    )


def find_runs(root: str | Path) -> list[Run]:
    """Every run folder (config.json or monitor.json, + metrics.jsonl) at or below ``root``, named by its
    relative path."""
    root = Path(root)
    runs = []
    for folder in sorted({f.parent for name in ("config.json", MONITOR_FILE) for f in root.rglob(name)}):
        if not (folder / METRICS_FILE).is_file():
            continue
        run = Run.load(folder, str(folder.relative_to(root)) if folder != root else folder.name)
        if run is not None:
            runs.append(run)
    return runs


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    return _number(v) and math.isfinite(v)
