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
