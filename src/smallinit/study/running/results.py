"""A sweep folder's status and results: one row per cell (grid values, status, losses, sizes, time), as
``results.json``, ``results.csv`` and a table for the terminal."""

from __future__ import annotations

import csv
import io
import os
import statistics
from pathlib import Path
from typing import Any

from smallinit.errors import ExperimentError
from smallinit.io import read_json, write_json_atomic, write_text_atomic
from smallinit.monitor.metrics import read_metrics
from smallinit.monitor.records import EvalRecord, StepRecord, parse_record
from smallinit.study.running.spec import Cell, cell_dir


def error_line(log: Path) -> str:
    """The line that says why a cell failed: smallinit's error line, else the last line of its log."""
    try:
        lines = [
            ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()
        ]
    except OSError:
        return "no log"
    for ln in reversed(lines):
        if ln.startswith("smallinit: error:"):
            return ln[len("smallinit: error:") :].strip()
    return lines[-1] if lines else "exited without output"


def cell_row(sweep_dir: Path, cell: Cell, state: dict[str, Any]) -> dict[str, Any]:
    """One results row: grid values, status, losses, sizes and time."""
    run = cell_dir(sweep_dir, cell.id)
    summary = read_json(run / "summary.json") or {}
    records = read_metrics(run)
    typed = [rec for rec in map(parse_record, records) if rec is not None]
    train = [r for r in typed if isinstance(r, StepRecord) and not r.nonfinite]
    vals = [r for r in typed if isinstance(r, EvalRecord)]
    speeds = [r.tokens_per_s for r in train if r.tokens_per_s is not None]
    row: dict[str, Any] = {"cell": cell.id, "status": state.get("status", "pending")}
    if cell.size is not None:
        row["size"] = cell.size
    if cell.arm is not None:
        row["arm"] = cell.arm
    row.update(cell.values)
    row.update(
        {
            "val_loss": summary.get("val_loss", vals[-1].val_loss if vals else None),
            "final_loss": train[-1].loss if train else None,
            "step": summary.get("step", max((r.get("step", 0) for r in records), default=0)),
            "params": summary.get("params", state.get("params")),
            "params_active": summary.get("params_active"),
            "params_nonembed": state.get("params_nonembed"),
            "wall_s": state.get("wall_s"),
            "cpu_s": state.get("cpu_s"),
            "tokens_per_s": statistics.median(speeds) if speeds else None,
            "error": state.get("error"),
            "dir": f"cells/{cell.id}",
        }
    )
    return row


def load_cells(sweep_dir: Path) -> list[Cell]:
    spec = read_json(sweep_dir / "sweep.json")
    if not isinstance(spec, dict) or "cells" not in spec:
        raise ExperimentError(
            f"{sweep_dir} is not a sweep folder (no readable sweep.json); pass a sweep's --out"
        )
    return [Cell(c["id"], c.get("arm"), c["values"], c["overrides"], c.get("size")) for c in spec["cells"]]


def sweep_rows(sweep_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The results rows of a sweep folder, as they stand now (also while it runs)."""
    sweep_dir = Path(sweep_dir)
    states = cell_states(sweep_dir)
    return [cell_row(sweep_dir, c, states.get(c.id, {})) for c in load_cells(sweep_dir)]


def cell_states(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """Each cell's state in status.json (status, error, times), by cell id; empty before the first run."""
    return (read_json(Path(sweep_dir) / "status.json") or {}).get("cells", {})


def write_results(sweep_dir: Path, rows: list[dict[str, Any]]) -> None:
    write_json_atomic(sweep_dir / "results.json", rows)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    write_text_atomic(sweep_dir / "results.csv", buf.getvalue())


def format_table(rows: list[dict[str, Any]]) -> str:
    """cell, status, step, val loss, wall time, error — one line per cell, then the counts."""
    header = ("cell", "status", "step", "val loss", "wall", "error")
    lines = [header]
    for r in rows:
        val = f"{r['val_loss']:.4f}" if isinstance(r.get("val_loss"), (int, float)) else "-"
        wall = f"{r['wall_s']:.0f}s" if isinstance(r.get("wall_s"), (int, float)) else "-"
        err = (r.get("error") or "")[:80] if r["status"] in ("failed", "interrupted") else ""
        lines.append((r["cell"], r["status"], str(r.get("step") or 0), val, wall, err))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = [
        "  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + ("  " + line[-1] if line[-1] else "")
        for line in lines
    ]
    counts = {
        s: sum(r["status"] == s for r in rows)
        for s in ("done", "running", "interrupted", "pending", "failed")
    }
    out.append(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no cells")
    return "\n".join(line.rstrip() for line in out)
