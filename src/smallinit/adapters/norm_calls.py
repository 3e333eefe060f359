"""The norms a forward calls rather than holds (smallinit.init.norm_calls: rms_norm / layer_norm calls and
written-out x·rsqrt(mean(x²) + ε) outside norm layers), put into an observation beside the norm layers: each
call site's factor at the ε the call used, and one note where calls passed no ε."""

from __future__ import annotations

from smallinit.adapters.protocol import Observed
from smallinit.init.norm_calls import NormCalls, default_eps_note


def record_norm_calls(calls: NormCalls, out: Observed) -> None:
    """The factors ``calls`` recorded, into ``out`` (``norm_factors`` by call site, ``notes["norms"]``)."""
    out.norm_factors.update(calls.factors)
    note = default_eps_note(calls.sites)
    if note:
        out.notes["norms"] = "; ".join(n for n in (out.notes.get("norms"), note) if n)


__all__ = ["NormCalls", "record_norm_calls"]
