"""The study's wing, in three rooms that import one way (docs/architecture.md):

* :mod:`smallinit.study.running` — running many trainings: sweep files and their cells, the supervisor that
  trains them (one process per cell, resumable), finished runs read back as typed records, budgets;
* :mod:`smallinit.study.judging` — judging the paper: the claims (one registry, one module per claim), the
  verdict rule, power, the ε emulation, the scaling statistics, and each recipe's findings;
* :mod:`smallinit.study.planning` — the recipes, and what a recipe's design costs and decides before it runs.

This module is the door: the names a user of the wing needs.
"""

from smallinit.study.judging.claims import CLAIMS, Claim, register
from smallinit.study.judging.verdicts import verdict_table
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.plan import plan_recipe, plan_sweep
from smallinit.study.planning.printing import format_plan
from smallinit.study.planning.recipes import load_recipe, recipe_names, run_recipe
from smallinit.study.running import (
    Cell,
    Sweep,
    SweepOutcome,
    SweepRunner,
    default_jobs,
    format_table,
    run_sweep,
    sweep_rows,
    sweep_status,
)

__all__ = [
    "CLAIMS",
    "Cell",
    "Claim",
    "Hardware",
    "Sweep",
    "SweepOutcome",
    "SweepRunner",
    "default_jobs",
    "format_plan",
    "format_table",
    "load_recipe",
    "plan_recipe",
    "plan_sweep",
    "recipe_names",
    "register",
    "run_recipe",
    "run_sweep",
    "sweep_rows",
    "sweep_status",
    "verdict_table",
]
