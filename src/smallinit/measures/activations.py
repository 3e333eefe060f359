"""All activation measurements of one model from one forward pass, through its adapter, as one type:
:class:`Activations`. The Monitor's record (``smallinit.monitor.records.AnalysisRecord``) and the saved model's
result (``smallinit.analysis.result.AnalysisResult``) both extend it with their own context, and both are written
and read by one codec over the dataclass fields (smallinit.fields), so a new measurement is a module here, a
field below and a line in :func:`measure_activations`: the Monitor's metrics.jsonl, analyze's analysis.json, the
mean over batches and the readers then carry it with no further edit.

Reading is strict: a field of the wrong kind raises TypeError rather than reading as something else."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from smallinit.adapters import as_adapter
from smallinit.errors import ModelError
from smallinit.fields import plain
from smallinit.measures.attention_logits import max_attention_logits
from smallinit.measures.massive import MassiveActivations, massive_activations
from smallinit.measures.norm_factor import norm_factors_from_observed
from smallinit.measures.residual_flow import flow_from_hidden
from smallinit.measures.sink import Sink, sink_from_attention

# the observation each measurement is made from
MEASURED_FROM = {
    "sink": "attention",
    "residual_flow": "residual",
    "norm_factor": "norms",
    "max_attention_logit": "attention",
    "massive": "residual",
}


@dataclass(frozen=True)
class Activations:
    """What one forward shows of a model. A measurement that does not apply to the model is None (or empty)
    and named in ``not_measured`` with why, in one line (``"norm_factor:NAME"`` for one norm); ``notes`` says
    how a measurement was obtained where it is not the usual way (h_L taken as the last layer's output,
    attention read from eager probabilities)."""

    sink: Sink | None = None
    residual_flow: float | None = None  # ‖h_L − e‖/‖e‖
    norm_factor: dict[str, float] = field(default_factory=dict)  # norm → measured factor / ideal 1/σ
    max_attention_logit: tuple[float, ...] = ()  # per layer, the largest scale·q·k a query may see
    massive: MassiveActivations | None = None  # per layer, max |h| / median |h| and where
    loss: float | None = None  # nats/token, where targets were given
    not_measured: dict[str, str] = field(default_factory=dict)  # measurement → why not
    notes: tuple[str, ...] = ()

    def measurements(self) -> dict[str, Any]:
        """The measurements as the files hold them: those that apply, then what did not (always) and the notes."""
        written = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(Activations)}
        out = {
            k: v for k, v in written.items() if v not in (None, {}, []) and k not in ("not_measured", "notes")
        }
        out["not_measured"] = written["not_measured"]
        if written["notes"]:
            out["notes"] = written["notes"]
        return out

    @staticmethod
    def mean(batches: Sequence[Activations]) -> Activations:
        """The measurements averaged over ``batches`` (equal-sized batches weigh equally): a norm one batch did
        not reach is the mean over those that did; what did not apply, the notes, and the dimensions of massive
        activations are their union."""
        return _mean(Activations, list(batches))


def _mean(kind: Any, values: list[Any]) -> Any:
    """The mean of ``values`` of the annotated ``kind``, field by field: numbers averaged, names and reasons
    united in order of first appearance."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        present = [v for v in values if v is not None]
        return _mean(args[0], present) if present else None
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(
            **{
                f.name: _mean(hints[f.name], [getattr(v, f.name) for v in values])
                for f in dataclasses.fields(kind)
            }
        )
    if kind is float:
        return float(np.mean(values))
    origin = typing.get_origin(kind)
    if origin is dict:
        keys = dict.fromkeys(k for v in values for k in v)
        if args[1] is str:
            return {k: next(v[k] for v in values if k in v) for k in keys}
        return {k: _mean(float, [v[k] for v in values if k in v]) for k in keys}
    item = args[0]
    if item in (str, int):  # names, reasons, dimensions: united
        return tuple(dict.fromkeys(x for v in values for x in v))
    rows = max((len(v) for v in values), default=0)
    return tuple(_mean(item, [v[i] for v in values if i < len(v)]) for i in range(rows))


@contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode inside (no dropout: a measurement of the model's own forward, the same every time);
    afterwards each submodule in the mode it had (a frozen part in eval inside a model in training stays so)."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@torch.no_grad()
def measure_activations(
    model, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, chunk: int = 256
) -> Activations:
    """Every activation measurement of ``model`` (any model an adapter reads) on ``tokens`` (one forward; with
    ``targets`` also the loss). Each measurement stands on its own: one that does not apply to the model (no
    softmax attention, no decoder layers to read the residual stream at, a norm that cannot be run) is None or
    empty and named in ``not_measured``. The forward runs in eval mode (no dropout), whatever mode the model is
    in, and leaves each module in the mode it had."""
    adapter = as_adapter(model)
    with evaluating(adapter.module):
        out = adapter.observe(tokens, targets, kinds=tuple(dict.fromkeys(MEASURED_FROM.values())))
    not_measured = {key: out.missing[kind] for key, kind in MEASURED_FROM.items() if kind in out.missing}
    name = type(adapter.module).__name__
    seen = {
        "attention": out.attention or f"no softmax attention: {name} made no attention call",
        "residual": out.residual or f"the adapter of {name} observed no residual stream",
    }
    measures = {
        "sink": lambda: sink_from_attention(out.attention, chunk=chunk),
        "residual_flow": lambda: flow_from_hidden(out.residual),
        "max_attention_logit": lambda: max_attention_logits(out.attention, chunk=chunk),
        "massive": lambda: massive_activations(out.residual),
    }
    measured: dict[str, Any] = {}
    for key, measure in measures.items():
        observed = seen[MEASURED_FROM[key]]
        if key in not_measured:
            continue
        if isinstance(observed, str):
            not_measured[key] = observed
            continue
        try:
            measured[key] = measure()
        except ModelError as e:
            not_measured[key] = str(e)
    factors, unmeasured = norm_factors_from_observed(adapter, out)
    if not factors and "norm_factor" not in not_measured and not unmeasured:
        not_measured["norm_factor"] = "no norm layer ran in the forward"
    not_measured.update({f"norm_factor:{name}": why for name, why in unmeasured.items()})
    notes: dict[str, str] = {}  # one per observation, under the first measurement made from it
    for key, kind in MEASURED_FROM.items():
        if kind in out.notes:
            notes.setdefault(kind, f"{key}: {out.notes[kind]}")
    return Activations(
        **measured,
        norm_factor=factors,
        loss=None if out.loss is None else out.loss.item(),
        not_measured=not_measured,
        notes=tuple(notes.values()),
    )
