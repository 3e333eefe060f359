"""Runs arranged for the report: which settings vary, one panel per model size and one curve per setting (its
seeds pooled), loss grids over two settings, and the words that name a setting."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from smallinit.study.running.runs import Run
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
    return f"{v:g}" if isinstance(v, float) else str(v)


def setting(run: Run, keys: Sequence[str]) -> str:
    return ", ".join(f"{short_key(k)}={value(run.config.get(k))}" for k in keys)


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
