"""Run the CPU benchmarks and print one table of ratios against peers measured in the same run.

    python benchmarks/run.py [--quick] [--only NAME ...] [--threads N] [--json out.json]

Benchmarks (each also runs alone: ``python benchmarks/bench_<name>.py --help``):
  train      tokens/s vs transformers' LlamaForCausalLM, gate overheads, MFU      bench_train.py
  packing    two 1-thread processes vs one 2-thread process, per size             bench_packing.py
  sweep      sweep cells/hour, sequential vs packed, results bit for bit          bench_sweep.py
  compile    torch.compile speedup and compile time                               bench_compile.py
  data       tokenisation MB/s (1 vs 2 threads), batch sampler cost per step      bench_data.py
  memory     peak RSS per preset, activation checkpointing                        bench_memory.py
  callbacks  analysis callbacks at their default cadence (if bench_callbacks.py exists)
  moe        MoE vs dense at equal active parameters (if bench_moe.py exists)
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

import torch  # noqa: E402
from common import Row, Stat, machine  # noqa: E402

MODULES = {"train": "bench_train", "packing": "bench_packing", "sweep": "bench_sweep", "compile": "bench_compile",
           "data": "bench_data", "memory": "bench_memory"}
EXTERNAL = {"callbacks": "bench_callbacks.py", "moe": "bench_moe.py"}


def run_module(name: str, quick: bool) -> list[Row]:
    mod = importlib.import_module(MODULES[name])
    ap = argparse.ArgumentParser()
    mod.add_args(ap, quick=quick)
    return mod.run(ap.parse_args([]))


def run_external(name: str, quick: bool) -> list[Row]:
    """Another benchmark script, run as it is with ``--json``; its rows are converted into ours."""
    script = HERE / EXTERNAL[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(script), "--json", str(out)]
        if quick and name == "moe":
            cmd += ["--repeats", "3", "--steps", "2"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        data = json.loads(out.read_text(encoding="utf-8"))
    if name == "moe":
        dense = next(r["rounds"] for r in data["rows"] if r["model"] == "dense")
        return [Row("moe", f"{data['preset']} {r['model']} / dense (equal active params) tokens/s",
                    Stat.of([a / b for a, b in zip(r["rounds"], dense)]), "×",
                    extra={"params": r["params"], "params_active": r["params_active"]})
                for r in data["rows"] if r["model"] != "dense"]
    return [Row(name, str(r.get("name", r)), Stat.of([float(r["median"])] if "median" in r else [float("nan")]),
                str(r.get("unit", "")), str(r.get("target", "")), r.get("ok"), str(r.get("note", "")))
            for r in data.get("rows", [])]


def format_table(rows: list[Row]) -> str:
    lines = [f"{'benchmark':<9} {'measurement':<72} {'median':>10} {'[min, max]':>21} {'n':>2}  target"]
    for r in rows:
        s = r.stat
        mark = "" if r.ok is None else ("ok" if r.ok else "MISSED")
        spread = f"[{s.lo:.3g}, {s.hi:.3g}]" if s.n > 1 else ""
        lines.append(f"{r.bench:<9} {r.name[:72]:<72} {s.median:>10.4g} {spread:>21} {s.n:>2}  "
                     f"{r.target} {mark}".rstrip() + (f"   ({r.note})" if r.note else ""))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and shorter runs")
    ap.add_argument("--only", nargs="+", choices=list(MODULES) + list(EXTERNAL), metavar="NAME",
                    help=f"run only these: {', '.join(list(MODULES) + list(EXTERNAL))}")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in this process (0: torch's default)")
    ap.add_argument("--json", help="write every row and the machine description here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.only or list(MODULES) + [n for n, f in EXTERNAL.items() if (HERE / f).is_file()]
    rows: list[Row] = []
    failed: dict[str, str] = {}
    times: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            got = run_external(name, args.quick) if name in EXTERNAL else run_module(name, args.quick)
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
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()) + f"; total {sum(times.values()):.0f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": machine(), "quick": args.quick, "seconds": times, "failed": failed,
                       "rows": [r.to_dict() for r in rows]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
