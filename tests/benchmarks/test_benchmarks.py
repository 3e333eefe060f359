"""The benchmarks' own arithmetic: the FLOPs formula (smallinit.train.flops) against PyTorch's FLOP counter, and the timing harness."""

import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common import Stat, interleaved, paired  # noqa: E402

from smallinit import ModelConfig, Transformer  # noqa: E402
from smallinit.model import MoE  # noqa: E402
from smallinit.train.flops import train_flops_per_token  # noqa: E402


def counted_train_flops(model: Transformer, tokens: torch.Tensor) -> int:
    """FLOPs PyTorch counts for forward + backward; attention through SDPA's math kernel, whose matmuls the
    counter sees, over the full T×T scores."""
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens, tokens).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    "gate,n_kv_heads,tie", [("none", 4, True), ("headwise", 2, False), ("elementwise", 1, True)]
)
def test_flops_formula_matches_counter(gate, n_kv_heads, tie):
    cfg = ModelConfig.preset(
        "cpu-1m", vocab_size=97, max_seq_len=32, gate=gate, n_kv_heads=n_kv_heads, tie_embeddings=tie
    )
    model = Transformer(cfg, seed=0)
    B, T = 2, 16
    tokens = torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(0))
    expected = train_flops_per_token(model, T, causal=False) * B * T
    assert counted_train_flops(model, tokens) == expected
    # the causal count drops half of the attention term, nothing else
    attention = 12 * cfg.n_layers * T * cfg.d_model
    assert train_flops_per_token(model, T, causal=True) == pytest.approx(expected / (B * T) - attention / 2)


def test_flops_formula_counts_active_experts_only():
    moe = {"num_experts": 4, "top_k": 2, "d_expert": 32}
    cfg = ModelConfig.preset("cpu-1m", vocab_size=97, max_seq_len=32, n_layers=2, moe=moe)
    model = Transformer(cfg, seed=0)
    for m in model.modules():
        if isinstance(m, MoE):
            m.dispatch = "loop"  # one matmul per expert: every token's k experts are counted exactly once
    B, T = 2, 16
    tokens = torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(1))
    assert counted_train_flops(model, tokens) == train_flops_per_token(model, T, causal=False) * B * T


def test_interleaved_rotates_order_and_counts_calls():
    calls: list[str] = []
    cases = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    samples = interleaved(cases, rounds=3, warmup=2, inner=2)
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3, "c": 3}
    timed = calls[6:]  # after 2 warm-up calls each
    firsts = [timed[i * 6] for i in range(3)]  # each round = 3 cases × 2 calls
    assert firsts == ["a", "b", "c"]


def test_paired_ratio_is_per_round():
    # a drifting machine: both contestants slow down together, so the per-round ratio stays 2
    a, b = [2.0, 4.0, 8.0], [1.0, 2.0, 4.0]
    assert paired(a, b) == Stat(2.0, 2.0, 2.0, 3)
    assert Stat.of(a).median / Stat.of(b).median == 2.0


@pytest.mark.slow
def test_run_writes_the_table_and_json(tmp_path):
    """The one command, on its cheapest benchmark: a table on stdout and every row in the JSON."""
    import json
    import subprocess

    out = tmp_path / "out.json"
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--only", "data", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    names = [r["name"] for r in rows]
    assert any("get_batch" in n for n in names) and any("rayon" in n for n in names)
    assert all(r["min"] <= r["median"] <= r["max"] for r in rows)
    assert "get_batch" in proc.stdout


def test_muon_benchmark_times_both_optimizers_in_one_run():
    import bench_muon

    rows = bench_muon.bench_size("cpu-1m", batch=2, seq=16, rounds=1, clock="cpu")
    assert [r.name for r in rows] == [
        "cpu-1m, batch 2×16: Muon / AdamW full training step time",
        "cpu-1m: Muon / AdamW optimizer step alone",
    ]
    assert [r.stat.n for r in rows] == [1, 3] and all(
        0 < r.stat.lo <= r.stat.median <= r.stat.hi for r in rows
    )


def test_the_engines_benchmark_reads_each_calls_own_peak_memory():
    """The peak above what was resident, per call: 256 MiB allocated, touched and freed inside a call shows
    as that much, and a call after it that allocates nothing as none of it (the peak starts again)."""
    from bench_engines_cost import _with_peak

    peaks: list[float] = []
    _with_peak(lambda: torch.ones(64, 1024, 1024), peaks)()  # 256 MiB of fp32
    _with_peak(lambda: None, peaks)()
    assert 250 < peaks[0] < 300 and peaks[1] < 8, peaks
