"""Runs arranged for the report: which settings vary, one panel per model size and one curve per setting (its
seeds pooled), loss grids over two settings, and the words that name a setting."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from smallinit.monitor.runs import Run
from smallinit.train.distributed import LAYOUT_KEYS

_LAYOUT = {f"train.{k}" for k in LAYOUT_KEYS}


def varying_keys(runs: Sequence[Run]) -> list[str]:
    keys = sorted({k for r in runs for k in r.config})
    return [k for k in keys if distinct(runs, k) > 1]


def arm_keys(runs: Sequence[Run]) -> list[str]:
    """The varying keys that tell arms apart, for curves and grids: not how a run ran (its layout keys), which
    can differ between the seeds of one arm ("auto" compile resolves per run)."""
    return [k for k in varying_keys(runs) if k not in _LAYOUT]


def distinct(runs: Sequence[Run], key: str) -> int:
    return len({json.dumps(r.config.get(key), sort_keys=True, default=str) for r in runs})


SIZE_KEYS = (
    "model.d_model",
    "model.n_layers",
    "model.n_heads",
    "model.n_kv_heads",
    "model.d_ff",
    "model.moe.num_experts",
    "model.moe.top_k",
)
SHORT_KEYS = {"model.gamma": "γ", "model.norm_eps": "ε"}


def short_key(key: str) -> str:
    return SHORT_KEYS.get(key, key.rsplit(".", 1)[-1])


def value(v: Any) -> str:
    """A setting's value as a reader writes it: 1e-5, not 1e-05."""
    return (
        re.sub(r"e([+-])0*(\d)", lambda m: f"e{m[1].replace('+', '')}{m[2]}", f"{v:g}")
        if isinstance(v, float)
        else str(v)
    )


# A setting in the words a legend uses: "γ = 0.5", "no gate", "4 layers"; a key not named here as "name = value".
WORDS = {
    "model.gamma": lambda v: f"γ = {value(v)}",
    "model.norm_eps": lambda v: f"ε = {value(v)}",
    "model.gate": lambda v: "no gate" if v in (None, "none") else f"{v} gate",
    "model.d_model": lambda v: f"d = {v}",
    "model.n_layers": lambda v: f"{v} layers",
    "model.n_heads": lambda v: f"{v} heads",
    "model.n_kv_heads": lambda v: f"{v} kv heads",
    "model.moe.num_experts": lambda v: f"{v} experts",
    "model.moe.top_k": lambda v: f"top-{v}",
    "train.lr": lambda v: f"lr = {value(v)}",
    "train.seed": lambda v: f"seed {v}",
}
EMULATED = "model.norm_eps_width"  # ε scaled so a model this wide saturates as one of that width would


def describe(config: dict[str, Any], keys: Sequence[str]) -> str:
    """The settings ``keys`` of ``config`` in words, for a legend or a title. An unset value says so ("steps
    unset"), and ε emulating a wider model's saturation is named as such ("emulated ε = 1e-5 (d = 2048)")."""
    words = []
    for k in keys:
        v = config.get(k)
        if k == EMULATED:
            if v:
                eps = config.get("model.norm_eps") if "model.norm_eps" in keys else None
                words.append(f"emulated ε{f' = {value(eps)}' if eps is not None else ''} (d = {v})")
            elif "model.norm_eps" not in keys:
                words.append("ε not emulated")
        elif k == "model.norm_eps" and config.get(EMULATED) and EMULATED in keys:
            continue  # named with its emulation
        elif v is None:
            words.append(f"{short_key(k)} unset")
        else:
            words.append(WORDS[k](v) if k in WORDS else f"{short_key(k)} = {value(v)}")
    return ", ".join(words)


def setting(run: Run, keys: Sequence[str]) -> str:
    return describe(run.config, keys)


@dataclass
class Groups:
    """Runs arranged for a figure: one panel per model size (when sizes vary), one curve per setting within
    it, its seeds pooled. A curve's label names only the keys that differ between the curves of a panel; a
    panel's title only the fewest size keys that tell the panels apart."""

    panels: dict[str, dict[str, list[Run]]]  # panel title → curve label → runs (its seeds)
    legend_title: str

    @staticmethod
    def of(runs: Sequence[Run], vary: Sequence[str]) -> Groups:
        keys = [k for k in vary if k != "train.seed"]
        size_keys = [k for k in SIZE_KEYS if k in keys]
        by_size: dict[str, list[Run]] = {}
        for r in runs:
            by_size.setdefault(json.dumps([r.config.get(k) for k in size_keys], default=str), []).append(r)
        curve_keys = [
            k for k in keys if k not in size_keys and any(distinct(g, k) > 1 for g in by_size.values())
        ]
        title_keys = distinguishing(list(by_size.values()), size_keys)
        panels: dict[str, dict[str, list[Run]]] = {}
        for group in by_size.values():
            curves = panels.setdefault(setting(group[0], title_keys), {})
            for r in group:
                curves.setdefault(setting(r, curve_keys) or "all runs", []).append(r)
        seeds = sorted({len(c) for curves in panels.values() for c in curves.values()})
        counts = "/".join(map(str, seeds))
        title = ", ".join(map(short_key, curve_keys))
        return Groups(
            panels, f"{title}{'; ' if title else ''}{counts} seed{'s' if seeds != [1] else ''} each"
        )

    def items(self) -> Iterable[tuple[str, str, list[Run]]]:
        """(panel, curve, runs) for every curve."""
        for panel, curves in self.panels.items():
            for curve, group in curves.items():
                yield panel, curve, group

    @staticmethod
    def name(panel: str, curve: str) -> str:
        return f"{panel} · {curve}" if panel else curve


def _grid(runs: Sequence[Run], row_key: str, col_key: str) -> tuple[np.ndarray, list, list] | None:
    rows = sorted({r.config.get(row_key) for r in runs}, key=str)
    cols = sorted({r.config.get(col_key) for r in runs}, key=str)
    if len(rows) < 2 or len(cols) < 2:
        return None
    vals = np.full((len(rows), len(cols)), np.nan)
    for i, rv in enumerate(rows):
        for j, cv in enumerate(cols):
            losses = [
                r.val_loss
                for r in runs
                if r.config.get(row_key) == rv and r.config.get(col_key) == cv and r.val_loss is not None
            ]
            if losses:
                vals[i, j] = statistics.fmean(losses)
    return vals, rows, cols


def distinguishing(
    groups: Sequence[Sequence[Run]], keys: Sequence[str], named: Sequence[str] = ()
) -> list[str]:
    """``named`` and the fewest of ``keys``, in order, whose values tell the groups apart with them (d_ff and the
    head counts usually follow d_model, the step counts a size: they are named only when they add to it)."""
    chosen: list[str] = list(named)
    for k in keys:
        if len({setting(g[0], chosen) for g in groups}) == len(groups):
            break
        if len({setting(g[0], [*chosen, k]) for g in groups}) > len({setting(g[0], chosen) for g in groups}):
            chosen.append(k)
    return chosen


def changing_with(runs: Sequence[Run], key: str, others: Sequence[str]) -> list[str]:
    """The keys among ``others`` that never share a value between runs with different values of ``key``."""
    by_value: dict[str, list[Run]] = {}
    for r in runs:
        by_value.setdefault(json.dumps(r.config.get(key), default=str), []).append(r)
    value_sets = [
        [{json.dumps(r.config.get(k), default=str) for r in g} for g in by_value.values()] for k in others
    ]
    return [
        k
        for k, sets in zip(others, value_sets)
        if all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1 :])
    ]


def grids(runs: Sequence[Run], vary: Sequence[str], row_key: str, col_key: str) -> dict[str, tuple]:
    """One ``row_key × col_key`` grid of final losses per combination of the other keys that vary (seeds
    pooled: a cell is the mean over seeds), so no cell averages runs that differ in a setting the grid does
    not show: {title naming that combination: (values, rows, cols)}, only where both axes take two values."""
    others = [k for k in vary if k not in (row_key, col_key, "train.seed")]
    by_other: dict[str, list[Run]] = {}
    for r in runs:
        by_other.setdefault(json.dumps([r.config.get(k) for k in others], default=str), []).append(r)
    groups = list(by_other.values())
    named = [k for k in SIZE_KEYS if k in others] + [k for k in others if k not in SIZE_KEYS]
    title_keys = distinguishing(groups, named)
    out = {}
    for group in groups:
        g = _grid(group, row_key, col_key)
        if g is not None:
            out[setting(group[0], title_keys)] = g
    return out
