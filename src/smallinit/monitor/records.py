"""The records of RUN/metrics.jsonl as types: the one place their schema is written down.

The trainer and the monitor build these and write their ``to_dict()``; whatever reads a run parses each
line once with :func:`parse_record` and reads attributes. Reading is tolerant of older files (a field they
lack reads as None or empty) but never guesses: a line of an event kind not typed here (``steps``, ``moe``,
one a later version adds) parses to None and is skipped, not read as another kind.

    {"step", "loss", "lr", "grad_norm", "tokens_per_s"}     StepRecord: a logged training step
    {"event": "nonfinite", "step", "loss", ...}              StepRecord(nonfinite=True): the step went non-finite
    {"step", "val_loss"}                                     EvalRecord: a held-out evaluation
    {"event": "analysis", "step", "sink", ...}               AnalysisRecord: the monitor's measurements
    {"event": "norm_factor", "step", "norm_factor"}          NormFactorRecord: the norm factors alone
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smallinit.fields import Fields, to_json

if TYPE_CHECKING:
    from smallinit.measures.activations import Activations

ANALYSIS = "analysis"
NORM_FACTOR = "norm_factor"
NONFINITE = "nonfinite"


@dataclass(frozen=True)
class StepRecord:
    """A logged training step (every ``train.log_every`` steps and the last), or, with ``nonfinite``, the step
    whose loss or gradient was not finite."""

    step: int
    loss: float
    lr: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None  # set where the step is logged, not in the non-finite record
    nonfinite: bool = False

    def to_dict(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "step": self.step,
            "loss": self.loss,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
        }
        if self.tokens_per_s is not None:
            rec["tokens_per_s"] = self.tokens_per_s
        if self.nonfinite:
            rec["event"] = NONFINITE
        return rec

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> StepRecord | None:
        f = Fields(raw, strict=False)
        step, loss = f.integer("step"), f.number("loss")
        if step is None or loss is None:
            return None
        return StepRecord(
            step,
            loss,
            f.number("lr"),
            f.number("grad_norm"),
            f.number("tokens_per_s"),
            raw.get("event") == NONFINITE,
        )


@dataclass(frozen=True)
class EvalRecord:
    """The held-out loss at one step (the trainer's evaluation, or a monitor's loss in a folder of its own)."""

    step: int
    val_loss: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.val_loss)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> EvalRecord | None:
        f = Fields(raw, strict=False)
        step, val = f.integer("step"), f.number("val_loss")
        return None if step is None or val is None else EvalRecord(step, val)


@dataclass(frozen=True)
class AnalysisRecord:
    """The monitor's measurements at one step. A measurement that did not apply to the model is empty (or None)
    and named in ``not_measured`` with why; a file written before a field existed reads it the same way."""

    step: int
    sink: tuple[float, ...] = ()  # the sink score per layer, first layer first
    sink_mean: float | None = None  # their mean
    # Sink_ε: ε → share of (layer, head) pairs above ε
    sink_share: dict[float, float] = field(default_factory=dict)
    residual_flow: float | None = None
    # norm → measured factor / ideal 1/σ, module order
    norm_factor: dict[str, float] = field(default_factory=dict)
    loss: float | None = None  # the loss on the monitor's held-out batch
    stable_rank: dict[str, float] = field(default_factory=dict)  # matrix → stable rank
    mean_abs_cos: dict[str, float] = field(default_factory=dict)  # matrix → mean |cos| between rows
    not_measured: dict[str, str] = field(default_factory=dict)  # measurement → why not

    @staticmethod
    def of(
        step: int, acts: Activations, stable_rank: dict[str, float], mean_abs_cos: dict[str, float]
    ) -> AnalysisRecord:
        """The record of the measurements at ``step``: one forward's (the sink per layer, as this file has
        always held it) and the matrices'."""
        sink = acts.sink
        return AnalysisRecord(
            step,
            sink=sink.per_layer if sink else (),
            sink_mean=sink.mean if sink else None,
            sink_share=sink.share_above if sink else {},
            residual_flow=acts.residual_flow,
            norm_factor=acts.norm_factor,
            loss=acts.loss,
            stable_rank=stable_rank,
            mean_abs_cos=mean_abs_cos,
            not_measured=acts.not_measured,
        )

    @property
    def mean_norm_factor(self) -> float | None:
        return math.fsum(self.norm_factor.values()) / len(self.norm_factor) if self.norm_factor else None

    def to_dict(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"event": ANALYSIS, "step": self.step}
        if self.sink:
            rec.update(
                sink={str(i): v for i, v in enumerate(self.sink)},
                sink_mean=self.sink_mean,
                sink_share={str(eps): v for eps, v in self.sink_share.items()},
            )
        for key in ("residual_flow", "norm_factor", "loss"):
            if getattr(self, key) not in (None, {}):
                rec[key] = getattr(self, key)
        rec.update(
            not_measured=self.not_measured, stable_rank=self.stable_rank, mean_abs_cos=self.mean_abs_cos
        )
        return rec

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> AnalysisRecord | None:
        f = Fields(raw, strict=False)
        step = f.integer("step")
        if step is None or raw.get("event") != ANALYSIS:
            return None
        sink = f.table("sink")
        layers = sorted(sink, key=int) if all(k.isdigit() for k in sink) else []  # per layer, "0", "1", …
        return AnalysisRecord(
            step,
            tuple(sink[k] for k in layers),
            f.number("sink_mean"),
            {float(eps): v for eps, v in f.table("sink_share").items()},
            f.number("residual_flow"),
            f.table("norm_factor"),
            f.number("loss"),
            f.table("stable_rank"),
            f.table("mean_abs_cos"),
            f.table("not_measured", str),
        )


@dataclass(frozen=True)
class NormFactorRecord:
    """The norm factors alone, at a step ``analysis.norm_every`` measures and ``analysis.every`` does not (or
    both: then beside the analysis record)."""

    step: int
    norm_factor: dict[str, float]  # norm → measured factor / ideal 1/σ, module order

    def to_dict(self) -> dict[str, Any]:
        return {"event": NORM_FACTOR, **to_json(self)}

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> NormFactorRecord | None:
        f = Fields(raw, strict=False)
        step = f.integer("step")
        if step is None or raw.get("event") != NORM_FACTOR:
            return None
        return NormFactorRecord(step, f.table("norm_factor"))


Record = StepRecord | EvalRecord | AnalysisRecord | NormFactorRecord
_EVENTS = {
    ANALYSIS: AnalysisRecord.from_dict,
    NORM_FACTOR: NormFactorRecord.from_dict,
    NONFINITE: StepRecord.from_dict,
}


def parse_record(raw: Mapping[str, Any]) -> Record | None:
    """The typed record of one metrics.jsonl line; None for a kind not typed here, or a line that is not one."""
    event = raw.get("event")
    if event is None:  # the trainer's own records: an evaluation, or a training step
        return EvalRecord.from_dict(raw) if "val_loss" in raw else StepRecord.from_dict(raw)
    parse = _EVENTS.get(event) if isinstance(event, str) else None
    return parse(raw) if parse else None
