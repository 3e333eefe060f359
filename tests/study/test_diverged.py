"""A run that diverged or failed is a result about its arm: counted per arm, shown in the table and the report,
and handled by the rule (the comparison is not judged on the survivors), never a silent change of n."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from smallinit.monitor.runs import Run
from smallinit.report.claims import claims_section, render_claims
from smallinit.study.judging.claims import Runs, claim_c4, claim_c6, loss_comparison
from smallinit.study.judging.claims.c4 import raw_level
from smallinit.study.judging.findings_file import Findings
from smallinit.study.judging.power import ALPHA, minimum_detectable_effect
from smallinit.study.judging.verdicts import INCONCLUSIVE, NOT_TESTABLE, verdict_table
from support.verdicts import FIXED, PARAMS, make_run, srank_records

# L(γ.5) − L(γ1) per seed: seed 3 is the one where γ = 1 did worst; without it the other three agree
GAPS = [0.10, 0.11, 0.09, -0.30]
STEPS = 4000  # make_run's default: 40 tokens/param, evaluated every 500 steps
DIVERGED_AT = 3210


def _c4_runs(root: Path, gaps: list[float]) -> list[Run]:
    runs = []
    for seed, g in enumerate(gaps):
        runs.append(make_run(root, gamma=0.5, seed=seed, arm=FIXED, final=3.0 + g))
        runs.append(make_run(root, gamma=1.0, seed=seed, arm=FIXED, final=3.0))
    return runs


def _diverge(run: Run) -> Run:
    """The run's loss went non-finite at DIVERGED_AT (a skipped batch) and its last evaluation is NaN."""
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    lines = [x if x.get("step") != STEPS else {**x, "val_loss": math.nan} for x in lines]
    lines.append({"step": DIVERGED_AT, "loss": math.nan, "event": "nonfinite"})
    (run.path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    summary = run.path / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "val_loss": math.nan}))
    return Run.load(run.path)


def _c4_with_one_diverged(root: Path, gaps: list[float], gamma: float) -> dict:
    runs = _c4_runs(root, gaps)
    i = 2 * 3 + (gamma == 1.0)  # seed 3, of the arm that diverges
    runs[i] = _diverge(runs[i])
    assert runs[i].val_loss is None
    return claim_c4(Runs(runs), n_boot=10).to_dict()


def _primary(claim: dict) -> dict:
    (c,) = [c for c in claim["comparisons"] if c["role"] == "primary"]
    return c


def test_a_diverged_seed_is_counted_and_the_gap_is_not_judged_on_the_survivors(tmp_path):
    """Four γ = 1 seeds, one diverges: judged on the other three the gap would agree; instead the claim is not
    testable here, and its line, the table and the report say 1 of 4 seeds diverged and where."""
    claim = _c4_with_one_diverged(tmp_path, GAPS, gamma=1.0)
    c = _primary(claim)
    assert claim["verdict"] == NOT_TESTABLE, c["text"]
    assert c["lost"] == f"γ=1: 1 of 4 seeds diverged (step {DIVERGED_AT})"
    assert "1 of 4 seeds diverged" in c["reason"] and "not missing data" in c["reason"]
    table = verdict_table([claim])
    first = next(line for line in table.splitlines() if line.startswith("C4"))
    assert "not testable here" in first and f"γ=1: 1 of 4 seeds diverged (step {DIVERGED_AT})" in first, table
    assert "(n=3)" in first  # the survivors' numbers, beside the count of the lost seed
    parts = render_claims(claims_section("claims", Findings.from_dict({"claims": [claim]})))
    assert f"γ=1: 1 of 4 seeds diverged (step {DIVERGED_AT})" in "".join(parts)


def test_the_budget_is_the_one_the_other_seeds_reached(tmp_path):
    """The diverged seed's NaN last evaluation does not cut the others' curves to 35 tokens/param."""
    c = _primary(_c4_with_one_diverged(tmp_path, GAPS, gamma=1.0))
    assert c["trajectory"]["tokens_per_param"][-1] == 40, c["text"]
    assert "at 40 tokens/param" in c["text"] and c["trend"]["tokens_per_param"] == 40


def test_a_diverged_seed_of_the_other_arm_is_the_mirror(tmp_path):
    """The same with signs flipped and γ = 0.5's worst seed diverging: not a silent "disagree" on three seeds."""
    claim = _c4_with_one_diverged(tmp_path, [-g for g in GAPS], gamma=0.5)
    c = _primary(claim)
    assert claim["verdict"] == NOT_TESTABLE, c["text"]
    assert c["lost"] == f"γ=0.5: 1 of 4 seeds diverged (step {DIVERGED_AT})"
    assert c["trajectory"]["tokens_per_param"][-1] == 40


def test_without_the_divergence_the_four_seeds_are_judged(tmp_path):
    """The rule changes nothing where no seed is lost (the same runs, all four finite)."""
    claim = claim_c4(Runs(_c4_runs(tmp_path, GAPS)), n_boot=10).to_dict()
    c = _primary(claim)
    assert c["n"] == 4 and not c.get("lost") and claim["verdict"] != NOT_TESTABLE


def test_a_run_that_stopped_diverged_without_a_summary_is_counted(tmp_path):
    """train.nonfinite = stop: the run ends at its first non-finite step with no summary; the report's runs
    (Runs.finished) keep it as a lost seed rather than dropping it as unfinished."""
    runs = _c4_runs(tmp_path, GAPS)
    stopped = runs[7]  # γ = 1, seed 3
    (stopped.path / "summary.json").unlink()
    lines = [json.loads(x) for x in (stopped.path / "metrics.jsonl").read_text().splitlines()]
    lines = [x for x in lines if x.get("step", 0) < DIVERGED_AT] + [
        {"step": DIVERGED_AT, "loss": math.inf, "event": "nonfinite"}
    ]
    (stopped.path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    runs[7] = Run.load(stopped.path)
    c = _primary(claim_c4(Runs.finished(runs), n_boot=10).to_dict())
    assert c["verdict"] == NOT_TESTABLE, c["text"]
    assert (
        c["lost"] == f"γ=1: 1 of 4 seeds diverged (step {DIVERGED_AT})" and runs[7].diverged_at == DIVERGED_AT
    )


def test_a_failed_sweep_cell_is_counted_with_its_error(tmp_path):
    """A cell that crashed (no summary, no non-finite step) is read from the sweep with its error line and counted
    for its arm, not dropped with the cells still pending."""
    sweep = tmp_path / "sweep"
    runs = _c4_runs(sweep / "cells", GAPS)
    crashed = runs[6]  # γ = 0.5, seed 3
    (crashed.path / "summary.json").unlink()
    cells = [{"id": r.path.name, "values": {}, "overrides": []} for r in runs]
    (sweep / "sweep.json").write_text(json.dumps({"cells": cells}))
    states = {r.path.name: {"status": "failed" if r is crashed else "done"} for r in runs}
    states[crashed.path.name]["error"] = "out of memory"
    (sweep / "status.json").write_text(json.dumps({"cells": states}))
    loaded = Runs.load(sweep)
    assert len(loaded) == 8 and len(loaded.lost) == 1 and loaded.lost[0].val_loss is None
    c = _primary(claim_c4(loaded, n_boot=10).to_dict())
    assert c["lost"] == "γ=0.5: 1 of 4 seeds failed (out of memory)" and c["verdict"] == NOT_TESTABLE


def test_a_nan_final_loss_after_finite_evaluations_is_a_divergence_at_the_last_step(tmp_path):
    """Only the summary says NaN (every logged evaluation finite): the run diverged at its last step."""
    runs = _c4_runs(tmp_path, GAPS[:3])
    summary = runs[2].path / "summary.json"  # γ = 0.5, seed 1
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "val_loss": math.nan}))
    runs[2] = Run.load(runs[2].path)
    assert runs[2].val_loss is None and runs[2].val_curve  # its earlier evaluations are finite
    c = loss_comparison("gap", Runs(runs[0::2]), Runs(runs[1::2]), "", min_tpp=20)
    assert c.seeds == [0, 2] and c.lost == f"γ=0.5: 1 of 3 seeds diverged (step {STEPS})"
    assert c.untestable.startswith(c.lost)


def test_c6_counts_a_diverged_seed_rather_than_judging_the_rebound_on_the_others(tmp_path):
    """The stable-rank claim pairs seeds too: a γ = 1 seed that diverged is named, and the rebound is not judged."""
    steps = int(40 * PARAMS / 10)
    runs = []
    for seed in range(4):
        runs.append(
            make_run(
                tmp_path,
                gamma=1.0,
                seed=seed,
                arm=FIXED,
                final=3.0,
                analysis=srank_records([20, 5, 4, 6, 8, 10, 12 + 0.3 * seed**2], steps),
            )
        )
        runs.append(
            make_run(
                tmp_path,
                gamma=0.5,
                seed=seed,
                arm=FIXED,
                final=3.1,
                analysis=srank_records([20 + 0.1 * seed] * 7, steps),
            )
        )
    runs[6] = _diverge(runs[6])  # γ = 1, seed 3
    c6 = claim_c6(Runs(runs))
    assert c6.verdict == NOT_TESTABLE, c6.primary.reason
    assert all(c.lost == f"γ=1: 1 of 4 seeds diverged (step {DIVERGED_AT})" for c in c6.comparisons)


def test_c6_names_a_size_whose_whole_gamma1_arm_diverged(tmp_path):
    """No seed pair is left to compare: the lost seeds are the result (not 'no analysis records')."""
    steps = int(40 * PARAMS / 10)
    runs = []
    for seed in range(3):
        runs.append(
            _diverge(
                make_run(
                    tmp_path,
                    gamma=1.0,
                    seed=seed,
                    arm=FIXED,
                    final=3.0,
                    analysis=srank_records([20, 5, 4, 6, 8, 10, 12], steps),
                )
            )
        )
        runs.append(
            make_run(
                tmp_path,
                gamma=0.5,
                seed=seed,
                arm=FIXED,
                final=3.1,
                analysis=srank_records([20 + 0.1 * seed] * 7, steps),
            )
        )
    c6 = claim_c6(Runs(runs))
    assert c6.verdict == NOT_TESTABLE
    assert (
        c6.primary.lost == f"γ=1: 3 of 3 seeds diverged (steps {DIVERGED_AT}, {DIVERGED_AT}, {DIVERGED_AT})"
    )
    assert "analysis.every" not in c6.primary.reason


def test_a_run_lost_at_one_rate_of_the_best_lr_grid_is_said_so(tmp_path):
    """γ = 1's seed 3 diverged at lr 1e-2 of a 3-rate grid: the best-lr line says its rates were never chosen and
    names no rate, and counts the run at the rate it was lost at (1 of 6 seeds at lr 1e-2), not as a seed lost
    from the whole comparison."""
    lrs = (3e-3, 1e-2, 3e-2)
    runs = [
        make_run(
            tmp_path, gamma=g, seed=seed, arm=FIXED, lr=lr, final=3.0 + 0.01 * seed + (lr == 1e-2) * -0.1
        )
        for g in (0.5, 1.0)
        for lr in lrs
        for seed in range(6)
    ]
    i = next(
        i
        for i, r in enumerate(runs)
        if (r.config["model.gamma"], r.config["train.lr"], r.seed) == (1.0, 1e-2, 3)
    )
    runs[i] = _diverge(runs[i])
    c4 = claim_c4(Runs(runs).where({"train.lr": 1e-2}), all_lrs=Runs(runs), n_boot=10)
    (best,) = [c for c in c4.comparisons if "best lr" in c.label]
    assert best.verdict == NOT_TESTABLE and "best lr not chosen: a run was lost" in best.label
    assert best.lost == f"at lr 0.01, γ=1: 1 of 6 seeds diverged (step {DIVERGED_AT})", best.lost
    assert not best.samples and "not measured" in best.text()
    (note,) = [n for n in c4.notes if "best lr" in n]
    assert "not chosen" in note and "seed 0" not in note, note


def test_an_inconclusive_best_lr_line_says_the_power_it_had(tmp_path):
    """Eight seeds at three rates, no effect of γ: the best-lr line is inconclusive and says the smallest effect its
    seeds could have seen at 80 % power at its own spread, under its line in the table: at the level its raw p is
    judged at (its p is calibrated), not at the calibrated p's level, where its MDE would look smaller."""
    rng = np.random.default_rng(3)
    profile = {3e-3: 0.2, 1e-2: 0.0, 3e-2: 0.2}
    runs = [
        make_run(tmp_path, gamma=g, seed=seed, arm=FIXED, lr=lr, final=3.0 + bump + 0.03 * rng.normal())
        for g in (0.5, 1.0)
        for lr, bump in profile.items()
        for seed in range(8)
    ]
    c4 = claim_c4(Runs(runs).where({"train.lr": 1e-2}), all_lrs=Runs(runs), n_boot=10)
    (best,) = [c for c in c4.comparisons if "best lr" in c.label]
    assert best.verdict == INCONCLUSIVE, best.reason
    assert best.mde is not None and "would be seen at 80% power" in best.magnitude
    assert "against 0.05, its level" in best.reason  # the claim's one tested secondary
    assert best.mde == pytest.approx(minimum_detectable_effect(best.sd, 8, raw_level(ALPHA)))
    assert best.mde > minimum_detectable_effect(best.sd, 8, ALPHA)
    table = verdict_table([c4.to_dict()])
    assert f"↳ {best.magnitude}" in table
