"""Run folders as training leaves them, with planted losses, and token-gap results, for the report's tests."""

from __future__ import annotations

import json

from support.runs import TINY_MODEL


def fake_run(folder, loss: float, *sets: str, finished: bool = True) -> None:
    """A run folder as training leaves it (config, a validation curve, the summary once finished), with a
    planted final loss."""
    from smallinit import Config

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps(Config.load(overrides=[*TINY_MODEL, "train.steps=4", *sets]).to_dict())
    )
    last = 4 if finished else 2
    (folder / "metrics.jsonl").write_text(
        f'{{"step": 0, "val_loss": 5.5}}\n{{"step": {last}, "val_loss": {loss}}}\n'
    )
    if finished:
        (folder / "summary.json").write_text(json.dumps({"step": 4, "val_loss": loss}))


def gap_result(seed: int, shift: float):
    from smallinit.analysis.tokens import DifficultyBin, TokenGapResult

    bins = [
        DifficultyBin(
            lo=i,
            hi=i + 1,
            count=100,
            mean_difficulty=i + 0.5,
            mean_delta_sym=shift + 0.1 * i,
            se_delta_sym=0.01,
            mean_loss_diff=shift + 0.2 * i,
            se_loss_diff=0.02,
        )
        for i in range(4)
    ]
    settings = [{"model.gamma": g, "model.d_model": 16, "train.seed": seed} for g in (1.0, 0.5)]
    return TokenGapResult(
        tokens=400,
        mean_delta_sym=shift,
        mean_loss_a=3.0,
        mean_loss_b=3.1,
        bins=bins,
        top_a=[],
        top_b=[],
        meta={
            "label_a": f"γ=1 (seed {seed})",
            "label_b": f"γ=0.5 (seed {seed})",
            "settings_a": settings[0],
            "settings_b": settings[1],
        },
    )
