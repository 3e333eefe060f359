"""All activation measurements of one model from one forward pass, through its adapter, as one type:
:class:`Activations`, which the Monitor's record (``smallinit.monitor.records.AnalysisRecord``) and the saved
model's result (``smallinit.analysis.result.AnalysisResult``) both hold. A new measurement is a field here and
a line in :func:`measure_activations`; both records then carry it.

Reading is strict: a field of the wrong kind raises TypeError rather than reading as something else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from smallinit.adapters import as_adapter
from smallinit.fields import Fields, to_json
from smallinit.measures.norm_factor import norm_factors_from_observed
from smallinit.measures.residual_flow import flow_from_hidden
from smallinit.measures.sink import sink_from_attention

# the observation each measurement is made from
MEASURED_FROM = {"sink": "attention", "residual_flow": "residual", "norm_factor": "norms"}


@dataclass(frozen=True)
class SinkResult:
    """Attention on the first token (smallinit.measures.sink), averaged over the measured batches."""

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


@dataclass(frozen=True)
class Activations:
    """What one forward shows of a model. A measurement that does not apply to the model is None (or empty)
    and named in ``not_measured`` with why, in one line (``"norm_factor:NAME"`` for one norm); ``notes`` says
    how a measurement was obtained where it is not the usual way (h_L taken as the last layer's output,
    attention read from eager probabilities)."""

    sink: SinkResult | None = None
    residual_flow: float | None = None  # ‖h_L − e‖/‖e‖
    norm_factor: dict[str, float] = field(default_factory=dict)  # norm → measured factor / ideal 1/σ
    loss: float | None = None  # nats/token, where targets were given
    not_measured: dict[str, str] = field(default_factory=dict)  # measurement → why not
    notes: tuple[str, ...] = ()

    def measurements(self) -> dict[str, Any]:
        """The measurements as analysis.json writes them: those that apply, then what did not and the notes."""
        out: dict[str, Any] = {}
        if self.sink is not None:
            out["sink"] = self.sink.to_dict()
        for key in ("residual_flow", "norm_factor", "loss"):
            if getattr(self, key) not in (None, {}):
                out[key] = getattr(self, key)
        out["not_measured"] = self.not_measured
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @staticmethod
    def fields_from(raw: Mapping[str, Any]) -> dict[str, Any]:
        """The measurement fields of a record that holds them as :meth:`measurements` wrote them."""
        f = Fields(raw, strict=True)
        return dict(
            sink=SinkResult.from_dict(raw["sink"]) if raw.get("sink") else None,  # an empty one is none
            residual_flow=f.number("residual_flow"),
            norm_factor=f.table("norm_factor"),
            loss=f.number("loss"),
            not_measured=f.table("not_measured", str),
            notes=tuple(str(n) for n in raw.get("notes") or ()),
        )

    @staticmethod
    def mean(batches: Sequence[Activations]) -> Activations:
        """The measurements averaged over ``batches`` (equal-sized batches weigh equally): a norm one batch did
        not reach is the mean over those that did; what did not apply, and the notes, are their union."""
        mean = _mean_dicts(
            [
                {k: v for k, v in b.measurements().items() if k not in ("not_measured", "notes")}
                for b in batches
            ]
        )
        not_measured = {k: v for b in batches for k, v in b.not_measured.items()}
        notes = dict.fromkeys(n for b in batches for n in b.notes)
        return Activations(
            **Activations.fields_from({**mean, "not_measured": not_measured, "notes": list(notes)})
        )


def _mean_dicts(items: list[Any]) -> Any:
    """Element-wise mean of nested dicts / lists of numbers; a key missing from some batches is the mean over
    those that have it, and ragged rows (heads per layer) are averaged row by row."""
    first = items[0]
    if isinstance(first, dict):
        return {
            k: _mean_dicts([it[k] for it in items if k in it])
            for k in dict.fromkeys(k for it in items for k in it)
        }
    if isinstance(first, list) and first and isinstance(first[0], str):
        return first  # names, the same in every batch
    if isinstance(first, list) and first and isinstance(first[0], list):
        return [_mean_dicts([it[i] for it in items]) for i in range(len(first))]
    return np.mean(np.asarray(items, dtype=float), axis=0).tolist()


@torch.no_grad()
def measure_activations(
    model, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, chunk: int = 256
) -> Activations:
    """Sink scores, residual flow and measured norm factors of ``model`` (any model an adapter reads) on
    ``tokens`` (one forward; with ``targets`` also the loss). Each measurement stands on its own: one that
    does not apply to the model (no softmax attention, no decoder layers to read the residual stream at, a
    norm that cannot be run) is None or empty and named in ``not_measured``."""
    adapter = as_adapter(model)
    out = adapter.observe(tokens, targets, kinds=tuple(MEASURED_FROM.values()))
    not_measured = {key: out.missing[kind] for key, kind in MEASURED_FROM.items() if kind in out.missing}
    sink = flow = None
    if "sink" not in not_measured:
        if out.attention:
            sink = SinkResult.from_dict(sink_from_attention(out.attention, chunk=chunk).to_dict())
        else:
            not_measured["sink"] = (
                f"no softmax attention: {type(adapter.module).__name__} made no attention call"
            )
    if "residual_flow" not in not_measured:
        if out.residual:
            flow = flow_from_hidden(out.residual)
        else:
            not_measured["residual_flow"] = (
                f"the adapter of {type(adapter.module).__name__} observed no residual stream"
            )
    factors, unmeasured = norm_factors_from_observed(adapter, out)
    if not factors and "norm_factor" not in not_measured and not unmeasured:
        not_measured["norm_factor"] = "no norm layer ran in the forward"
    not_measured.update({f"norm_factor:{name}": why for name, why in unmeasured.items()})
    return Activations(
        sink=sink,
        residual_flow=flow,
        norm_factor=factors,
        loss=None if out.loss is None else out.loss.item(),
        not_measured=not_measured,
        notes=tuple(f"{key}: {out.notes[kind]}" for key, kind in MEASURED_FROM.items() if kind in out.notes),
    )
