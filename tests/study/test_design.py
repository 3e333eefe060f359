"""A design that cannot decide a primary does not run it: the full demo runs only what it can decide, the
claims it drops are ones the plan shows it could not decide, and a dropped claim is one row saying why,
outside Holm's family."""

from __future__ import annotations

import re

import pytest

from smallinit.errors import ExperimentError
from smallinit.study.judging.claims import NOT_RUN, PRIMARY, ClaimResult, Comparison, judge_table, not_run
from smallinit.study.judging.power import ALPHA, minimum_detectable_effect
from smallinit.study.judging.verdicts import NOT_TESTABLE, verdict_table
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.plan import plan_recipe
from smallinit.study.planning.printing import format_plan
from smallinit.study.planning.recipes import RECIPES_DIR, load_recipe

DEMO = (RECIPES_DIR / "demo.toml").read_text()


def test_the_full_demo_runs_only_what_it_can_decide():
    """Every claim of the full demo is decided by its design, not run by design (with why), or descriptive."""
    plan = plan_recipe("demo", "full", Hardware.make("cpu", 2))
    for c in plan.claims:
        descriptive = any(r.startswith("descriptive") for r in c.failing.values())
        assert c.decides or c.not_run or descriptive, (c.claim, c.failing)
    assert {c.claim for c in plan.claims if c.not_run} == {"C1", "C2", "C3", "C7"}
    text = format_plan(plan)
    assert re.search(r"C1\s+not run by design: on the emulated-ε arm", text)
    assert "not run by design C1, C2, C3" in plan.headline()


def _with_the_emulated_arm(tmp_path):
    """The full demo as it was: the dropped claims' arms back in, nothing dropped."""
    arms = """
[scales.full.sweeps.baseline.base]
"model.d_model" = 16
"model.n_heads" = 2
"model.n_kv_heads" = 2
"model.d_ff" = 48
[scales.full.sweeps.baseline.grid]
"model.gamma" = [0.5, 1.0]
"train.seed" = [0, 1, 2]
[scales.full.sweeps.baseline.arms.baseline]
"model.norm_eps" = 1e-5
"model.norm_eps_width" = 2048
"model.gate" = "none"

[scales.full.sweeps.eps-only.base]
"model.d_model" = 16
"model.n_heads" = 2
"model.n_kv_heads" = 2
"model.d_ff" = 48
[scales.full.sweeps.eps-only.grid]
"model.gamma" = [0.5, 1.0]
"train.seed" = [0, 1, 2]
[scales.full.sweeps.eps-only.arms.eps-only]
"model.norm_eps" = 1e-12
"model.gate" = "none"
"""
    text = re.sub(r"\[scales\.full\.options\.dropped\].*?\n\n", "", DEMO, flags=re.S)
    text = text.replace("# -- quick --", arms + "\n# -- quick --")
    path = tmp_path / "demo-undropped.toml"
    path.write_text(text)
    return path


def test_the_claims_it_drops_could_not_be_decided(tmp_path):
    """Put C1's and C2's emulated arm back into the full demo: the plan says, before any run, that the arm stays
    saturated far longer than at d = 2048, so neither primary could be decided whatever the seeds."""
    plan = plan_recipe(load_recipe(_with_the_emulated_arm(tmp_path)), "full", Hardware.make("cpu", 2))
    claims = {c.claim: c for c in plan.claims}
    for claim in ("C1", "C2"):
        assert not claims[claim].decides and not claims[claim].not_run
        assert any("does not stand for the paper's scale" in r for r in claims[claim].failing.values()), claim


def _claim(name: str, samples: list[float]) -> ClaimResult:
    res = ClaimResult(name, f"{name} holds", "> 0")
    res.comparisons.append(Comparison(f"gap {name}", samples, "> 0", role=PRIMARY))
    return res


def test_a_dropped_claim_is_one_row_outside_holm():
    """A claim the design does not run says so in its row and leaves Holm's family, whatever runs are around."""
    table = not_run(
        [_claim("C1", [0.1, 0.12, 0.09, 0.11]), _claim("C4", [0.05, 0.07, 0.04, 0.06])],
        {"C1": "its arm cannot be emulated here"},
    )
    judge_table(table)
    dropped, kept = table
    assert (
        dropped.verdict == NOT_TESTABLE
        and dropped.primary.reason == f"{NOT_RUN}: its arm cannot be emulated here"
    )
    assert len(dropped.comparisons) == 1 and not dropped.primary.samples
    assert kept.family == 1 and kept.alpha == pytest.approx(0.05)
    assert "not run by design: its arm cannot be emulated here" in verdict_table([c.to_dict() for c in table])


def test_a_scale_may_only_drop_its_recipes_claims(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(DEMO.replace('C3 = "no sink forms', 'C9 = "no sink forms'))
    with pytest.raises(ExperimentError, match="options.dropped maps claims of recipe.claims"):
        load_recipe(path)


def test_a_seed_sd_for_a_claim_the_scale_does_not_run_is_refused():
    with pytest.raises(ExperimentError, match="recipe demo --scale full does not judge C1"):
        plan_recipe("demo", "full", Hardware.make("cpu", 2), claim_sd={"C1": 0.1})


def test_a_plan_says_the_emulation_is_predicted(tmp_path):
    """The plan's share comes from the formula, so it reads as a prediction, never as something measured."""
    plan = plan_recipe(load_recipe(_with_the_emulated_arm(tmp_path)), "full", Hardware.make("cpu", 2))
    reason = next(c for c in plan.claims if c.claim == "C1").failing["L(γ.5)−L(γ1) @d16×4"]
    assert (
        reason.startswith("the embedding's norm would stay saturated for ≥ ")
        and "was saturated" not in reason
    )


def test_every_secondary_is_priced_at_its_familys_level_and_its_own_sd(tmp_path):
    """Each testable secondary judged over seeds is priced at Holm's first step over its claim's secondaries and
    at the sd of its own quantity (a loss gap in nats under C5, whose unit is a flow exponent); one short of 80 %
    power at the design effect is listed as such. The full demo's former γ ranking (2 seeds per γ) was."""
    plan = plan_recipe("demo", "full", Hardware.make("cpu", 2))
    c6 = next(c for c in plan.claims if c.claim.startswith("C6"))
    assert set(c6.secondaries) == set(c6.testable) - {c6.primary} and len(c6.secondaries) == 2
    for s in c6.secondaries.values():
        assert s["alpha"] == ALPHA / 2 and s["unit"] == "stable rank"
        assert s["mde_sds"] == pytest.approx(minimum_detectable_effect(1.0, s["seeds"], ALPHA / 2))
    gamma = """
[scales.full.sweeps.gamma.base]
"model.d_model" = 16
"model.n_heads" = 2
"model.n_kv_heads" = 2
"model.d_ff" = 48
[scales.full.sweeps.gamma.grid]
"model.gamma" = [0.25, 0.75, 1.25]
"train.seed" = [0, 1]
[scales.full.sweeps.gamma.arms.fixed]
"model.norm_eps" = 1e-12
"model.gate" = "elementwise"
"""
    path = tmp_path / "demo-gamma.toml"
    path.write_text(DEMO.replace("# -- quick --", gamma + "\n# -- quick --"))
    plan = plan_recipe(load_recipe(path), "full", Hardware.make("cpu", 2))
    c5 = next(c for c in plan.claims if c.claim.startswith("C5"))
    ranking = c5.secondaries["L(γ0.25)−L(γ1) @d16×4"]
    assert ranking["unit"] == "nats" and ranking["seed_sd"] == plan.seed_sd and ranking["seeds"] == 2
    assert ranking["alpha"] == ALPHA / len(c5.secondaries) and ranking["design"]["power"] < 0.05
    short = next(line for line in format_plan(plan).splitlines() if line.startswith("short of 80% power"))
    assert "C5 · L(γ0.25)−L(γ1) @d16×4 (power 0.0" in short and "with 2 seeds" in short
