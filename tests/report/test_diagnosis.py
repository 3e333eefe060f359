"""A report about the user's own run: the γ read back from the weights, and a folder that holds no study opening
with its run's diagnosis (γ, ε and the norm factor, the sink, the flow, condensation), named after the user's
folder, with no table of claims it cannot judge."""

from __future__ import annotations

import math
import re

import pytest
import torch

from smallinit import gamma_init_, measure_gamma
from smallinit.cli import main
from smallinit.measures.norm_factor import relative_factor
from smallinit.model import Transformer
from smallinit.monitor.runs import Run, find_runs
from smallinit.report import build_report
from smallinit.report.diagnosis import diagnose
from support.runs import TINY_MODEL
from support.trainers import hf_trainer

transformers = pytest.importorskip("transformers")


def tiny_llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_gamma_is_read_back_from_a_gamma_init(gamma):
    model = tiny_llama()
    gamma_init_(model, gamma, generator=torch.Generator().manual_seed(0))
    est = measure_gamma(model)
    # every matrix and the embedding: q, k, v, o, gate, up, down per layer, the embedding and the head
    assert len(est.per_matrix) == 2 * 7 + 2 and not est.not_read
    assert est.one_rule and abs(est.median - gamma) < 0.02


def test_a_fixed_std_follows_no_one_gamma():
    """Transformers' own init draws every matrix with std 0.02 (initializer_range), whatever its d_in: the γ read
    back is −ln 0.02 / ln d_in, different for d_in 32 (q_proj) and 96 (down_proj)."""
    model = tiny_llama()
    est = measure_gamma(model)
    q = est.per_matrix["model.layers.0.self_attn.q_proj.weight"]
    down = est.per_matrix["model.layers.0.mlp.down_proj.weight"]
    assert q == pytest.approx(-math.log(0.02) / math.log(32), abs=0.02)
    assert down == pytest.approx(-math.log(0.02) / math.log(96), abs=0.02)
    assert not est.one_rule


def _rows(page: str, heading: str) -> dict[str, list[str]]:
    """{first cell: the other cells} of the table under ``heading``."""
    section = page.split(heading, 1)[1].split("<h2", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", section, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", r, re.S) for r in rows]
    return {c[0]: c[1:] for c in cells if c}


def test_a_monitored_trainer_run_is_diagnosed_not_judged(tmp_path):
    out = tmp_path / "my-llama-run"
    hf_trainer(out, 40).train()
    (run,) = find_runs(out)
    assert run.name == "my-llama-run"  # the user's folder, not the monitor's subfolder
    page = build_report(out).read_text()
    assert "Your run: my-llama-run" in page and "Claims and verdicts" not in page
    assert "No claim of the paper can be judged from this run" in page
    rows = _rows(page, "Your run: my-llama-run")
    assert rows["γ at step 0"][0].startswith("1.00 from the weights at step 0")  # model_init drew γ = 1
    assert "norms saturated" not in rows["RMSNorm factor at step 0"][2]  # ε = 1e-12: the norm sees the scale
    assert set(rows) >= {"attention sink along training", "residual flow ‖h_L − e‖/‖e‖ at step 0"}
    assert "at this model&#x27;s width d = 32" in page or "at this model's width d = 32" in page


def test_a_run_the_claims_can_judge_keeps_the_claims_table(tmp_path):
    """Two seeds of γ 0.5 and 1: the folder is a study, so its claims come first and no run is diagnosed."""
    from support.report import fake_run

    for gamma in (0.5, 1.0):
        for seed in (0, 1):
            fake_run(
                tmp_path / f"g{gamma}-s{seed}",
                4.0 - gamma / 10 + seed / 100,
                f"model.gamma={gamma}",
                f"train.seed={seed}",
            )
    page = build_report(tmp_path).read_text()
    assert "Claims and verdicts" in page and "Your run:" not in page


def test_an_emulated_run_is_diagnosed_at_the_epsilon_its_norms_used(tmp_path):
    """ε = 1e-5 emulated from width 2048 at d = 32: the norms use ε·(2048/32)^2, saturate, and the formula the
    diagnosis prints agrees with them; at the nominal ε it would say 0.98 and blame ε for a chosen saturation."""
    run = tmp_path / "emulated"
    sets = [
        *TINY_MODEL,
        "model.gamma=1.0",
        "model.norm_eps=1e-5",
        "model.norm_eps_width=2048",
        "train.steps=1",
        "analysis.every=1",
        "analysis.batch_size=2",
    ]
    assert main(["train", "--out", str(run), *sum((["--set", s] for s in sets), [])]) == 0
    norm = next(f for f in diagnose(Run.load(run)).observations if f.what == "RMSNorm factor at step 0")
    eps = 1e-5 * (2048 / 32) ** 2
    formula = relative_factor(1.0, eps, 32)
    assert formula < 0.5 < relative_factor(1.0, 1e-5, 32)  # the two ε tell apart
    assert f"ε {eps:g}, d 32: {formula:.2f}" in norm.reference
    measured = float(norm.value.split("mean ")[1].split()[0])
    assert measured == pytest.approx(formula, abs=0.1)  # the norms agree with the formula it prints
    assert "as this run emulates" in norm.meaning and "set_norm_eps_" not in norm.meaning


def _train(out, *sets: str) -> Run:
    assert main(["train", "--out", str(out), *sum((["--set", s] for s in (*TINY_MODEL, *sets)), [])]) == 0
    return Run.load(out)


def test_a_run_is_diagnosed_from_the_audit_of_its_weights(tmp_path):
    """Output projections drawn at 1/√(2L) of the γ rule and ε = 0.1 (saturating at d = 32): the diagnosis names
    the recipe the step-0 weights follow, each norm's factor and ε at step 0 as the Monitor measured them on those
    very weights during training, and, 20 steps on, no matrix still as drawn."""
    run = _train(
        tmp_path / "depth",
        'model.init_scales=["output=depth"]',
        "model.norm_eps=0.1",
        "data.corpus=shakespeare",
        "train.batch_size=8",
        "train.warmup_steps=2",
        "train.steps=20",
        "train.lr=0.01",
        "analysis.every=20",
        "analysis.batch_size=2",
    )
    seen = {o.what: o for o in diagnose(run).observations}
    recipe = seen["init recipe at step 0"]
    k = float(re.search(r"1/√\(([\d.]+)·L\), L = 2", recipe.value).group(1))
    assert k == pytest.approx(2.0, rel=0.15) and "output projections" in recipe.meaning
    # the Monitor's own step-0 record, measured in training: the audit rebuilt exactly those weights and batch
    factors = next(a.norm_factor for a in run.analysis if a.step == 0)
    norm = seen["RMSNorm factor at step 0"]
    low, mean = min(factors.values()), sum(factors.values()) / len(factors)
    assert norm.value == f"min {low:.3f}, mean {mean:.3f} over {len(factors)} norms"
    assert "ε = 0.1" in norm.meaning and f"{len(factors)} of {len(factors)} norms saturated" in norm.meaning
    fresh = seen["matrices still fresh-random at step 20"]
    assert fresh.value == "0 of 17 matrices" and "every matrix" in fresh.meaning


def test_matrices_a_run_did_not_move_are_named(tmp_path):
    """Two steps at a learning rate of 1e-8 leave every matrix as drawn: the diagnosis says so, per matrix,
    without a Monitor (analysis.every = 0): the audit reads the weights, not the records."""
    run = _train(tmp_path / "still", "train.steps=2", "train.lr=1e-8", "analysis.every=0")
    assert not run.analysis
    seen = {o.what: o for o in diagnose(run).observations}
    fresh = seen["matrices still fresh-random at step 2"]
    assert fresh.value.startswith("17 of 17 matrices (embed.weight, ")
    assert "not trained" in fresh.meaning
    assert seen["init recipe at step 0"].value == "fan-in γ = 1.000 in every role"
    assert seen["RMSNorm factor at step 0"].value.startswith("min 1.000")  # ε = 1e-12 at γ = 1


def test_a_model_too_large_to_audit_here_is_named_with_the_command_that_audits_it(tmp_path):
    """The report audits a run by building its step-0 model and loading its checkpoint on the CPU; past its limit
    (here ≈ 300M parameters: 2.3 GiB) it builds nothing and says, in one row, what to run instead."""
    from support.report import fake_run

    fake_run(tmp_path / "big", 3.0, "model.d_model=2048", "model.d_ff=8192", "model.n_layers=4")
    run = Run.load(tmp_path / "big", "big")
    (unread,) = [o for o in diagnose(run).observations if o.what == "the weights (smallinit audit)"]
    assert unread.value == "not read here" and f"smallinit audit {run.path}" in unread.meaning
    n = Transformer.count_params(run.cfg.model)[0]
    assert unread.meaning.startswith(f"{round(n / 1e6)}M parameters: the report audits models up to 100M")
    small = tmp_path / "small"
    fake_run(small, 3.0)
    seen = {o.what: o for o in diagnose(Run.load(small, "small"), max_params=1000).observations}
    assert seen["the weights (smallinit audit)"].value == "not read here"
    assert "init recipe at step 0" not in seen
    assert "init recipe at step 0" in {o.what for o in diagnose(Run.load(small, "small")).observations}
