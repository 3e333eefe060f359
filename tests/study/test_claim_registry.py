"""A new claim is one module plus a recipe: this module registers a toy claim, and a recipe naming it sees it in
the plan, the verdict table and the report, judged like the paper's claims (the registry, not a list of them)."""

from __future__ import annotations

import math

import pytest

from smallinit.errors import ExperimentError
from smallinit.report import build_report
from smallinit.study.judging.claims import (
    CLAIMS,
    PRIMARY,
    Claim,
    ClaimResult,
    Comparison,
    Runs,
    register,
    val_loss,
)
from smallinit.study.judging.verdicts import verdict_table
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.plan import plan_recipe
from smallinit.study.planning.printing import format_plan
from smallinit.study.planning.recipes import load_recipe, run_recipe


def toy_claim(runs: Runs, measured: dict, options: dict) -> ClaimResult:
    """T1: every γ = 1 run ends below 100 nats (true of any run that trained at all)."""
    res = ClaimResult("T1", "γ = 1 ends below 100 nats", "< 100")
    below = {seed: 100.0 - loss for seed, loss in runs.where({"model.gamma": 1.0}).by_seed(val_loss).items()}
    res.comparisons.append(Comparison.by_seed("100 − L(γ1)", below, "> 0", role=PRIMARY))
    return res


TOY = register(Claim("T1", toy_claim, decided_by_the_runs="the runs trained at all"))

RECIPE = """
[recipe]
title = "A toy claim"
claims = ["T1"]
findings = "claims"

[base]
"model.preset" = "cpu-1m"
"model.d_model" = 16
"model.n_layers" = 1
"model.n_heads" = 2
"model.n_kv_heads" = 2
"model.d_ff" = 32
"data.seq_len" = 32
"train.batch_size" = 4
"train.steps" = 4
"train.warmup_steps" = 1
"train.eval_every" = 2
"train.eval_batches" = 1
"train.checkpoint_every" = 0

[scales.s]
description = "γ {0.5, 1}, 2 seeds, 4 steps"
[scales.s.sweeps.grid.grid]
"model.gamma" = [0.5, 1.0]
"train.seed" = [0, 1]
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(RECIPE)
    return load_recipe(path)


def test_the_registry_holds_the_papers_claims_and_the_toy():
    assert {"C1", "C2", "C3", "C4", "C5", "C6", "C7", "R"} <= set(CLAIMS) and CLAIMS["T1"] is TOY


def test_the_plan_sees_the_toy_claim(recipe):
    """Planned on configs alone: its primary pairs the 2 planned seeds, and its outcome precondition is named."""
    plan = plan_recipe(recipe, "s", Hardware.make("cpu", 2))
    (c,) = plan.claims
    assert (c.claim, c.decides, c.seeds, c.alpha) == ("T1", True, 2, 0.05) and math.isfinite(c.mde_sds)
    assert "T1 the runs trained at all" in format_plan(plan)


def test_the_table_and_the_report_see_the_toy_claim(recipe, tmp_path):
    out = tmp_path / "out"
    result = run_recipe(recipe, "s", out, jobs=1, echo=None)
    (claim,) = result.findings["claims"]
    assert claim["claim"] == "T1" and claim["comparisons"][0]["n"] == 2 and claim["verdict"] == "agree"
    assert "T1" in verdict_table(result.findings["claims"]).splitlines()[1]
    html = build_report(out).read_text(encoding="utf-8")
    assert "γ = 1 ends below 100 nats" in html


def test_a_recipe_naming_an_unregistered_claim_is_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(RECIPE.replace('claims = ["T1"]', 'claims = ["T9"]'))
    with pytest.raises(ExperimentError, match="claims names 'T9', which no module registers"):
        load_recipe(path)
