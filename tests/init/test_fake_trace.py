"""The FSDP2 step traced over 8 fake ranks (benchmarks/fake_trace.py): the trainer's sharding plan applies, fused
AdamW steps the shards, and the traced peak per rank agrees with smallinit.train.memory's estimate."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from smallinit import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("trace") / "trace.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "fake_trace.py"),
            "--presets",
            "cpu-1m",
            "cpu-moe-1m",
            "--seq-len",
            "128",
            "--micro-batch",
            "2",
            "--ranks",
            "8",
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {r["preset"]: r for r in json.loads(out.read_text())}


@pytest.mark.parametrize("preset", ["cpu-1m", "cpu-moe-1m"])
def test_fake_trace_shards_every_parameter_and_steps_fused_adamw(traces, preset):
    r = traces[preset]
    plan = r["plan"]
    assert plan["not_sharded"] == []
    assert len(plan["fsdp_units"]) == ModelConfig.preset(preset).n_layers + 1  # each block, then the root
    assert plan["share_on_rank"] == pytest.approx(1 / 8, rel=0.01)
    assert r["fused_adamw"] and r["logits_dtype"] == "torch.bfloat16"
    peak, params = r["peak_bytes"], plan["params_on_rank"]
    assert peak["Sharded Param"] == pytest.approx(4 * params, rel=0.01)  # fp32 master shards
    assert peak["OptState"] == pytest.approx(8 * params, rel=0.01)  # AdamW's two moments, sharded alike


@pytest.mark.parametrize("preset", ["cpu-1m", "cpu-moe-1m"])
def test_fake_trace_peak_agrees_with_the_estimate(traces, preset):
    traced, estimate = traces[preset]["traced"], traces[preset]["estimate"]
    assert 0.8 < traced["total"] / estimate["total"] < 1.25
