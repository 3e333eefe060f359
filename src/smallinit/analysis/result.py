"""The result of ``smallinit analyze`` (analysis.json) as a type: the one place its schema is written down.

:func:`smallinit.analysis.measure.analyze_model` and ``analyze_checkpoint`` build an :class:`AnalysisResult`,
``write_analysis`` writes its ``to_dict()``, and the report and the CLI read attributes. Reading is tolerant of
files written before a field existed (it reads as None or empty) but never guesses: a file that holds no
matrices and none of the activation measurements is not an analysis (ValueError), and a field of the wrong
kind raises TypeError rather than reading as something else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from smallinit.config import Config
from smallinit.fields import Fields, to_json
from smallinit.measures.condensation import MatrixStat

MEASURED = ("sink", "residual_flow", "norm_factor")  # an analysis has matrices and at least one of these


@dataclass(frozen=True)
class SinkResult:
    """Attention on the first token (smallinit.measures.sink), averaged over the analysed batches."""

    per_layer: tuple[float, ...]  # the sink score per layer, first layer first
    per_head: tuple[tuple[float, ...], ...] = ()  # per layer, that layer's heads
    mean: float | None = None  # over layers
    layers: tuple[str, ...] = ()  # the attention modules, in order
    uniform: float | None = None  # the score uniform attention would give, averaged over layers
    uniform_per_layer: tuple[float, ...] = ()  # the same per layer, from each layer's own mask
    # Sink_ε: ε → share of (layer, head) pairs above ε
    share_above: dict[float, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> SinkResult:
        f = Fields(raw, strict=True, where="sink.")
        return SinkResult(
            per_layer=f.numbers("per_layer"),
            per_head=f.rows("per_head"),
            mean=f.number("mean"),
            layers=tuple(str(n) for n in raw.get("layers") or ()),
            uniform=f.number("uniform"),
            uniform_per_layer=f.numbers("uniform_per_layer"),
            share_above={float(eps): v for eps, v in f.table("share_above").items()},
        )


def _matrix(raw: Any) -> MatrixStat:
    if not isinstance(raw, Mapping):
        raise TypeError(f"a matrix is {raw!r}, not a table")
    f = Fields(raw, strict=True)
    shape = tuple(int(n) for n in raw["shape"])
    return MatrixStat(
        str(raw["name"]), shape, f.number("stable_rank", required=True), f.number("mean_abs_cos")
    )


@dataclass(frozen=True)
class AnalysisResult:
    """One model measured on held-out text. A measurement that does not apply to the model is None (or empty)
    and named in ``not_measured`` with why. A smallinit run's result has ``step``, ``config`` and
    ``norm_factor_analytic``; a Hugging Face model's has ``hf_config`` (and ``note``: which folder of a Trainer
    output_dir); ``analyze_model`` alone fills neither, nor ``checkpoint`` and ``data``."""

    sink: SinkResult | None = None
    residual_flow: float | None = None  # ‖h_L − e‖/‖e‖
    # norm → measured factor / ideal 1/σ, module order
    norm_factor: dict[str, float] = field(default_factory=dict)
    loss: float | None = None  # nats/token
    not_measured: dict[str, str] = field(default_factory=dict)  # measurement → why not
    notes: tuple[str, ...] = ()  # how a measurement was obtained where it is not the usual way
    tokens: int | None = None  # how many were measured
    seq_len: int | None = None  # the sink's uniform reference depends on it
    matrices: tuple[MatrixStat, ...] = ()  # stable rank and mean |cos| of rows per weight matrix
    matrices_left_out: dict[str, str] = field(default_factory=dict)  # parameter → why it has no statistic
    checkpoint: str | None = None  # the folder measured
    step: int | None = None
    config: dict[str, Any] | None = None  # the run's resolved config, as written (run_config parses it)
    hf_config: dict[str, Any] | None = None
    data: str | None = None  # which text it was measured on
    note: str | None = None
    norm_factor_analytic: float | None = None  # the factor this config gives at initialisation

    @property
    def run_config(self) -> Config | None:
        return Config.from_dict(self.config) if self.config is not None else None

    def to_dict(self) -> dict[str, Any]:
        """analysis.json, in the order it has always been written: where the model came from, the measurements,
        then the analytic factor."""
        out: dict[str, Any] = {}
        for key in ("checkpoint", "step", "config", "hf_config", "data", "note"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.sink is not None:
            out["sink"] = self.sink.to_dict()
        if self.residual_flow is not None:
            out["residual_flow"] = self.residual_flow
        if self.norm_factor:
            out["norm_factor"] = self.norm_factor
        if self.loss is not None:
            out["loss"] = self.loss
        out["not_measured"] = self.not_measured
        if self.notes:
            out["notes"] = list(self.notes)
        out.update(
            tokens=self.tokens,
            seq_len=self.seq_len,
            matrices=[m.to_dict() for m in self.matrices],
            matrices_left_out=self.matrices_left_out,
        )
        if self.norm_factor_analytic is not None:
            out["norm_factor_analytic"] = self.norm_factor_analytic
        return out

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> AnalysisResult:
        if "matrices" not in raw or not any(k in raw for k in MEASURED):
            raise ValueError("not an analysis: it has no matrices, or none of " + ", ".join(MEASURED))
        mats = raw["matrices"]
        if not isinstance(mats, Sequence):
            raise TypeError(f"matrices is {mats!r}, not a list")
        notes = raw.get("notes") or ()
        for key in ("config", "hf_config"):
            if raw.get(key) is not None and not isinstance(raw[key], Mapping):
                raise TypeError(f"{key} is {raw[key]!r}, not a table")
        f = Fields(raw, strict=True)
        return AnalysisResult(
            sink=SinkResult.from_dict(raw["sink"]) if raw.get("sink") else None,  # an empty one is none
            residual_flow=f.number("residual_flow"),
            norm_factor=f.table("norm_factor"),
            loss=f.number("loss"),
            not_measured=f.table("not_measured", str),
            notes=tuple(str(n) for n in notes),
            tokens=f.integer("tokens"),
            seq_len=f.integer("seq_len"),
            matrices=tuple(_matrix(m) for m in mats),
            matrices_left_out=f.table("matrices_left_out", str),
            checkpoint=f.text("checkpoint"),
            step=f.integer("step"),
            config=raw.get("config"),
            hf_config=raw.get("hf_config"),
            data=f.text("data"),
            note=None if raw.get("note") is None else str(raw["note"]),
            norm_factor_analytic=f.number("norm_factor_analytic"),
        )
