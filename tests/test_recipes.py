"""Recipes: every shipped scale resolves; claims follow their rules; a micro recipe runs end to end."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from smallinit.cli import main
from smallinit.errors import ExperimentError
from smallinit.experiments.claims import BASELINE, FIXED, Runs, claim_c1, claim_c4, claim_c7, combine
from smallinit.experiments.recipes import customise, load_recipe, recipe_names, run_recipe
from smallinit.experiments.sweep import resolve_config
from smallinit.report.verdict import verdict_paired
from smallinit.train.runs import Run

SHIPPED = ["condensation", "demo", "paper-fig1", "paper-fig2", "paper-fig3", "reasoning", "tokens"]


def test_every_shipped_scale_resolves():
    assert recipe_names() == SHIPPED
    vocab: dict[str, int] = {}
    for name in SHIPPED:
        recipe = load_recipe(name)
        expected = {"micro", "quick", "full"} if name == "demo" else {"micro", "cpu", "gpu"}
        assert set(recipe.scales) == expected, name
        for scale in recipe.scales.values():
            assert scale.description
            for sweep in scale.sweeps.values():
                for cell in sweep.cells():
                    resolve_config(cell, vocab)  # raises on any bad key, value or preset
                if scale.name == "gpu" and name != "reasoning":  # anchor models are small: one GPU each
                    assert sweep.launcher.startswith("torchrun")


def test_presets_and_overrides():
    scale = load_recipe("paper-fig2").scale("cpu")
    sc = customise(scale, presets=["cpu-moe-1m", "cpu-1m"], overrides=["train.steps=7", "model.n_layers=2"])
    cells = sc.sweeps["sizes"].cells()
    assert {c.size for c in cells} == {"cpu-moe-1m", "cpu-1m"} and len(cells) == 2 * 2 * 2 * 3
    cfg = resolve_config(cells[0])
    assert cfg.model.moe is not None and cfg.train.steps == 7 and cfg.model.n_layers == 2
    with pytest.raises(ExperimentError, match="sweeps that key"):
        customise(scale, overrides=["model.gamma=2.0"])


@pytest.mark.parametrize("argv, expect", [
    (["recipe", "paper-fig9"], "unknown recipe"),
    (["recipe", "paper-fig3", "--scale", "tpu"], "no scale 'tpu'"),
    (["recipe", "paper-fig3", "--scale", "micro", "--presets", "huge"], "unknown preset"),
    (["recipe", "paper-fig3", "--scale", "micro", "--set", "train.seed=3"], "sweeps that key"),
])
def test_recipe_errors_one_line(tmp_path, capsys, argv, expect):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expect in err, err
    assert not (tmp_path / "out").exists()


def synthetic_runs(loss, sizes=(32, 64, 128), seeds=(0, 1, 2), arms=(BASELINE, FIXED)) -> Runs:
    """Runs that exist only as numbers: loss(d, γ, arm, seed) -> val loss; N = 1000·d² parameters."""
    runs = []
    for d in sizes:
        for arm in arms:
            for gamma in (0.5, 1.0):
                for seed in seeds:
                    cfg = {"model.d_model": d, "model.n_layers": 4, "model.n_heads": 4, "model.d_ff": 4 * d,
                           "model.gamma": gamma, "train.seed": seed, "model.moe.num_experts": None, **arm}
                    summary = {"val_loss": loss(d, gamma, arm, seed), "params_nonembed": 1000 * d * d}
                    runs.append(Run(Path("."), f"d{d}", cfg, summary))
    return Runs(runs)


def test_c1_verdicts_follow_the_data():
    rng = np.random.default_rng(0)
    noise = {s: rng.normal(0, 1e-3) for s in range(3)}
    shrinking = synthetic_runs(lambda d, g, arm, s: 3.0 + (0.05 * 32 / d if g == 0.5 else 0.0) + noise[s])
    c1 = claim_c1(shrinking)
    gains = [c.mean for c in c1.comparisons[:3]]
    assert gains == pytest.approx([0.05, 0.025, 0.0125], abs=1e-9)  # seeds share noise: paired
    assert [c.verdict for c in c1.comparisons] == ["agree"] * 4 and c1.verdict == "agree"
    reversed_ = synthetic_runs(lambda d, g, arm, s: 3.0 + (0.05 if g == 1.0 else 0.0) + rng.normal(0, 1e-3))
    c1r = claim_c1(reversed_)
    assert c1r.verdict == "disagree"
    for comp in c1r.comparisons:  # every comparison judged by the project's one rule
        assert comp.verdict == verdict_paired(comp.samples, "positive").label
    one_seed = synthetic_runs(lambda d, g, arm, s: 3.0 + (0.05 if g == 0.5 else 0.0), seeds=(0,))
    assert claim_c1(one_seed).verdict == "inconclusive"
    assert combine(["agree", "inconclusive"]) == "inconclusive" and combine(["agree", "disagree"]) == "disagree"


def test_c7_verdicts_follow_where_the_gain_lies():
    """Δ_sym per difficulty decile over three seeds: peaked in the middle, on the easiest, or nowhere."""
    rng = np.random.default_rng(2)

    def gaps(shape):
        return {s: {"bins": [{"mean_delta_sym": float(v + rng.normal(0, 1e-3))} for v in shape]} for s in range(3)}

    middle = claim_c7(gaps([0.0, 0.0, 0.0, 0.02, 0.05, 0.06, 0.06, 0.05, 0.04, 0.01]))
    assert middle.verdict == "agree"
    assert middle.comparisons[0].mean == pytest.approx(0.052, abs=2e-3)  # mean of deciles 5–9 minus 1–3
    assert claim_c7(gaps([0.06, 0.05, 0.05, 0.02, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])).verdict == "disagree"
    assert claim_c7(gaps([0.01] * 10)).verdict == "inconclusive"
    assert claim_c7(None).verdict == "inconclusive"


def test_c4_effective_size_recovers_a_known_shift():
    """Treated runs reach the baseline law at 1.44 × their size: the effective size gain is +44 %."""
    rng = np.random.default_rng(1)
    law = lambda n: 2.0 + 40.0 * n ** -0.35  # noqa: E731

    def loss(d, gamma, arm, seed):
        n = 1000 * d * d
        return law(n * (1.44 if gamma == 1.0 else 1.0)) * math.exp(rng.normal(0, 5e-4))

    c4 = claim_c4(synthetic_runs(loss, sizes=(16, 32, 64, 128, 256)), n_boot=200)
    esg = c4.extra["effective_size_gain"]
    assert abs(esg["gain"] - 0.44) < 0.05 and esg["lo"] > 0
    assert c4.verdict == "agree" and c4.comparisons[-1].estimate == pytest.approx(esg["gain"])


def test_micro_recipe_end_to_end(tmp_path):
    """paper-fig3 at micro scale: 3 runs + a fresh-model flow sweep; its claim numbers match the sweep's."""
    out = tmp_path / "fig3"
    result = run_recipe("paper-fig3", "micro", out, jobs=2, echo=None)
    assert result.exit_code == 0
    findings = json.loads((out / "findings.json").read_text())
    assert findings["recipe"] == "paper-fig3" and findings["n_runs"] == 3
    (c5,) = findings["claims"]
    assert c5["claim"] == "C5" and c5["verdict"] in ("agree", "disagree", "inconclusive")
    rows = {float(r["model.gamma"]): float(r["val_loss"])
            for r in csv.DictReader((out / "gamma" / "results.csv").open())}
    losses = {c["label"]: c for c in c5["comparisons"] if c["label"].startswith("L(")}
    assert losses["L(γ0.5)−L(γ1) @d16×1"]["samples"] == pytest.approx([rows[0.5] - rows[1.0]])
    assert losses["L(γ1.5)−L(γ1) @d16×1"]["verdict"] == "inconclusive"  # one seed: no spread
    flow = json.loads((out / "residual_flow" / "residual_flow_sweep.json").read_text())
    flows = [c for c in c5["comparisons"] if c["label"].startswith("flow")]
    assert [x for c in flows for x in c["samples"]] == pytest.approx(
        [s - (1 - g) for g, seeds in zip(flow["gammas"], flow["seed_slopes"]) for s in seeds])


@pytest.mark.slow
def test_demo_micro_end_to_end(tmp_path, capsys):
    """The demo pipeline at micro scale: runs, findings, the HTML report and the printed verdict table."""
    out = tmp_path / "demo"
    assert main(["demo", "--scale", "micro", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "report: " in printed and (out / "report.html").is_file()
    findings = json.loads((out / "findings.json").read_text())
    assert [c["claim"] for c in findings["claims"]] == ["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
    for c in findings["claims"]:
        assert c["verdict"] == combine(x["verdict"] for x in c["comparisons"])
        assert any(line.startswith(c["claim"]) and c["verdict"] in line for line in printed.splitlines())
    assert (out / "verdicts.txt").read_text().strip() in printed
