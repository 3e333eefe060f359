"""``smallinit demo``: the demo recipe (reduced paper recipes), the HTML report and the verdict table."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from smallinit.io import write_json_atomic, write_text_atomic
from smallinit.report import build_report
from smallinit.study.judging.verdicts import verdict_table
from smallinit.study.planning.cost import Hardware, hours
from smallinit.study.planning.plan import plan_recipe
from smallinit.study.planning.recipes import RecipeResult, check_out, load_recipe, run_recipe


@dataclass
class DemoResult:
    result: RecipeResult
    report: Path | None  # None when a signal stopped the recipe
    table: str
    wall_s: float
    plan_wall_s: float | None = (
        None  # what its plan, timed on this machine before the runs, said it would take
    )


def run_demo(
    *,
    scale: str = "full",
    out: str | os.PathLike | None = None,
    jobs: int | None = None,
    echo: TextIO | None = sys.stderr,
    slurm: dict[str, Any] | None = None,
) -> DemoResult:
    """Run (or continue) the demo at ``scale`` ("full", "quick" or "micro"), report and judge it; ``slurm``: submit
    its cells to SLURM instead (smallinit.study.planning.recipes.run_recipe), judged once they have finished."""
    out = Path(out) if out is not None else Path("runs") / f"demo-{scale}"
    check_out(out)
    if echo is not None:  # what this scale tests and cannot test, before anything runs
        print(f"[demo] {scale}: {load_recipe('demo').scale(scale).description}", file=echo, flush=True)
    planned = None
    if slurm is None and jobs is None and not (out / "recipe.json").is_file():  # a fresh demo on this machine
        plan = plan_recipe("demo", scale, Hardware.make("cpu"), timed=True)
        planned = plan.wall_s if plan.timing is not None else None
        if echo is not None and planned is not None:
            print(f"[demo] plan: {hours(planned)} wall ({plan.timing.describe()})", file=echo, flush=True)
    t0 = time.monotonic()  # the demo's time, beside its plan's, is the runs', the analysis' and the report's
    result = run_recipe("demo", scale, out, jobs=jobs, echo=echo, slurm=slurm)
    if result.findings is None:
        return DemoResult(result, None, "", time.monotonic() - t0, planned)
    table = verdict_table(result.findings["claims"])
    write_text_atomic(out / "verdicts.txt", table + "\n")
    t_report = time.monotonic()
    if echo is not None:
        print("[demo] writing the HTML report", file=echo, flush=True)
    report = Path(build_report(out))
    if echo is not None:
        print(f"[demo] report written in {time.monotonic() - t_report:.0f} s", file=echo, flush=True)
    wall = time.monotonic() - t0
    write_json_atomic(
        out / "demo.json", {"scale": scale, "wall_s": wall, "plan_wall_s": planned, "report": str(report)}
    )
    return DemoResult(result, report, table, wall, planned)
