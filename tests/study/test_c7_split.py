"""C7 under a flat population null with model-level decile differences: each seed pair's two models differ by
decile in a way of their own (shared by both halves of the tokens, so the token split cannot remove it), and the
population's profile is flat. The precondition (γ = 1 better on average) is judged on the same models as the
profile, so passing it selects pairs whose middle deciles happen to favour γ = 1: the old rule agreed about twice
its nominal α/2 among testable studies. Until the bins or the precondition come from other seed pairs, C7's
verdict is descriptive and never agrees or disagrees."""

from __future__ import annotations

import math

import numpy as np

from smallinit.study.judging.claims.c7 import DESCRIPTIVE, claim_c7
from smallinit.study.judging.power import ALPHA
from smallinit.study.judging.verdicts import AGREE, DISAGREE, NOT_TESTABLE

DRAWS, SEEDS = 2000, 3
# per-decile sd over seed pairs of the models' own difference (the middle and noisiest deciles vary most), and of a
# half's token noise: an illustrative regime in which the old rule's selection shows
MODEL_SD = np.array([0.001, 0.001, 0.001, 0.01, 0.04, 0.04, 0.04, 0.04, 0.04, 0.01])
TOKEN_SD = 0.002


def _studies(rng: np.random.Generator) -> list[dict[int, dict]]:
    gain = rng.normal(0.01, 0.005, (DRAWS, SEEDS, 1))  # each pair's mean gain, flat over the deciles
    model = gain + rng.normal(0, 1, (DRAWS, SEEDS, 10)) * MODEL_SD
    halves = model[None] + rng.normal(0, TOKEN_SD, (2, DRAWS, SEEDS, 10))
    return [
        {
            s: {
                "meta": {
                    "split": {
                        "gate_mean_delta_sym": float(halves[0, d, s].mean()),
                        "profile_bins": halves[1, d, s].tolist(),
                    }
                },
                "bigram_loss": 9.0,
                "mean_loss_a": 3.0,
                "mean_loss_b": 3.1,
            }
            for s in range(SEEDS)
        }
        for d in range(DRAWS)
    ]


def test_c7_under_model_level_decile_differences_never_claims_a_profile():
    verdicts = [claim_c7(g) for g in _studies(np.random.default_rng(7))]
    agree = sum(c.verdict == AGREE for c in verdicts)
    disagree = sum(c.verdict == DISAGREE for c in verdicts)
    testable = sum(c.verdict != NOT_TESTABLE for c in verdicts)
    print(
        f"\nC7, model-level decile differences: agree {agree}, disagree {disagree} of {testable} testable "
        f"({len(verdicts)} studies)"
    )
    rate = agree / max(testable, 1)
    assert rate <= ALPHA / 2 + 3 * math.sqrt(ALPHA / 2 * (1 - ALPHA / 2) / max(testable, 1))
    assert all(c.untestable.startswith(DESCRIPTIVE) for c in verdicts)
