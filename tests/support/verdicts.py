"""Synthetic finished runs for the claims' tests: a validation curve, analysis records, a config."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from smallinit.monitor.runs import Run
from smallinit.study.judging.claims import FIXED

PARAMS = 1000  # non-embedding parameters of every synthetic run; 1 × 10 tokens per step → 1 token/param per 100 steps


NO_GATE = {"model.norm_eps": 1e-12, "model.gate": "none"}  # ε fixed, no gate (FIXED has both fixes)


def make_run(
    root: Path,
    *,
    gamma: float,
    seed: int,
    arm: dict,
    d: int = 16,
    final: float,
    start: float = 5.0,
    tpp: float = 40,
    evals: int = 8,
    curve=None,
    analysis: list[dict] | None = None,
    lr: float = 3e-3,
    n_seq: int = 16,
    seq_len: int = 10,
    train: dict | None = None,
) -> Run:
    """A finished run whose validation loss falls from ``start`` to ``final`` (or follows ``curve(frac)``); ``train``
    adds keys to its train config (the optimizer, weight decay, schedule)."""
    steps = int(tpp * PARAMS / seq_len)
    model = {
        "d_model": d,
        "n_layers": 4,
        "n_heads": 2,
        "n_kv_heads": 2,
        "d_ff": 3 * d,
        "gamma": gamma,
        "norm_eps_width": 0,
        **{k.split(".")[1]: v for k, v in arm.items()},
    }
    cfg = {
        "model": model,
        "train": {"seed": seed, "steps": steps, "batch_size": 1, "lr": lr, **(train or {})},
        "data": {"seq_len": seq_len},
        "analysis": {"batch_size": n_seq},
    }
    name = (
        f"d{d}_g{gamma}_s{seed}_{arm['model.norm_eps']}_{arm['model.gate']}_{model['norm_eps_width']}_lr{lr}"
    )
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg))
    curve = curve or (lambda f: final + (start - final) * math.exp(-5 * f) - (start - final) * math.exp(-5))
    every = steps // evals
    lines = [{"step": s, "val_loss": curve(s / steps)} for s in range(0, steps + 1, every)]
    lines += [{"event": "analysis", **rec} for rec in (analysis or [])]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    (path / "summary.json").write_text(
        json.dumps({"step": steps, "val_loss": curve(1.0), "params_nonembed": PARAMS})
    )
    return Run.load(path)


def sink_record(steps: int, per_layer: list[float]) -> list[dict]:
    return [
        {
            "step": steps,
            "sink": {str(i): v for i, v in enumerate(per_layer)},
            "sink_mean": float(np.mean(per_layer)),
        }
    ]


def c3_runs(folder: Path, sink: float, d: int = 16, seq_len: int = 256, n_seq: int = 16) -> list[Run]:
    """C3's grid at one size: γ {0.5, 1} × gate {none, elementwise} × 3 seeds. The no-gate γ = 1 runs' first layer
    has sink score ``sink`` (uniform attention elsewhere); the gate lowers the loss by 0.05."""
    steps, runs = int(40 * PARAMS / seq_len), []
    for seed in range(3):
        for g in (0.5, 1.0):
            s = sink if g == 1.0 else 0.02
            runs.append(
                make_run(
                    folder,
                    gamma=g,
                    seed=seed,
                    arm=NO_GATE,
                    d=d,
                    final=3.05,
                    seq_len=seq_len,
                    n_seq=n_seq,
                    analysis=sink_record(steps, [s + 0.001 * seed * g, 0.02]),
                )
            )
            runs.append(
                make_run(
                    folder,
                    gamma=g,
                    seed=seed,
                    arm=FIXED,
                    d=d,
                    final=3.0,
                    seq_len=seq_len,
                    n_seq=n_seq,
                    analysis=sink_record(steps, [0.02 + 0.0003 * seed**2, 0.02]),
                )
            )
    return runs


def srank_records(ranks: list[float], steps: int) -> list[dict]:
    at = np.linspace(0, steps, len(ranks)).astype(int)
    return [{"step": int(s), "stable_rank": {"m": r}} for s, r in zip(at, ranks)]
