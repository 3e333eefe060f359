"""A finished seed that gave no value (a NaN flow exponent, a run without a final loss, a stable-rank course of
fewer than 3 records) and a cell that did not finish are counted per arm and shown in the line, the table and
findings.json; the comparison is then not judged on the others as if n were smaller."""

from __future__ import annotations

import json
import math

import numpy as np

from smallinit.monitor.runs import Run
from smallinit.report.html import build_report
from smallinit.study.judging.claims import Runs, claim_c3, claim_c4, claim_c5, claim_c6
from smallinit.study.judging.verdicts import AGREE, NOT_TESTABLE, paired_t, region_p, verdict_table
from support.verdicts import FIXED, PARAMS, c3_runs, make_run, srank_records


def _flow(last: float) -> dict:
    """Five seeds' flow exponents at γ 0.5 and 1; seed 2's at γ = 1 is ``last``."""
    return {
        "gammas": [0.5, 1.0],
        "seeds": [0, 1, 2, 3, 4],
        "seed_slopes": [[0.5, 0.52, 0.49, 0.51, 0.5], [0.01, -0.02, last, 0.0, 0.02]],
    }


def test_a_nan_flow_exponent_is_counted_and_the_claim_not_judged_on_four_seeds():
    """With seed 2's exponent NaN the old rule printed "agree (n=4)"; at +0.40 the five seeds are inconclusive."""
    assert claim_c5(Runs([]), _flow(0.40)).verdict != AGREE
    res = claim_c5(Runs([]), _flow(math.nan))
    c = res.primary
    assert res.verdict == NOT_TESTABLE, c.reason
    assert c.no_value == "1 of 5 seeds gave no flow exponent (seed 2)" and c.no_value in c.reason
    assert "1 of 5 seeds gave no flow exponent" in c.text() and "(n=4)" in c.text()
    claim = res.to_dict()
    (primary,) = [x for x in claim["comparisons"] if x["role"] == "primary"]
    assert primary["no_value"] == c.no_value and primary["unknown"] == [2]
    first = next(line for line in verdict_table([claim]).splitlines() if line.startswith("C5"))
    assert "not testable here" in first and "1 of 5 seeds gave no flow exponent" in first


def test_judging_on_the_survivors_errs_when_a_value_fails_for_a_reason():
    """Simulation: exponents on the edge of the ±0.15 band (the truth is not inside it), and a fit that fails
    (NaN) on the largest deviations. Judged on the survivors, "agree" comes far above α/2; counted, the
    comparison is not judged whenever a seed failed, and agrees at most α/2 over all studies."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.15, 0.04, (20000, 5))
    failed = x > 0.2  # the fit fails on the steepest
    any_failed = failed.any(-1)
    agree_survivors = np.zeros(len(x), dtype=bool)
    for k in range(2, 6):  # the survivors' t-test, per number of survivors
        rows = (~failed).sum(-1) == k
        kept = np.sort(np.where(failed[rows], np.inf, x[rows]), -1)[:, :k]
        m, se = paired_t(kept)
        p, agrees = region_p(m, se, k - 1, "zero", 0.15)
        agree_survivors[rows] = (p <= 0.05) & agrees
    counted = agree_survivors & ~any_failed
    print(
        f"\nvalues failing on the steepest ({any_failed.mean():.2f} of studies): P(agree) on survivors "
        f"{agree_survivors.mean():.4f}, counted {counted.mean():.4f}"
    )
    margin = 3 * math.sqrt(0.025 * 0.975 / len(x))
    assert agree_survivors.mean() > 0.025 + margin and counted.mean() <= 0.025 + margin


def _c6_runs(root, records: dict[int, int]) -> list:
    """Six seed pairs with a clear rebound; γ = 1's seeds in ``records`` keep only that many analysis records."""
    steps = int(40 * PARAMS / 10)
    runs = []
    for seed in range(6):
        ranks = [20, 5, 4, 6, 8, 10, 12 + 0.3 * seed]
        recs = srank_records(ranks, steps)
        runs.append(
            make_run(root, gamma=1.0, seed=seed, arm=FIXED, final=3.0, analysis=recs[: records.get(seed, 7)])
        )
        runs.append(
            make_run(
                root,
                gamma=0.5,
                seed=seed,
                arm=FIXED,
                final=3.1,
                analysis=srank_records([20 + 0.1 * seed] * 7, steps),
            )
        )
    return runs


def test_c6_counts_a_seed_without_enough_analysis_records(tmp_path):
    assert claim_c6(Runs(_c6_runs(tmp_path / "all", {}))).verdict == AGREE
    res = claim_c6(Runs(_c6_runs(tmp_path / "short", {4: 2})))
    assert res.verdict == NOT_TESTABLE, res.primary.reason
    assert all("γ=1: 1 of 6 seeds gave no stable-rank course" in c.text() for c in res.comparisons)
    assert "seed 4" in res.primary.reason


def test_c6_counts_a_nan_stable_rank_inside_a_record(tmp_path):
    """A record that holds stable ranks, one of them NaN (a matrix whose norm failed): the seed has no course, so
    no comparison is judged on the other five (the old rule judged its primary and secondaries on them)."""
    runs = _c6_runs(tmp_path, {})
    seed4 = next(r for r in runs if r.seed == 4 and r.config["model.gamma"] == 1.0)
    lines = (seed4.path / "metrics.jsonl").read_text().splitlines()
    recs = [i for i, line in enumerate(lines) if '"analysis"' in line]
    rec = json.loads(lines[recs[3]])
    rec["stable_rank"] = {"m": math.nan, "k": 6.0}
    lines[recs[3]] = json.dumps(rec)
    (seed4.path / "metrics.jsonl").write_text("\n".join(lines))
    res = claim_c6(Runs([Run.load(r.path) for r in runs]))
    assert res.verdict == NOT_TESTABLE, res.primary.reason
    for c in res.comparisons:
        assert c.verdict == NOT_TESTABLE and "γ=1: 1 of 6 seeds gave no stable-rank course" in c.text(), (
            c.text()
        )


def test_c3_counts_a_seed_without_a_sink_score(tmp_path):
    """A finished no-gate seed whose sink score is NaN: the sink comparisons say so and are not judged on the
    others."""
    runs = c3_runs(tmp_path, 0.3)
    assert all(
        c.verdict != NOT_TESTABLE for c in claim_c3(Runs(runs)).comparisons if c.label.startswith("sink")
    )
    gone = next(
        r for r in runs if r.seed == 1 and r.config["model.gamma"] == 0.5 and r.config["model.gate"] == "none"
    )
    lines = (gone.path / "metrics.jsonl").read_text().replace('"sink_mean": 0.02', '"sink_mean": NaN')
    (gone.path / "metrics.jsonl").write_text(lines)
    res = claim_c3(Runs([Run.load(r.path) for r in runs]))
    (sink,) = [c for c in res.comparisons if c.label.startswith("sink γ1−γ.5")]
    assert sink.verdict == NOT_TESTABLE and "γ=0.5: 1 of 3 seeds gave no final sink score" in sink.reason


def test_an_interrupted_cell_is_counted_when_a_folder_is_re_judged(tmp_path):
    """A cell killed mid-run (its status still "running") is read with its arm, not left out of both lists."""
    sweep = tmp_path / "sweep"
    runs = []
    for seed, g in enumerate([0.1, 0.11, 0.09, 0.1]):
        runs.append(make_run(sweep / "cells", gamma=0.5, seed=seed, arm=FIXED, final=3.0 + g))
        runs.append(make_run(sweep / "cells", gamma=1.0, seed=seed, arm=FIXED, final=3.0))
    killed = runs[7]  # γ = 1, seed 3
    (killed.path / "summary.json").unlink()
    cells = [{"id": r.path.name, "values": {}, "overrides": []} for r in runs]
    (sweep / "sweep.json").write_text(json.dumps({"cells": cells}))
    states = {r.path.name: {"status": "running" if r is killed else "done"} for r in runs}
    (sweep / "status.json").write_text(json.dumps({"cells": states}))
    loaded = Runs.load(sweep)
    assert len(loaded.runs) == 7 and len(loaded.lost) == 1
    c = claim_c4(loaded, n_boot=10).primary
    assert c.verdict == NOT_TESTABLE and c.lost.startswith("γ=1: 1 of 4 seeds did not finish"), c.lost
    # the report of the folder, which has no findings.json, judges it as the recipe does
    html = build_report(tmp_path).read_text(encoding="utf-8")
    assert "γ=1: 1 of 4 seeds did not finish" in html


def test_the_report_shows_a_seed_without_a_value(tmp_path):
    """The report of a recipe folder prints the count as the table does, from findings.json."""
    res = claim_c5(Runs([]), _flow(math.nan))
    (tmp_path / "findings.json").write_text(json.dumps({"title": "t", "claims": [res.to_dict()]}))
    html = build_report(tmp_path).read_text(encoding="utf-8")
    assert "1 of 5 seeds gave no flow exponent (seed 2)" in html and "not testable here" in html
