"""RUN/metrics.jsonl: one JSON record per logged step or evaluation, appended by the trainer and read back
by whatever looks at a run. A line torn by a kill is skipped, never an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import io
from .checkpoint import kept

METRICS_FILE = "metrics.jsonl"


def append_record(run_dir: Path, record: dict[str, Any]) -> None:
    path = Path(run_dir) / METRICS_FILE
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError as e:
        raise io.storage_error(path, e, kept(run_dir)) from None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl; a torn or foreign line is skipped."""
    try:
        lines = (Path(run_dir) / METRICS_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """On resume, drop records past the checkpoint so the log reads like one uninterrupted run."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get("step", 0) <= last_step:
                keep.append(line)
        except (json.JSONDecodeError, AttributeError, RecursionError):
            continue  # a line torn by a crash
    io.write_text_atomic(path, "".join(line + "\n" for line in keep))
