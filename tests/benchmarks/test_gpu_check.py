"""benchmarks/gpu.py, the one-GPU check, where no GPU is: its peak table, its arguments, its peak-memory reset,
and its whole code path on the CPU (--cpu: the tiny presets, gloo for the world of one)."""

import gc
import json
import sys
import weakref
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu  # noqa: E402


def test_peak_table_matches_the_exact_device_name():
    assert gpu.table_peak("NVIDIA H100 80GB HBM3") == 989e12  # SXM
    assert gpu.table_peak("NVIDIA H100 PCIe") == 756e12  # not the SXM's rate: MFU would read 24 % low
    assert gpu.table_peak("NVIDIA H100 NVL") == 835e12
    assert gpu.table_peak("NVIDIA H200") == 989e12
    assert gpu.table_peak("NVIDIA A100-SXM4-40GB") == 312e12
    assert gpu.table_peak("NVIDIA H100") is None  # a name not in the table: the measured rate, said so


def test_any_preset_has_a_step_shape_and_an_unknown_one_is_one_line(capsys):
    cuda = torch.device("cuda")
    assert gpu.step_shape("0.3b", cuda) == (8, 2048)
    assert gpu.step_shape("moe-3b-a0.5b", cuda) == (8, 2048)
    assert gpu.step_shape("cpu-1m", torch.device("cpu")) == (4, 128)
    assert gpu.main(["--presets", "0.3b", "nope", "--cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown preset nope" in err[0] and "0.1b" in err[0]


def test_peak_reset_collects_reference_cycles_first():
    class Holder:
        pass

    a, b = Holder(), Holder()
    a.other, b.other, a.tensor = b, a, torch.zeros(1000)  # a cycle, as compiled blocks and optimizers hold
    dead = weakref.ref(a.tensor)
    gc.disable()  # only reset_peak may collect it
    try:
        del a, b
        assert dead() is not None
        gpu.reset_peak(torch.device("cpu"))
        assert dead() is None
    finally:
        gc.enable()


def test_cpu_check_runs_every_row_and_says_what_it_skipped(tmp_path):
    assert gpu.main(["--cpu", "--no-compile", "--out", str(tmp_path), "--steps", "2"]) == 0
    report = json.loads((tmp_path / "gpu.json").read_text())
    (row,) = report["mfu"]
    assert row["preset"] == "cpu-1m" and row["mfu"] > 0 and row["estimate_gib"] > 0
    assert report["precision"]["steps"] == 4 and report["precision"]["max_abs_diff_first_10"] > 0
    assert report["resume"]["bit_exact"] and report["resume"]["tensors"] > 0
    for layout in ("ddp", "fsdp"):  # a process group of one rank: the many-rank path, the same losses
        assert report["world_of_one"][layout]["max_abs_diff_first_10"] < 1e-6
    skipped = " | ".join(report["skipped"])
    assert "needs ≥ 2 GPUs, 0 visible" in skipped and "--no-compile" in skipped


@pytest.mark.slow
def test_cpu_check_compiles_the_moe_preset_as_one_graph(tmp_path):
    assert gpu.main(["--cpu", "--out", str(tmp_path), "--steps", "2"]) == 0
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert [r["compile"] for r in report["mfu"]] == [True, False]
    moe = report["moe_compiled"]
    assert (moe["graphs"], moe["graph_breaks"], moe["frames_compiled"]) == (1, 0, 1)
