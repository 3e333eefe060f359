"""Progress of long runs: the ETA model over cells, a recipe's overall ETA across its sweeps, and a line for
each step of the analysis that follows training."""

from __future__ import annotations

import io
import re
import time

import pytest

from smallinit.study.planning.recipes import run_recipe
from smallinit.study.running import SweepProgress

RECIPE = """
[recipe]
title = "two sweeps"
claims = ["C2", "C3"]
findings = "fig1"

[base]
"data.tokenizer" = "bytes"
"model.d_model" = 16
"model.n_layers" = 1
"model.n_heads" = 2
"model.n_kv_heads" = 2
"model.d_ff" = 32
"data.seq_len" = 16
"train.batch_size" = 2
"train.steps" = 2
"train.warmup_steps" = 1
"train.eval_every" = 0
"train.eval_batches" = 1
"train.checkpoint_every" = 0

[scales.micro.sweeps.a.grid]
"model.gamma" = [0.5, 1.0]
[scales.micro.sweeps.b.base]
"model.d_model" = 32
"""


def test_eta_models_a_fixed_overhead_plus_compute():
    p = SweepProgress("x", {"small": 1.0, "big": 10.0, "skipped": 5.0})
    assert p.eta() is None  # nothing measured yet
    p.drop("skipped")
    assert p.total == 2
    p.t0 = time.monotonic() - 6.0
    p.finish("small", wall_s=6.0, train_s=1.0)  # 5 s of overhead, 1 unit of work per second
    assert p.cell_seconds(10.0) == pytest.approx(15.0)
    assert p.eta() == pytest.approx(15.0, rel=0.01)  # 6 s of wall did 6 s of cell time: 15 s to go
    assert p.eta({"big": 0.5}) == pytest.approx(6.0 * 7.5 / 13.5, rel=0.01)  # half the big cell is done
    assert re.fullmatch(r"\[x\] 1/2 runs \| elapsed 0:00:0[67] \| ETA 0:00:1[45]", p.line())


def test_side_by_side_cells_shorten_the_eta():
    """Two cells of 10 s each finished in 10 s of wall: the rest also runs two at a time."""
    p = SweepProgress("x", {k: 1.0 for k in "abcd"})
    p.t0 = time.monotonic() - 10.0
    p.finish("a", 10.0, 8.0)
    p.finish("b", 10.0, 8.0)
    assert p.eta() == pytest.approx(10.0, rel=0.01)


def test_a_recipe_prints_an_overall_eta_and_its_analysis_steps(tmp_path):
    recipe = tmp_path / "two.toml"
    recipe.write_text(RECIPE)
    echo = io.StringIO()
    result = run_recipe(recipe, "micro", tmp_path / "out", jobs=2, echo=echo)
    assert result.exit_code == 0
    lines = echo.getvalue().splitlines()
    assert any(line.startswith("[recipe] two (micro): 2 sweep(s), 3 of 3 runs to train") for line in lines)
    overall = [line for line in lines if line.startswith("[two] ")]
    assert [line.split(" runs")[0] for line in overall] == ["[two] 1/3", "[two] 2/3", "[two] 3/3"]
    assert all(re.search(r"ETA \d+:\d\d:\d\d, then the findings$", line) for line in overall)
    assert overall[-1].endswith("ETA 0:00:00, then the findings")
    steps = [line for line in lines if line.startswith("[findings]")]
    assert "reading the finished runs" in steps[0] and steps[-1].startswith("[findings] done in ")

    echo = io.StringIO()  # run again: nothing left to train, the findings step runs again
    run_recipe(recipe, "micro", tmp_path / "out", jobs=2, echo=echo)
    text = echo.getvalue()
    assert "0 of 3 runs to train" in text and "[two] " not in text and "[findings] done in " in text
