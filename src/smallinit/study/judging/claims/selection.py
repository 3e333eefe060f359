"""Runs selected by their resolved configs (γ, ε, gate, size), paired by seed, and the per-run numbers the
claims compare. A "size" is a model shape (width, depth, heads, d_ff, experts), so runs with and without the
gate count as the same size.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from smallinit.monitor.records import AnalysisRecord
from smallinit.monitor.runs import Run
from smallinit.study.running import cell_dir, cell_states, load_cells

EMULATED_WIDTH = 2048  # the paper's width at 1.5B, whose saturation the emulated baseline reproduces
BASELINE = {"model.norm_eps": 1e-5, "model.gate": "none", "model.norm_eps_width": 0}
EMULATED = {"model.norm_eps": 1e-5, "model.gate": "none", "model.norm_eps_width": EMULATED_WIDTH}
FIXED = {"model.norm_eps": 1e-12, "model.gate": "elementwise"}
# a cell's status in its sweep when it was started and did not finish
INTERRUPTED = ("running", "interrupted")
UNFINISHED = "did not finish (interrupted, or still running: run the sweep again to finish it)"


class Runs:
    """The finished runs of one or more sweep folders, selectable by config values. ``runs`` are those whose
    loss is a result to compare; ``lost`` those that diverged or failed, kept apart so that no metric reads
    their partial records as an end state, and counted by every comparison of their arm (:func:`lost_seeds`)."""

    def __init__(self, runs: list[Run]):
        self.runs = [r for r in runs if not r.lost]
        self.lost = [r for r in runs if r.lost]

    @staticmethod
    def load(*folders: str | os.PathLike) -> Runs:
        """Every started cell of the given sweep folders (folders with a sweep.json below them are searched): done,
        failed (with its error line), or interrupted (killed before it finished, which a folder re-judged before
        the sweep resumes still says "running"). A failed or interrupted cell is counted by its arm like a diverged
        one, never left out; a pending cell was not started, so it is no result yet."""
        runs = []
        for folder in folders:
            for spec in sorted(Path(folder).rglob("sweep.json")):
                states = cell_states(spec.parent)
                for cell in load_cells(spec.parent):
                    status = states.get(cell.id, {}).get("status")
                    if status not in ("done", "failed", *INTERRUPTED):
                        continue
                    run = Run.load(cell_dir(spec.parent, cell.id), cell.id)
                    if run is not None:
                        run.error = {
                            "done": "",
                            "failed": states[cell.id].get("error") or "failed",
                        }.get(status, UNFINISHED)
                        runs.append(run)
        return Runs(runs)

    @staticmethod
    def finished(runs: Iterable[Run]) -> Runs:
        """The runs that wrote their summary or stopped diverged (a run still training, or killed, is not judged)."""
        return Runs([r for r in runs if r.summary or r.diverged_at is not None])

    @staticmethod
    def found(runs: Iterable[Run], *folders: str | os.PathLike) -> Runs:
        """The runs a folder holds, judged as a recipe judges its own: every started cell of the sweeps below
        ``folders`` as :meth:`load` reads them (an interrupted or failed cell counted by its arm), and of the
        ``runs`` outside any sweep the finished ones."""
        swept = Runs.load(*folders)
        sweeps = [spec.parent.resolve() for folder in folders for spec in Path(folder).rglob("sweep.json")]
        outside = [r for r in runs if not any(r.path.resolve().is_relative_to(s) for s in sweeps)]
        finished = Runs.finished(outside)
        return Runs([*swept.runs, *swept.lost, *finished.runs, *finished.lost])

    def where(self, conditions: dict[str, Any] | None = None, **more: Any) -> Runs:
        cond = {**(conditions or {}), **more}
        return Runs([r for r in (*self.runs, *self.lost) if r.matches(cond)])

    def values(self, key: str) -> list[Any]:
        vals = {r.size if key == "size" else r.config.get(key) for r in self.runs}
        return sorted(v for v in vals if v is not None)

    def by_seed(self, metric: Callable[[Run], float | None]) -> dict[int, float]:
        """metric per seed; a seed with several runs (should not happen within one selection) is averaged."""
        acc: dict[int, list[float]] = {}
        for r in self.runs:
            v = metric(r)
            # a plan's value is unknown (NaN), not missing
            if v is not None and (math.isfinite(v) or r.planned):
                acc.setdefault(r.seed, []).append(v)
        return {s: float(np.mean(v)) for s, v in acc.items()}

    def run_by_seed(self) -> dict[int, Run]:
        """The run of each seed (the last one if a seed has several, which one selection should not)."""
        return {r.seed: r for r in self.runs}

    def __len__(self) -> int:  # lost runs count: the arm was run
        return len(self.runs) + len(self.lost)

    def __iter__(self):
        return iter(self.runs)


def val_loss(run: Run) -> float | None:
    return run.val_loss


def paired(a: Runs, b: Runs, metric: Callable[[Run], float | None] = val_loss) -> dict[int, float]:
    """metric(a) − metric(b) by seed, for every seed both selections finished."""
    ma, mb = a.by_seed(metric), b.by_seed(metric)
    return {s: ma[s] - mb[s] for s in sorted(set(ma) & set(mb))}


ARM_KEYS = {
    "model.gamma": "γ",
    "model.norm_eps": "ε",
    "model.norm_eps_width": "ε emulated at d",
    "model.gate": "gate",
    "train.lr": "lr",
}


def arm_names(a: Runs, b: Runs) -> tuple[str, str]:
    """Each arm of a comparison named by the settings that tell it from the other: ("γ=0.5", "γ=1")."""

    def settings(sel: Runs) -> dict[str, Any]:
        values = {k: {r.config.get(k) for r in (*sel.runs, *sel.lost)} for k in ARM_KEYS}
        return {k: v.pop() for k, v in values.items() if len(v) == 1}

    sa, sb = settings(a), settings(b)
    keys = [k for k in ARM_KEYS if k in sa and k in sb and sa[k] != sb[k]]
    if not keys:
        return "the first arm", "the second arm"

    def name(s: dict[str, Any]) -> str:
        return ", ".join(
            f"{ARM_KEYS[k]}={s[k]:g}" if isinstance(s[k], (int, float)) else f"{ARM_KEYS[k]} {s[k]}"
            for k in keys
        )

    return name(sa), name(sb)


def no_value(a: Runs, b: Runs, metric: Callable[[Run], float | None], what: str) -> str:
    """Per arm, the finished (not lost, not planned) seeds whose ``metric`` is missing or not a number: "γ=1: 1 of
    6 seeds gave no final sink score (seed(s) [4])"; "" when every one has it. :func:`paired` leaves them out, so
    a comparison of it carries this line and is not judged on the others (comparison.no_value_problem)."""
    parts = []
    for name, sel in zip(arm_names(a, b), (a, b)):
        bad = sorted(r.seed for r in sel if not r.planned and not _finite(metric(r)))
        if bad:
            n = len({r.seed for r in (*sel.runs, *sel.lost)})
            parts.append(f"{name}: {len(bad)} of {n} seeds gave no {what} (seed(s) {bad})")
    return "; ".join(parts)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def lost_seeds(a: Runs, b: Runs) -> str:
    """Per arm that lost seeds, how many of its seeds diverged (and at which step) or failed (and why):
    "γ=1: 1 of 4 seeds diverged (step 120)"; "" when none did."""
    parts = []
    for name, sel in zip(arm_names(a, b), (a, b)):
        if not sel.lost:
            continue
        n = len({r.seed for r in (*sel.runs, *sel.lost)})
        steps = sorted(r.diverged_at for r in sel.lost if r.diverged_at is not None)
        failed = [r.error for r in sel.lost if r.diverged_at is None and r.error != UNFINISHED]
        unfinished = sum(r.diverged_at is None and r.error == UNFINISHED for r in sel.lost)
        what = (
            [
                f"{len(steps)} of {n} seeds diverged (step{'s' if len(steps) > 1 else ''} "
                f"{', '.join(str(s) for s in steps)})"
            ]
            if steps
            else []
        )
        what += [f"{len(failed)} of {n} seeds failed ({failed[0][:80]})"] if failed else []
        what += [f"{unfinished} of {n} seeds {UNFINISHED}"] if unfinished else []
        parts.append(f"{name}: {', '.join(what)}")
    return "; ".join(parts)


def lost_problem(lost: str) -> str:
    """The rule for a comparison whose arms lost seeds (``lost`` from :func:`lost_seeds`; "" when none did)."""
    return (
        (
            f"{lost}: a diverged or failed seed is a result about its arm, not missing data, so the other seeds' "
            "gap is not judged (rerun at a stable learning rate, or report the divergence)"
        )
        if lost
        else ""
    )


def size_label(size: tuple) -> str:
    """d_model × layers (× experts), as comparisons name a size: "d32×4"."""
    return f"d{size[0]}×{size[1]}" + (f"×{size[4]}e" if size[4] else "")


def reference_lr(runs: Runs) -> Runs:
    """The runs at the most common learning rate (the others belong to a learning-rate check)."""
    lrs = Counter(float(r.config.get("train.lr", 0.0)) for r in runs)
    return runs.where({"train.lr": lrs.most_common(1)[0][0]}) if lrs else runs


def baselines(runs: Runs) -> list[tuple[str, dict[str, Any]]]:
    """(claim suffix, selection) of the baseline arms present: emulated saturation first, plain ε beside it."""
    found = [("", EMULATED)] if len(runs.where(EMULATED)) else []
    if len(runs.where(BASELINE)):
        found.append((" (plain ε)" if found else "", BASELINE))
    return found or [("", BASELINE)]


def last_analysis(run: Run) -> AnalysisRecord | None:
    """The run's last analysis record, if it was taken in the last sixth of training (the end state)."""
    recs = run.analysis
    steps = int(run.config.get("train.steps") or 0)
    return recs[-1] if recs and recs[-1].step >= 5 / 6 * steps else None


def sink_mean(run: Run) -> float | None:
    """Mean sink score over layers at the end of training (the analysis record of the last step)."""
    rec = last_analysis(run)
    return rec.sink.mean if rec and rec.sink else None


def sink_share(run: Run) -> dict[float, float]:
    """Sink_ε per ε at the end of training; empty where it was not recorded."""
    rec = last_analysis(run)
    return rec.sink.share_above if rec and rec.sink else {}


def mean_stable_rank(rec: AnalysisRecord) -> float:
    """The stable rank of an analysis record, averaged over its matrices (NaN if any of them is NaN)."""
    return float(np.mean([m.stable_rank for m in rec.matrices])) if rec.matrices else math.nan


def measured_factor_at_init(run: Run) -> float | None:
    """The mean measured RMSNorm factor over the model's norms at step 0 (the analysis callback's, else the
    norm-factor records of ``analysis.norm_every``)."""
    recs = [r for r in (*run.analysis, *run.norm_records) if r.step == 0 and r.norm_factor]
    return float(np.mean(list(recs[0].norm_factor.values()))) if recs else None


def sink_layers(run: Run) -> tuple[list[float], int, int] | None:
    """Per-layer sink scores at the end of training, with the sequences and tokens they were measured on."""
    rec = last_analysis(run)
    if not rec or not rec.sink:
        return None
    return (
        list(rec.sink.per_layer),
        int(run.config.get("analysis.batch_size", 0)),
        int(run.config.get("data.seq_len", 0)),
    )
