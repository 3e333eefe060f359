"""Recipes: every shipped scale resolves; claims follow their rules; a micro recipe runs end to end."""

import csv
import json
import re

import pytest

from smallinit.cli import main
from smallinit.errors import ExperimentError
from smallinit.model import Transformer
from smallinit.study.judging.power import ALPHA, seeds_for_power
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.plan import plan_recipe
from smallinit.study.planning.recipes import (
    RECIPES_DIR,
    apply_budget,
    customise,
    load_recipe,
    recipe_names,
    run_recipe,
)
from smallinit.study.running import resolve_config

SHIPPED = [
    "condensation",
    "demo",
    "muon",
    "paper-fig1",
    "paper-fig2",
    "paper-fig3",
    "reasoning",
    "sink",
    "tokens",
]
SCALES = {  # the scales of a recipe other than micro, cpu and gpu
    "demo": {"micro", "quick", "full", "cpu-long", "gpu"},
    "muon": {"micro", "cpu"},  # smallinit's questions Q1, Q2: no GPU scale designed yet
}


def test_every_shipped_scale_resolves():
    assert recipe_names() == SHIPPED
    vocab: dict[str, int] = {}
    for name in SHIPPED:
        recipe = load_recipe(name)
        assert set(recipe.scales) == SCALES.get(name, {"micro", "cpu", "gpu"}), name
        for scale in recipe.scales.values():
            assert scale.description
            for sweep in scale.sweeps.values():
                for cell in sweep.cells():
                    resolve_config(cell, vocab)  # raises on any bad key, value or preset
                if scale.name == "gpu" and name not in (
                    "reasoning",
                    "sink",
                ):  # small task models: one GPU each
                    assert sweep.launcher.startswith("torchrun")


@pytest.mark.parametrize(("name", "tpp_", "shapes"), [("full", 20, 1), ("cpu-long", 100, 3)])
def test_budget_sets_steps_by_tokens_per_parameter(name, tpp_, shapes):
    """Every run of a shape sees the budget's tokens per non-embedding parameter, the same in every arm."""
    scale = apply_budget(load_recipe("demo").scale(name))
    steps: dict[tuple, set[int]] = {}
    for sweep in scale.sweeps.values():
        for cell in sweep.cells():
            cfg = resolve_config(cell)
            n = Transformer.count_params(cfg.model)[1]
            tpp = cfg.train.steps * cfg.train.batch_size * cfg.data.seq_len / n
            assert tpp_ <= tpp < tpp_ * 1.3, (cell.id, tpp)  # the gate's parameters are the only difference
            assert cfg.train.steps // cfg.train.eval_every >= 8 and cfg.analysis.every > 0
            steps.setdefault((cfg.model.d_model, cfg.model.n_layers), set()).add(cfg.train.steps)
    assert all(len(v) == 1 for v in steps.values()) and len(steps) == shapes


def test_demo_seeds_come_from_power():
    """The full demo's C4 primary gets the seeds seeds_for_power gives for the design effect and the CPU study's
    seed sd (docs/findings-cpu.md) at the table's strictest level α/7, its best-lr secondary (its claim's only
    testable secondary, so Holm's first step is α) at α at every rate. The claims it does not run have no runs."""
    scale = load_recipe("demo").scale("full")
    seeds = {
        (name, g): len({c.values["train.seed"] for c in sw.cells() if c.values["model.gamma"] == g})
        for name, sw in scale.sweeps.items()
        for g in (0.5, 1.0)
    }
    assert seeds["fixed", 1.0] == seeds["fixed", 0.5] == seeds_for_power(0.05, 0.048, ALPHA / 7)  # C4
    assert seeds["lr", 1.0] == seeds["lr", 0.5] == seeds_for_power(0.05, 0.048, ALPHA)  # C4 at its best lr
    assert set(scale.options["dropped"]) == {"C1", "C2", "C3", "C7"}
    assert not {"baseline", "eps-only", "eps-only-g05", "plain", "fixed-d32", "gamma"} & set(scale.sweeps)


def test_presets_and_overrides():
    scale = load_recipe("paper-fig2").scale("cpu")
    sc = customise(scale, presets=["cpu-moe-1m", "cpu-1m"], overrides=["train.steps=7", "model.n_layers=2"])
    cells = sc.sweeps["sizes"].cells()
    assert {c.size for c in cells} == {"cpu-moe-1m", "cpu-1m"} and len(cells) == 2 * 2 * 2 * 3
    cfg = resolve_config(cells[0])
    assert cfg.model.moe is not None and cfg.train.steps == 7 and cfg.model.n_layers == 2
    with pytest.raises(ExperimentError, match="sweeps that key"):
        customise(scale, overrides=["model.gamma=2.0"])


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["recipe", "paper-fig9"], "unknown recipe"),
        (["recipe", "paper-fig3", "--scale", "tpu"], "no scale 'tpu'"),
        (["recipe", "paper-fig3", "--scale", "micro", "--presets", "huge"], "unknown preset"),
        (["recipe", "paper-fig3", "--scale", "micro", "--set", "train.seed=3"], "sweeps that key"),
    ],
)
def test_recipe_errors_one_line(tmp_path, capsys, argv, expect):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expect in err, err
    assert not (tmp_path / "out").exists()


def test_micro_recipe_end_to_end(tmp_path):
    """paper-fig3 at micro scale: 3 runs + a fresh-model flow sweep; its claim numbers match the sweep's."""
    out = tmp_path / "fig3"
    result = run_recipe("paper-fig3", "micro", out, jobs=2, echo=None)
    assert result.exit_code == 0
    findings = json.loads((out / "findings.json").read_text())
    assert findings["recipe"] == "paper-fig3" and findings["n_runs"] == 3
    (c5,) = findings["claims"]
    assert c5["claim"] == "C5" and c5["verdict"] in ("agree", "disagree", "inconclusive", "not testable here")
    rows = {
        float(r["model.gamma"]): float(r["val_loss"])
        for r in csv.DictReader((out / "gamma" / "results.csv").open())
    }
    losses = {c["label"]: c for c in c5["comparisons"] if c["label"].startswith("L(")}
    assert losses["L(γ0.5)−L(γ1) @d16×1"]["samples"] == pytest.approx([rows[0.5] - rows[1.0]])
    assert losses["L(γ1.5)−L(γ1) @d16×1"]["verdict"] == "not testable here"  # 6 steps, one seed
    flow = json.loads((out / "residual_flow" / "residual_flow_sweep.json").read_text())
    flows = [c for c in c5["comparisons"] if c["label"].startswith("flow")]
    assert [x for c in flows for x in c["samples"]] == pytest.approx(
        [s - (1 - g) for g, seeds in zip(flow["gammas"], flow["seed_slopes"]) for s in seeds]
    )
    # the plan, made before anything ran, finds the same comparisons untestable, for the same reasons
    (planned,) = plan_recipe("paper-fig3", "micro", Hardware.make("cpu", 2)).claims
    real = {c["label"]: c["reason"] for c in c5["comparisons"] if c["verdict"] == "not testable here"}
    assert real and planned.failing == real
    assert set(planned.testable) == {c["label"] for c in c5["comparisons"]} - set(real)


def test_reasoning_pairs_seeds_within_each_depth(tmp_path):
    """The reasoning recipe's micro scale over two depths: each depth is its own comparison, never pooled."""
    shipped = (RECIPES_DIR / "reasoning.toml").read_text()
    recipe = tmp_path / "reasoning-depths.toml"
    recipe.write_text(
        shipped.replace(
            "[scales.micro.sweeps.gamma.grid]\n",
            '[scales.micro.sweeps.gamma.grid]\n"model.n_layers" = [1, 2]\n',
        )
    )
    out = tmp_path / "out"
    assert run_recipe(str(recipe), "micro", out, jobs=2, echo=None).exit_code == 0
    findings = json.loads((out / "findings.json").read_text())
    rows = {(r["n_layers"], r["gamma"], r["seed"]): r["heldout_reasoning"] for r in findings["anchor"]}
    assert len(rows) == 8
    (claim,) = findings["claims"]
    got = {c["label"]: c for c in claim["comparisons"]}
    for layers in (1, 2):
        c = got[f"reasoning γ1−γ0.5 @d16×{layers}"]
        assert c["seeds"] == [0, 1]
        assert c["samples"] == pytest.approx([rows[layers, 1.0, s] - rows[layers, 0.5, s] for s in (0, 1)])
    assert [(r["n_layers"], r["gamma"], r["n"]) for r in findings["anchor_by_gamma"]] == [
        (1, 0.5, 2),
        (1, 1.0, 2),
        (2, 0.5, 2),
        (2, 1.0, 2),
    ]


@pytest.mark.slow
def test_demo_micro_end_to_end(tmp_path, capsys):
    """The demo pipeline at micro scale: runs, findings, the HTML report and the printed verdict table."""
    out = tmp_path / "demo"
    assert main(["demo", "--scale", "micro", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    # what the scale can and cannot test comes first, before anything runs
    assert captured.err.startswith(f"[demo] micro: {load_recipe('demo').scale('micro').description}")
    assert "report: " in printed and (out / "report.html").is_file()
    findings = json.loads((out / "findings.json").read_text())
    assert [c["claim"] for c in findings["claims"]] == ["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
    for c in findings["claims"]:
        (primary,) = [x for x in c["comparisons"] if x["role"] == "primary"]
        assert c["verdict"] == primary["verdict"]
        assert any(line.startswith(c["claim"]) and c["verdict"] in line for line in printed.splitlines())
    assert (out / "verdicts.txt").read_text().strip() in printed
    # its plan, timed on this machine before the runs, printed beside the time it took
    said = json.loads((out / "demo.json").read_text())["plan_wall_s"]
    assert said > 0 and f"(its plan said {said / 60:.1f} min)" in printed and "[demo] plan: " in captured.err
    # the plan finds what the runs found untestable, for the same reasons, but for the preconditions that only the
    # runs can decide (it assumes they hold; where one failed, the runs' reason replaces the design's). A reason
    # is its evidence, then what follows from it: the plan's evidence is the formula, the runs' is measured, so
    # what must agree is the label and the consequence.
    planned = {c.claim: c for c in plan_recipe("demo", "micro", Hardware.make("cpu", 2)).claims}
    outcome = ("no minimum yet to rebound from", "not better on average", "bigram baseline")

    def by_label(failing: dict[str, str]) -> dict[str, str]:
        # a located minimum's step is an outcome of the runs; a plan's label names none
        return {re.sub(r"step \d+, ", "", label): why for label, why in failing.items()}

    def consequence(why: str) -> str:
        return why.rsplit(": ", 1)[-1]

    for c in findings["claims"]:
        real = by_label(
            {x["label"]: x["reason"] for x in c["comparisons"] if x["verdict"] == "not testable here"}
        )
        skip = {label for label, why in real.items() if any(o in why for o in outcome)}
        plan = by_label(planned[c["claim"]].failing)
        assert {k: consequence(v) for k, v in plan.items() if k not in skip} == {
            k: consequence(v) for k, v in real.items() if k not in skip
        }, c["claim"]


def test_no_demo_run_reads_its_corpus_twice():
    """Every demo run's tokens fit in 80 % of its corpus (the train split holds ≈ 95 % of the documents; the byte
    tokenizer gives one token per UTF-8 byte): the cpu-long study at d32 needs the large builtin corpus."""
    from smallinit.data import iter_documents

    size: dict[str, int] = {}
    for scale in ("quick", "full", "cpu-long"):
        for sweep in apply_budget(load_recipe("demo").scale(scale)).sweeps.values():
            for cell in sweep.cells():
                cfg = resolve_config(cell)
                assert cfg.data.tokenizer == "bytes"
                corpus = cfg.data.corpus
                if corpus not in size:
                    size[corpus] = sum(len(d.encode("utf-8")) + 1 for d in iter_documents(corpus))
                tokens = cfg.train.steps * cfg.train.batch_size * cfg.data.seq_len
                assert tokens < 0.8 * size[corpus], (scale, cell.id, corpus, tokens, size[corpus])


def test_recipe_refuses_an_out_that_is_a_file(tmp_path, capsys):
    from smallinit.cli import main

    taken = tmp_path / "taken"
    taken.write_text("mine")
    assert main(["recipe", "tokens", "--out", str(taken)]) == 2
    assert "is a file, not a folder; choose another --out" in capsys.readouterr().err
    assert taken.read_text() == "mine"
