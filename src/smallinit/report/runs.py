"""The runs of a report: their table, their loss curves and the final-loss grids over γ × ε and γ × gate."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from smallinit.monitor.runs import Run
from smallinit.report import figures
from smallinit.report.arrange import Groups, changing_with, grids, short_key, value
from smallinit.report.markup import esc, h2, img, note, p, table


def status(run: Run) -> str:
    planned = run.config.get("train.steps", "?")
    if run.summary:
        return f"finished, step {run.summary.get('step', planned)}"
    # every line, typed or not: a resumed run's "steps" event is at its checkpoint, which need not be a logged step
    reached = max((m["step"] for m in run.metrics if isinstance(m.get("step"), int)), default=0)
    return f"unfinished: step {reached} of {planned}"


@dataclass(frozen=True)
class RunsSection:
    count: int
    left_out: int  # unfinished runs, not drawn
    header: list[str]
    rows: list[list[Any]]
    shared: dict[str, Any]  # the settings every run shares


def runs_section(runs: list[Run], vary: list[str], pooled: list[Run]) -> RunsSection:
    return RunsSection(
        len(runs),
        len(runs) - len(pooled),
        ["run", "final val loss", "status", *vary],
        [
            [r.name, "–" if r.val_loss is None else r.val_loss, status(r), *[r.config.get(k) for k in vary]]
            for r in runs
        ],
        {k: v for k, v in sorted(runs[0].config.items()) if k not in vary} if runs else {},
    )


def render_runs(s: RunsSection) -> list[str]:
    parts = [h2(f"Runs ({s.count})")]
    if not s.count:
        return [*parts, p("No run folders (config.json + metrics.jsonl) here.")]
    if s.left_out:
        parts.append(
            note(
                f"{s.left_out} unfinished run{'s are' if s.left_out > 1 else ' is'} left out of the figures and "
                "grids below (a loss before the end of its schedule is not a final loss); smallinit report "
                "--include-unfinished draws them too."
            )
        )
    parts.append(table(s.header, s.rows))
    parts.append(
        f"<details><summary>settings shared by every run</summary><pre>"
        f"{esc(json.dumps(s.shared, indent=1, default=str))}</pre></details>"
    )
    return parts


@dataclass(frozen=True)
class Grid:
    """Final losses over two settings, one grid per combination of the others (or why there is none)."""

    title: str
    row_key: str
    col_key: str
    found: dict[str, tuple]  # {runs with: (values, rows, cols)}
    along: list[str]  # without a grid: the settings the column key changes together with


@dataclass(frozen=True)
class LossSection:
    panels: dict[str, dict[str, dict[str, list]]]  # panel → curve → "train"/"val" → per-seed (step, loss)
    legend_title: str
    grids: list[Grid]


GRIDS = (("model.gamma", "model.norm_eps", "γ × ε"), ("model.gamma", "model.gate", "γ × gate"))


def loss_section(runs: list[Run], vary: list[str], groups: Groups) -> LossSection | None:
    panels: dict[str, dict[str, dict[str, list]]] = {}
    for panel, curve, group in groups.items():
        train = [[(m.step, m.loss) for m in r.train_log] for r in group]
        val = [[(e.step, e.val_loss) for e in r.evals] for r in group]
        c = {k: v for k, v in (("train", train), ("val", val)) if all(v)}
        if c:
            panels.setdefault(panel, {})[curve] = c
    if not panels:
        return None
    found = []
    for row_key, col_key, title in GRIDS:
        if row_key in vary and col_key in vary:
            g = grids(runs, vary, row_key, col_key)
            others = [k for k in vary if k not in (row_key, col_key, "train.seed")]
            along = [] if g else changing_with(runs, col_key, others)
            found.append(Grid(title, row_key, col_key, g, along))
    return LossSection(panels, groups.legend_title, found)


def render_losses(s: LossSection) -> list[str]:
    parts = [
        h2("Loss curves (mean over seeds)"),
        note(
            "Thin: training loss; thick with markers: validation loss. Each line is the mean over a setting's "
            "seeds, its band the range between them."
        ),
        img(figures.loss_curves_figure(s.panels, s.legend_title), "loss curves"),
    ]
    for g in s.grids:
        parts += _render_grid(g)
    return parts


def _render_grid(g: Grid) -> list[str]:
    parts = [h2(f"Final validation loss, {g.title} (mean over seeds)")]
    if not g.found:
        return [
            *parts,
            note(
                f"No {g.title} grid: no two runs differ in {g.col_key} alone"
                + (f" (it changes together with {', '.join(g.along)})" if g.along else "")
                + ", so a loss difference between its values here would not be its own."
            ),
        ]
    parts.append(
        note(
            "One grid per combination of the other settings that vary; a cell is the mean over the seeds of one "
            "setting, so no cell mixes runs that differ in a setting the grid does not show."
        )
    )
    shown = {
        t: (vals, [value(x) for x in rows], [value(x) for x in cols])
        for t, (vals, rows, cols) in g.found.items()
    }
    parts.append(
        img(
            figures.grid_figure(
                shown,
                row_label=short_key(g.row_key),
                col_label=short_key(g.col_key),
                title=f"final val loss, {g.title}",
            ),
            f"loss grid {g.title}",
        )
    )
    cols = list(dict.fromkeys(c for _, _, cs in g.found.values() for c in cs))
    parts.append(
        table(
            ["runs with", f"{g.row_key} \\ {g.col_key}", *map(value, cols)],
            [
                [t or "all", value(rv), *[vals[i, cs.index(c)] if c in cs else float("nan") for c in cols]]
                for t, (vals, rs, cs) in g.found.items()
                for i, rv in enumerate(rs)
            ],
        )
    )
    return parts
