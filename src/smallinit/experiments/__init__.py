"""Experiments: sweeps of training runs (one process per cell), named recipes, the claims C1–C7 and their verdicts."""

from smallinit.experiments.sweep import (
    Cell,
    Sweep,
    SweepOutcome,
    SweepRunner,
    default_jobs,
    format_table,
    run_sweep,
    sweep_rows,
)

__all__ = ["Cell", "Sweep", "SweepOutcome", "SweepRunner", "default_jobs", "format_table", "run_sweep", "sweep_rows"]
