"""RUN/metrics.jsonl: one JSON record per logged step, evaluation or measurement, appended by the trainer
or a Monitor and read back by whatever looks at a run. A line torn by a kill is skipped, never an error.
``kept``: what a failed write's error line says is intact (the trainer: its last checkpoint)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smallinit import io

METRICS_FILE = "metrics.jsonl"


def append_record(run_dir: Path, record: dict[str, Any], kept: io.Kept | None = None) -> None:
    path = Path(run_dir) / METRICS_FILE
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError as e:
        raise io.storage_error(path, e, kept) from None


def _records(run_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(line, record) for each whole record of RUN/metrics.jsonl; a torn or foreign line is skipped."""
    try:
        text = (Path(run_dir) / METRICS_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(rec, dict):
            yield line, rec


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl; a torn or foreign line is skipped."""
    return [rec for _, rec in _records(run_dir)]


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """On resume, drop records past the checkpoint (and torn lines) so the log reads like one uninterrupted run."""
    path = Path(run_dir) / METRICS_FILE
    if path.exists():
        keep = [line for line, rec in _records(run_dir) if rec.get("step", 0) <= last_step]
        io.write_text_atomic(path, "".join(line + "\n" for line in keep))


def set_aside_metrics(run_dir: Path, kept: io.Kept | None = None) -> Path | None:
    """A run that starts over keeps the log of its earlier attempt beside the new one:
    RUN/metrics.jsonl → RUN/metrics.attempt-N.jsonl (the first free N); None if there was no log."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return None
    n = 1
    while (kept_as := path.with_name(f"metrics.attempt-{n}.jsonl")).exists():
        n += 1
    try:
        os.replace(path, kept_as)
    except OSError as e:
        raise io.storage_error(kept_as, e, kept) from None
    return kept_as
