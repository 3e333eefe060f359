"""The result of ``smallinit analyze`` (analysis.json) as a type: the one place its schema is written down.

:func:`smallinit.analysis.measure.analyze_model` and ``analyze_checkpoint`` build an :class:`AnalysisResult`,
``write_analysis`` writes its ``to_dict()``, and the report and the CLI read attributes. Reading is tolerant of
files written before a field existed (it reads as None or empty) but never guesses: a file that holds no
matrices and none of the activation measurements is not an analysis (ValueError), and a field of the wrong
kind raises TypeError rather than reading as something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smallinit.config import Config
from smallinit.fields import from_json
from smallinit.measures.activations import Activations
from smallinit.measures.condensation import MatrixStat

MEASURED = (
    "sink",
    "residual_flow",
    "norm_factor",
    "max_attention_logit",
    "massive",
)  # an analysis has matrices and at least one of these


@dataclass(frozen=True)
class AnalysisResult(Activations):
    """One model measured on held-out text: the measurements of one forward (:class:`Activations`, averaged
    over the batches) and the matrices. A smallinit run's result has ``step``, ``config`` and
    ``norm_factor_analytic``; a Hugging Face model's has ``hf_config`` (and ``note``: which folder of a Trainer
    output_dir); ``analyze_model`` alone fills neither, nor ``checkpoint`` and ``data``."""

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
        out.update(self.measurements())
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
        return from_json(AnalysisResult, raw, strict=True)
