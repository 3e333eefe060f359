"""Run the CPU benchmarks and print one table of ratios against peers measured in the same run.

    python benchmarks/run.py [--quick] [--only NAME ...] [--threads N] [--clock wall|cpu] [--json out.json]

Benchmarks (each also runs alone: ``python benchmarks/bench_<name>.py --help``):
  train      tokens/s vs transformers' LlamaForCausalLM, gate overheads, MFU      bench_train.py
  packing    two 1-thread processes vs one 2-thread process, per size             bench_packing.py
  sweep      sweep cells/hour, sequential vs packed, results bit for bit          bench_sweep.py
  compile    torch.compile speedup and compile time                               bench_compile.py
  tiny       tiny widths and the demo's shape: compiled vs eager, ceiling, sweep  bench_tiny.py
  data       tokenisation MB/s (1 vs 2 threads), batch sampler cost per step      bench_data.py
  memory     peak RSS per preset, activation checkpointing                        bench_memory.py
  callbacks  analysis callbacks at their default cadence (if bench_callbacks.py exists)
  moe        MoE vs dense at equal active parameters (if bench_moe.py exists)
  moe_gather MoE dispatch and combine, deterministic vs the accumulating gather   bench_moe_gather.py
  audit      smallinit audit of cpu-20m against one training step; 1.5b on meta     bench_audit.py
  muon       Muon's step time vs AdamW's at cpu-5m and cpu-20m                    bench_muon.py
Every row is a median over rounds with [min, max] as the spread; ratios are paired within a round.
A failing benchmark is reported and the others still run; the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Row, Stat, add_common_args, format_table, machine, process_setup  # noqa: E402

MODULES = {
    "train": "bench_train",
    "packing": "bench_packing",
    "sweep": "bench_sweep",
    "compile": "bench_compile",
    "tiny": "bench_tiny",
    "data": "bench_data",
    "memory": "bench_memory",
    "callbacks": "bench_callbacks",
    "init": "bench_init",
    "moe_gather": "bench_moe_gather",
    "audit": "bench_audit",
    "muon": "bench_muon",
}
SCRIPTS = {"moe": "bench_moe.py"}  # run as they are, through their own command line


def available() -> list[str]:
    """Every benchmark whose file is here (other benchmarks may not be written yet)."""
    return [n for n, m in MODULES.items() if (HERE / f"{m}.py").is_file()] + [
        n for n, f in SCRIPTS.items() if (HERE / f).is_file()
    ]


def run_module(name: str, quick: bool, clock: str) -> list[Row]:
    mod = importlib.import_module(MODULES[name])
    ap = argparse.ArgumentParser()
    mod.add_args(ap, quick=quick)
    args, _ = ap.parse_known_args(["--clock", clock])  # a benchmark without in-process timing has no --clock
    return mod.run(args)


def run_script(name: str, quick: bool) -> list[Row]:
    """Another benchmark script, run with ``--json``; its rows are converted into ours."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(HERE / SCRIPTS[name]), "--json", str(out)]
        if quick:
            cmd += ["--repeats", "3", "--steps", "2"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        data = json.loads(out.read_text(encoding="utf-8"))
    dense = next(r["rounds"] for r in data["rows"] if r["model"] == "dense")
    return [
        Row(
            "moe",
            f"{data['preset']} {r['model']} / dense (equal active params) tokens/s",
            Stat.of([a / b for a, b in zip(r["rounds"], dense)]),
            "×",
            extra={"params": r["params"], "params_active": r["params_active"]},
        )
        for r in data["rows"]
        if r["model"] != "dense"
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and shorter runs")
    ap.add_argument(
        "--only",
        nargs="+",
        choices=available(),
        metavar="NAME",
        help=f"run only these: {', '.join(available())}",
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads in this process (0: torch's default)"
    )
    ap.add_argument("--json", help="write every row and the machine description here")
    add_common_args(ap)
    args = ap.parse_args()
    process_setup(args.threads)
    names = args.only or available()
    rows: list[Row] = []
    failed: dict[str, str] = {}
    times: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            got = (
                run_script(name, args.quick) if name in SCRIPTS else run_module(name, args.quick, args.clock)
            )
        except Exception as e:  # one broken benchmark must not hide the others' numbers
            failed[name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            if isinstance(e, subprocess.CalledProcessError):
                print(e.stderr, file=sys.stderr)
            got = []
        times[name] = time.perf_counter() - t0
        rows += got
        for r in got:
            print(format_table([r]).splitlines()[1], file=sys.stderr, flush=True)
    print(format_table(rows))
    for name, err in failed.items():
        print(f"FAILED {name}: {err}")
    print(
        "seconds: "
        + ", ".join(f"{k} {v:.0f}" for k, v in times.items())
        + f"; total {sum(times.values()):.0f}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "machine": machine(),
                    "quick": args.quick,
                    "clock": args.clock,
                    "seconds": times,
                    "failed": failed,
                    "rows": [r.to_dict() for r in rows],
                },
                f,
                indent=1,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
