"""transformers' Trainer under DeepSpeed ZeRO-3, for real: 2 gloo ranks under torchrun, a tiny Llama built from
its config. γ-init draws each partitioned matrix whole, so the weights are one process's draw; the Monitor
gathers the matrices it measures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _zero3_worker import config
from smallinit.cli import main
from smallinit.measures.condensation import sampled_mean_abs_cos, stable_rank
from smallinit.monitor.records import parse_record
from support.monitor import records

pytestmark = pytest.mark.engines
pytest.importorskip("deepspeed")
WORKER = Path(__file__).parents[1] / "_zero3_worker.py"
DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def torchrun(*args: str | Path, cwd: Path | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    r = subprocess.run(
        [*cmd, str(WORKER), *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=400
    )
    assert r.returncode == 0, r.stderr[-4000:]


def unsharded():
    from smallinit.integrations.hf import model_init

    return model_init(config(), gamma=1.0, norm_eps=1e-12, seed=0)()


def test_model_init_under_zero3_draws_what_one_process_draws(tmp_path):
    torchrun("init", tmp_path)
    got = torch.load(tmp_path / "zero3.pt")
    want = dict(unsharded().named_parameters())
    assert set(got["partitioned"]) == set(want)  # every parameter was a slice on each rank
    for name, p in want.items():
        assert got["weights"][name].shape == p.shape, name
        assert torch.equal(got["weights"][name], p), name  # the same seed, the same numbers
    q = got["weights"]["model.layers.0.self_attn.q_proj.weight"]
    assert q.std().item() == pytest.approx(1 / 32, rel=0.1)  # σ = d_in^-1, d_in 32


def test_the_docs_trainer_under_zero3_is_measured_and_reported(tmp_path):
    """The docs' example (the worker's tiny Llama, 20 steps) run as written, checked against one process."""
    section = DOC.read_text(encoding="utf-8").split("\n## DeepSpeed ZeRO-3\n")[1]
    (block,) = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    (tmp_path / "train_zero3.py").write_text(block)
    torchrun("script", tmp_path / "train_zero3.py", cwd=tmp_path)
    folder = tmp_path / "runs/zero3/smallinit"
    recs = [parse_record(r) for r in records(folder)]
    assert [r.step for r in recs] == [0, 10, 20]
    first = recs[0]
    # step 0 is the drawn model: its statistics are those of one process's draw, measured whole; every weight
    # matrix is watched (none of them a skipped (0,) slice)
    model = dict(unsharded().named_parameters())
    matrices = {name for name, p in model.items() if p.ndim == 2}
    ranks, cos = first.by_matrix("stable_rank"), first.by_matrix("mean_abs_cos")
    assert set(ranks) == set(cos) == matrices and len(matrices) == 16
    for name in matrices:
        assert ranks[name] == pytest.approx(stable_rank(model[name]), rel=1e-5)
        assert cos[name] == pytest.approx(sampled_mean_abs_cos(model[name]), rel=1e-5)
    assert first.sink and first.norm_factor and first.loss > 0
    # the γ the weights started with, read from each matrix gathered whole (a rank holds (0,) slices)
    start = json.loads((folder / "monitor.json").read_text())["gamma_at_start"]
    assert start["matrices"] == 16 and not start["not_read"], start
    assert start["low"] == pytest.approx(1.0, abs=0.1) and start["high"] == pytest.approx(1.0, abs=0.1)
    assert recs[-1].by_matrix("stable_rank") != ranks  # measured again after training steps
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["params"] == sum(p.numel() for p in model.values())  # the full size, not the slices
    assert main(["report", str(tmp_path / "runs/zero3")]) == 0
