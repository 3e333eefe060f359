"""The records of RUN/metrics.jsonl as types: the one place their schema is written down.

The trainer and the monitor build these and write their ``to_dict()``; whatever reads a run parses each
line once with :func:`parse_record` and reads attributes. Reading is tolerant of older files (a field they
lack reads as None or empty) but never guesses: a line of an event kind not typed here (``steps``, ``moe``,
one a later version adds) parses to None and is skipped, not read as another kind.

    {"step", "loss", "lr", "grad_norm", "tokens_per_s"}     StepRecord: a logged training step
    {"event": "nonfinite", "step", "loss", ...}              StepRecord(nonfinite=True): the step went non-finite
    {"step", "val_loss"}                                     EvalRecord: a held-out evaluation
    {"event": "analysis", "step", "sink", ..., "matrices"}   AnalysisRecord: Activations at a step, matrices
    {"event": "norm_factor", "step", "norm_factor"}          NormFactorRecord: the norm factors alone
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from smallinit.fields import Fields, from_json, to_json
from smallinit.measures.activations import Activations
from smallinit.measures.condensation import MatrixStat

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


@dataclass(frozen=True, kw_only=True)
class AnalysisRecord(Activations):
    """The monitor's measurements at one step: one forward's (:class:`Activations`, every field of it) and the
    matrices'. A measurement that did not apply to the model is empty (or None) and named in ``not_measured``
    with why; a file written before a field existed reads it the same way, and a file of the layout before
    records held :class:`Activations` whole (the sink per layer as {"0": …}, stable ranks as a table) still
    reads."""

    step: int
    matrices: tuple[MatrixStat, ...] = ()  # stable rank and mean |cos| of rows per weight matrix

    def by_matrix(self, stat: str) -> dict[str, float]:
        """One statistic ("stable_rank", "mean_abs_cos") of every matrix that has it, by name."""
        return {m.name: v for m in self.matrices if (v := getattr(m, stat)) is not None}

    @property
    def mean_norm_factor(self) -> float | None:
        return math.fsum(self.norm_factor.values()) / len(self.norm_factor) if self.norm_factor else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": ANALYSIS,
            "step": self.step,
            **self.measurements(),
            "matrices": [m.to_dict() for m in self.matrices],
        }

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> AnalysisRecord | None:
        if not isinstance(raw.get("step"), int) or raw.get("event") != ANALYSIS:
            return None
        return from_json(AnalysisRecord, _current_layout(raw), strict=False)


def _current_layout(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """An analysis line as this version writes it: older files held the sink per layer as {"0": s0, …} beside
    sink_mean and sink_share, and the matrices as stable_rank and mean_abs_cos tables."""
    out, sink, ranks = dict(raw), raw.get("sink"), raw.get("stable_rank")
    if isinstance(sink, Mapping) and sink and all(str(k).isdigit() for k in sink):
        out["sink"] = {
            "per_layer": [sink[k] for k in sorted(sink, key=int)],
            "mean": raw.get("sink_mean"),
            "share_above": raw.get("sink_share"),
        }
    if isinstance(ranks, Mapping) and "matrices" not in raw:
        cos = raw.get("mean_abs_cos") if isinstance(raw.get("mean_abs_cos"), Mapping) else {}
        out["matrices"] = [
            {"name": n, "shape": [], "stable_rank": v, "mean_abs_cos": cos.get(n)} for n, v in ranks.items()
        ]
    return out


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
