"""``smallinit demo``: the demo recipe (reduced paper recipes), the HTML report and the verdict table."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..io import write_json_atomic, write_text_atomic
from ..report.verdict import NOT_TESTABLE
from .recipes import RecipeResult, run_recipe

LEGEND = """\
Notation: C1–C7 are the paper's claims; d16×4 is a model of width 16 and 4 layers; γ.5, γ1 are γ = 0.5, 1;
L is the final validation loss (nats); srank the stable rank ‖W‖_F²/‖W‖_2²; Δ_sym = (p_A − p_B)/(p_A + p_B)
per token. Each number is the mean ± sd over seeds of a paired difference, signed so that > 0 is the paper's
direction. agree / disagree: a Student-t test over seeds rejects 0 (Holm over the claim's comparisons,
α = 0.05); inconclusive: it does not; not testable here: a precondition failed (reason below the line)."""


def verdict_table(claims: list[dict[str, Any]]) -> str:
    """One block per claim: its verdict, then each comparison with its own verdict and the paper's number;
    a comparison that is not testable here says why on the line below; the notation last."""
    rows = [("claim", "verdict", "measured (mean ± sd over seeds, n seeds) → verdict", "paper")]
    for c in claims:
        comps = c["comparisons"] or [{"text": "; ".join(c["notes"]) or "not measured at this scale",
                                      "verdict": "", "paper": c["paper"]}]
        shown_claim_reason = False
        for i, comp in enumerate(comps):
            arrow = f" → {comp['verdict']}" if comp["verdict"] else ""
            rows.append((c["claim"] if i == 0 else "", c["verdict"] if i == 0 else "", comp["text"] + arrow,
                         comp.get("paper") or ""))
            if comp.get("verdict") == NOT_TESTABLE and comp.get("reason"):
                if comp["reason"] == c.get("untestable"):
                    if shown_claim_reason:
                        continue
                    shown_claim_reason = True
                rows.append(("", "", f"  ↳ {comp['reason']}", ""))
        for note in c["notes"] if c["comparisons"] else []:
            rows.append(("", "", f"({note})", ""))
    widths = [max(len(r[i]) for r in rows if not r[2].startswith(("  ↳", "("))) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n\n" + LEGEND


def write_report(out: Path) -> Path | None:
    """The HTML report of the demo folder, through smallinit.report (None if that package cannot build it)."""
    try:
        from ..report import build_report
    except ImportError:
        return None
    return Path(build_report(out))


@dataclass
class DemoResult:
    result: RecipeResult
    report: Path | None
    table: str
    wall_s: float


def run_demo(
    *, scale: str = "full", out: str | os.PathLike | None = None, jobs: int | None = None,
    echo: TextIO | None = sys.stderr,
) -> DemoResult:
    """Run (or continue) the demo at ``scale`` ("full", "quick" or "micro"), report and judge it."""
    t0 = time.monotonic()
    out = Path(out) if out is not None else Path("runs") / f"demo-{scale}"
    result = run_recipe("demo", scale, out, jobs=jobs, echo=echo)
    if result.analysis is None:
        return DemoResult(result, None, "", time.monotonic() - t0)
    table = verdict_table(result.analysis["claims"])
    write_text_atomic(out / "verdicts.txt", table + "\n")
    t_report = time.monotonic()
    if echo is not None:
        print("[demo] writing the HTML report", file=echo, flush=True)
    report = write_report(out)
    if echo is not None and report is not None:
        print(f"[demo] report written in {time.monotonic() - t_report:.0f} s", file=echo, flush=True)
    wall = time.monotonic() - t0
    write_json_atomic(out / "demo.json", {"scale": scale, "wall_s": wall, "report": str(report) if report else None})
    return DemoResult(result, report, table, wall)
