"""Sink scores and Sink_ε are exact on planted attention: a real smallinit Transformer whose queries and keys are
set so that each head puts a known weight on key 0, measured through the path training's analysis records use
(measure_activations: the model's captured post-RoPE q/k), and the records' sink levels reach the findings."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from smallinit.config import ModelConfig
from smallinit.measures.activations import measure_activations
from smallinit.measures.sink import attention_roles
from smallinit.model import Transformer
from smallinit.monitor.runs import Run
from smallinit.study.judging.claims import Runs, sink_formed
from smallinit.study.planning.recipes import RECIPES_DIR, run_recipe

T, HD = (
    32,
    4,
)  # head_dim 4: RoPE pairs (0, 2) at frequency 1 and (1, 3) at θ^(-1/2) ≈ 0, where the signal lives
STRENGTH = {
    0: [0.0, 1.0, 2.5, 6.0],
    1: [3.5, 0.0, 0.0, 8.0],
}  # score S of every query on key 0, per layer and head


def expected_head(s: float) -> float:
    """Query i (0-based, i ≥ 1) scores S on key 0 and 0 on keys 1…i: weight e^S / (e^S + i), averaged over i."""
    return float(np.mean([math.exp(s) / (math.exp(s) + i) for i in range(1, T)]))


def planted_model() -> Transformer:
    heads = len(STRENGTH[0])
    d = heads * HD
    cfg = ModelConfig(
        d_model=d,
        n_layers=2,
        n_heads=heads,
        n_kv_heads=heads,
        d_ff=8,
        vocab_size=3,
        max_seq_len=T,
        gamma=1.0,
        norm_eps=1e-12,
        gate="none",
        rope_theta=1e16,
    )
    model = Transformer(cfg, seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for n in (model.norm, *[m for b in model.blocks for m in (b.attn_norm, b.mlp_norm)]):
            n.weight.fill_(1.0)
        model.embed.weight[0, 0] = math.sqrt(d)  # token 0 (the BOS) along e_0, every other token along e_1,
        model.embed.weight[1:, 1] = math.sqrt(d)  # so each normed input is a unit basis vector × √d
        for layer, block in enumerate(
            model.blocks
        ):  # o_proj and the MLP stay 0: every block sees the embedding
            for h, s in enumerate(STRENGTH[layer]):
                block.attn.k_proj.weight[h * HD + 1, 0] = 1 / math.sqrt(d)  # k = 1 on the BOS, 0 elsewhere
                block.attn.q_proj.weight[h * HD + 1, 1] = s * math.sqrt(HD) / math.sqrt(d)  # q·k/√hd = S
    return model


def test_sink_and_sink_eps_are_exact_on_planted_attention():
    tokens = torch.ones(3, T, dtype=torch.long)
    tokens[:, 0] = 0
    sink = measure_activations(planted_model(), tokens).sink
    want = {layer: [expected_head(s) for s in strengths] for layer, strengths in STRENGTH.items()}
    assert np.allclose(sink.per_head, [want[0], want[1]], atol=1e-6)
    assert sink.per_layer == pytest.approx([np.mean(want[0]), np.mean(want[1])], abs=1e-6)
    heads = np.array([want[0], want[1]])
    for eps in (0.3, 0.8):
        assert sink.share_above[eps] == pytest.approx(float(np.mean(heads > eps)))
    assert 0 < sink.share_above[0.8] < sink.share_above[0.3] < 1  # the thresholds split the heads


def test_attention_roles_are_exact_on_planted_attention():
    """Query i scores S on key 0 and 0 on keys 1…i: weight e^S/(e^S + i) on the first token, 1/(e^S + i) on itself
    and on the previous token; split between marked and other queries."""
    tokens = torch.ones(2, T, dtype=torch.long)
    tokens[:, 0] = 0
    marked = torch.zeros(2, T, dtype=torch.bool)
    marked[:, 5::7] = True
    roles = attention_roles(planted_model(), tokens, marked)
    for kind, queries in (("marked", range(5, T, 7)), ("other", [i for i in range(2, T) if (i - 5) % 7])):
        for layer, strengths in STRENGTH.items():
            z = [[math.exp(s) + i for i in queries] for s in strengths]
            assert roles[f"first/{kind}"][layer] == pytest.approx(
                [np.mean([math.exp(s) / zi for zi in zs]) for s, zs in zip(strengths, z)], abs=1e-6
            )
            for role in ("self", "previous"):
                assert roles[f"{role}/{kind}"][layer] == pytest.approx(
                    [np.mean([1 / zi for zi in zs]) for zs in z], abs=1e-6
                )
            entropy = [
                np.mean(
                    [
                        -(math.exp(s) / zi) * math.log(math.exp(s) / zi) + i / zi * math.log(zi)
                        for i, zi in zip(queries, zs)
                    ]
                )
                for s, zs in zip(strengths, z)
            ]
            assert roles[f"entropy/{kind}"][layer] == pytest.approx(entropy, abs=1e-5)


def test_the_sink_recipe_reports_every_arm_along_training(tmp_path):
    """Two micro runs of the sink recipe (γ = 1, gate none and headwise): the findings carry each arm's sink per
    layer and Sink_ε at every analysis step from init, equal to the runs' own records, and C3's note gives Sink_ε."""
    shipped = (RECIPES_DIR / "sink.toml").read_text()
    recipe = tmp_path / "sink-two.toml"
    recipe.write_text(
        shipped.replace(
            '"model.gamma" = [0.5, 1.0]\n"model.gate" = ["none", "headwise", "elementwise"]\n'
            '"train.seed" = [0]',
            '"model.gamma" = [1.0]\n"model.gate" = ["none", "headwise"]\n"train.seed" = [0]',
        )
    )
    out = tmp_path / "out"
    assert run_recipe(str(recipe), "micro", out, jobs=2, echo=None).exit_code == 0
    findings = json.loads((out / "findings.json").read_text())
    along = {row["gate"]: row for row in findings["sink_along_training"]}
    assert set(along) == {"none", "headwise"}
    for gate, row in along.items():
        records = [r for r in Run.load(out / "grid" / "cells" / f"gamma-1.0_gate-{gate}_seed-0").analysis]
        assert row["steps"] == [r.step for r in records] == [0, 3, 6]
        assert row["per_layer"] == [list(r.sink.per_layer) for r in records]
        assert row["share_above"] == [{str(eps): v for eps, v in r.sink.share_above.items()} for r in records]
    assert {row["gate"] for row in findings["sinks"]} == {"none", "headwise"}
    assert all(set(row["share_above"]) == {"0.3", "0.8"} for row in findings["sinks"])
    assert list(findings["optimal_loss"]) == ["builtin:sink?alpha=0.1"]
    assert {(row["gate"], row["seed"]) for row in findings["attention_roles"]} == {
        ("none", 0),
        ("headwise", 0),
    }
    assert all(len(row["roles"]["first/other"]) == 1 for row in findings["attention_roles"])  # one layer
    _, note = sink_formed(Runs.load(out).where({"model.gate": "none"}))  # C3's precondition note, as printed
    assert f"Sink_0.3 {along['none']['share_above'][-1]['0.3']:.2f}" in note
