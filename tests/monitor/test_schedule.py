"""One schedule rule each for evaluations, analysis records and norm-factor records, on the config: a real
training run records exactly at its steps (fresh and resumed), the engine-neutral Monitor measures at them, and
the planner plans exactly them for every cell of the demo recipe."""

from __future__ import annotations

import json

import pytest
import torch

from smallinit import Monitor
from smallinit.config import AnalysisConfig, Config, TrainConfig
from smallinit.model import Transformer
from smallinit.study.planning.cost import Hardware
from smallinit.study.planning.decidability import PlannedRun
from smallinit.study.planning.plan import plan_recipe
from smallinit.study.planning.recipes import apply_budget, customise, load_recipe
from smallinit.study.running import resolve_config
from smallinit.train import Callback, Trainer
from support.runs import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=4",
    "train.warmup_steps=2",
    "train.eval_batches=1",
    "train.log_every=5",
    "analysis.batch_size=2",
]


def tiny(*extra: str) -> Config:
    return Config.load(overrides=[*TINY, *extra])


def steps_of(recs: list[dict]) -> dict[str, list[int]]:
    """The steps of the evaluations, the analysis records and the norm-factor records among ``recs``."""
    return {
        "eval": [r["step"] for r in recs if "val_loss" in r and "event" not in r],
        "analysis": [r["step"] for r in recs if r.get("event") == "analysis"],
        "norms": [r["step"] for r in recs if r.get("event") == "norm_factor"],
    }


def recorded(run) -> dict[str, list[int]]:
    return steps_of([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()])


def ruled(cfg: Config, start: int = 0) -> dict[str, list[int]]:
    total = cfg.train.steps
    return {
        "eval": cfg.train.eval_steps(start),
        "analysis": cfg.analysis.steps(total, start),
        "norms": cfg.analysis.norm_steps(total, start),
    }


def test_the_rules_give_todays_steps():
    """Pinned, so the rule itself cannot drift: step 0 and every eval_every, always the last step; analysis at
    multiples of every (not the last step unless it is one); a resumed run's steps after its checkpoint's."""
    assert TrainConfig(steps=23, eval_every=5).eval_steps() == [0, 5, 10, 15, 20, 23]
    assert TrainConfig(steps=23, eval_every=5).eval_steps(start=10) == [15, 20, 23]
    assert TrainConfig(steps=20, eval_every=5).eval_steps() == [0, 5, 10, 15, 20]
    assert TrainConfig(steps=23, eval_every=0).eval_steps() == [23]
    assert TrainConfig(steps=23, eval_every=5).eval_steps(start=23) == []
    assert AnalysisConfig(every=4).steps(23) == [0, 4, 8, 12, 16, 20]
    assert AnalysisConfig(every=4).steps(23, start=8) == [12, 16, 20]
    assert AnalysisConfig(every=0, norm_every=3).steps(23) == []
    assert AnalysisConfig(norm_every=10).norm_steps(23) == [0, 10, 20]


@pytest.mark.parametrize("every", [0, 1, 3, 7])
def test_the_step_lists_are_the_predicates(every):
    """The lists ask only multiples and the last step: they must agree with the predicates at every step."""
    for total in range(1, 16):
        for start in range(total + 1):
            first = start + 1 if start else 0
            tc, ac = TrainConfig(steps=total, eval_every=every), AnalysisConfig(every=every, norm_every=every)
            assert tc.eval_steps(start) == [s for s in range(first, total + 1) if tc.evaluates(s)]
            assert ac.steps(total, start) == [s for s in range(first, total + 1) if ac.analyses(s)]
            assert ac.norm_steps(total, start) == [s for s in range(first, total + 1) if ac.measures_norms(s)]


@pytest.mark.parametrize(
    "overrides",
    [
        (
            "train.steps=23",
            "train.eval_every=5",
            "analysis.every=4",
            "analysis.norm_every=3",
        ),  # 23 ∤ 5, 4 or 3
        ("train.steps=7", "train.eval_every=0"),  # the last step only, analysis off
        ("train.steps=9", "train.eval_every=3", "analysis.norm_every=2"),  # norm factors alone
    ],
)
def test_a_training_run_records_at_the_rules_steps(tmp_path, overrides):
    cfg = tiny(*overrides)
    Trainer(cfg, tmp_path / "run", callbacks=[]).fit()
    assert recorded(tmp_path / "run") == ruled(cfg)


def test_a_resumed_run_records_at_the_rules_steps(tmp_path):
    """Stopped at step 12 (checkpoint at 10): the resumed fit records the steps after 10, the log the whole run's."""
    args = (
        "train.steps=23",
        "train.eval_every=5",
        "train.checkpoint_every=5",
        "analysis.every=4",
        "analysis.norm_every=3",
    )

    class StopAt12(Callback):
        def on_step_end(self, trainer, record):
            if trainer.step == 12:
                raise KeyboardInterrupt

    class Seen(Callback):
        def __init__(self):
            self.records: list[dict] = []

        def on_log(self, trainer, record):
            self.records.append(record)

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny(*args), run, callbacks=[StopAt12()]).fit()
    seen = Seen()
    cfg = tiny(*args)
    trainer = Trainer(cfg, run, resume=True, callbacks=[seen])
    assert trainer.step == 10
    trainer.fit()
    assert steps_of(seen.records) == ruled(cfg, start=10)
    assert recorded(run) == ruled(cfg)


def test_the_monitor_without_a_config_measures_at_its_every(tmp_path):
    """Engine-neutral: Monitor(every=N) called at every step measures at AnalysisConfig(every=N)'s steps."""
    model = Transformer(tiny().model)
    batch = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    with Monitor(model, every=3, norm_every=5, batch=batch, out=tmp_path / "mon", total_steps=11) as mon:
        for step in range(12):
            mon(step)
    got = recorded(tmp_path / "mon")
    assert got["analysis"] == AnalysisConfig(every=3).steps(11) == [0, 3, 6, 9]
    assert got["norms"] == AnalysisConfig(norm_every=5).norm_steps(11) == [0, 5, 10]


# Schedules the demo does not have: steps a multiple of every period or of none, evaluations and analysis off
SCHEDULES = """
[recipe]
title = "schedules"
claims = ["C5"]
findings = "claims"
[base]
"model.d_model" = 16
"model.n_layers" = 1
"model.n_heads" = 2
"model.n_kv_heads" = 2
"model.d_ff" = 32
"data.tokenizer" = "bytes"
"data.seq_len" = 32
"train.batch_size" = 4
"train.steps" = 20
[scales.s]
description = "d"
[scales.s.sweeps.a.grid]
"train.eval_every" = [0, 3, 5]
"analysis.every" = [0, 4, 7]
"analysis.norm_every" = [0, 5]
"""


@pytest.mark.parametrize(
    "recipe, scale",
    [("demo", "quick"), ("demo", "full"), (SCHEDULES, "s")],
    ids=["demo-quick", "demo-full", "schedules"],
)
def test_the_planner_plans_the_rules_steps(tmp_path, recipe, scale):
    if recipe == SCHEDULES:
        (tmp_path / "schedules.toml").write_text(SCHEDULES)
        recipe = tmp_path / "schedules.toml"
    vocab: dict[str, int] = {}
    sc = apply_budget(customise(load_recipe(recipe).scale(scale)), vocab)
    configs = {
        (name, cell.id): resolve_config(cell, vocab) for name, sw in sc.sweeps.items() for cell in sw.cells()
    }
    plan = plan_recipe(load_recipe(recipe), scale, Hardware.make("cpu", 2))
    assert sorted((c.sweep, c.cell) for c in plan.cells) == sorted(configs)
    for cell in plan.cells:
        cfg = configs[cell.sweep, cell.cell]
        assert (cell.steps, cell.evaluations, cell.analysis_records) == (
            cfg.train.steps,
            len(cfg.train.eval_steps()),
            len(cfg.analysis.steps(cfg.train.steps)),
        )
    for (name, cell_id), cfg in configs.items():  # the records a planned run holds, step by step
        run = PlannedRun(name, cell_id, cfg, 1000)
        assert {
            "eval": [r.step for r in run.evals],
            "analysis": [r.step for r in run.analysis],
            "norms": [r.step for r in run.norm_records],
        } == ruled(cfg)
