"""Sweeps: a base config crossed with a grid of values, one training process per cell.

* :mod:`.spec` — the sweep file and its cells;
* :mod:`.packing` — how many cells run side by side, with how many threads;
* :mod:`.runner` — runs the cells (resumable, one process each, stopped cleanly by a signal), or submits them;
* :mod:`.sbatch` — the SLURM options of a sweep and the batch script of its job array;
* :mod:`.slurm` — submitting a sweep's cells to SLURM as one job array, and reading their states back;
* :mod:`.results` — the status and results of a sweep folder;
* :mod:`.progress` — elapsed time and ETA over the cells of a sweep or a recipe.
"""

from smallinit.study.running.packing import available_cores, compile_cache_env, default_jobs
from smallinit.study.running.progress import SweepProgress, cell_work
from smallinit.study.running.results import cell_states, format_table, load_cells, sweep_rows
from smallinit.study.running.runner import SweepOutcome, SweepRunner, run_sweep
from smallinit.study.running.slurm import sweep_status
from smallinit.study.running.spec import Cell, Sweep, cell_dir, resolve_config

__all__ = [
    "Cell",
    "SweepProgress",
    "Sweep",
    "SweepOutcome",
    "SweepRunner",
    "available_cores",
    "cell_dir",
    "cell_states",
    "cell_work",
    "compile_cache_env",
    "default_jobs",
    "format_table",
    "load_cells",
    "resolve_config",
    "run_sweep",
    "sweep_rows",
    "sweep_status",
]
