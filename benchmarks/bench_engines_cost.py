"""The Monitor's cost on the pretraining engines' own models: one observation against one training step.

Each engine's model runs in a process of its own (its imports, its allocator): torchtitan's debug model,
OLMo-core's olmo2_30M and litgpt's pythia-14m, at one vocabulary (2048, the debug model's) so the logits do
not decide the comparison. Contestants, interleaved round by round on the same batch (B × T token ids):
  step       one training step: forward, cross-entropy, backward, AdamW, zero_grad
  forward    one forward without gradients, for reference
  measure    one Monitor observation (``Monitor.measure``: sink, residual flow, norm factors, loss, logits,
             massive activations, stable rank and |cos| of every matrix), the batch as its held-out batch
  refollow   the same, with the parts of fused matrices followed again through the whole forward, as every
             observation did before the adapter learnt them once (the cost that was cut)
Per call: seconds, and the peak resident memory above what was resident before it (VmHWM, reset through
/proc/self/clear_refs; glibc's mmap threshold fixed at 64 KiB so that freed blocks leave the process and the
next call's peak is its own). Ratios are per round against the step, summarised by their median.
torchtitan's attention is SDPA here: its default, flex_attention, has no backward on the CPU.

    python benchmarks/bench_engines_cost.py [--engines titan olmo litgpt] [--batch 8] [--seq 256] [--rounds 5]
        [--threads 1] [--clock cpu] [--json out.json]
    python benchmarks/bench_engines_cost.py --figure docs/img/engines-cost.png --from out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import CLOCKS, Row, Stat, format_table, interleaved, paired, write_rows

ENGINES = {"titan": "torchtitan debugmodel", "olmo": "OLMo-core olmo2_30M", "litgpt": "litgpt pythia-14m"}
VOCAB = 2048
CASES = ("step", "forward", "measure", "refollow")
MMAP_THRESHOLD = "65536"


def build(engine: str) -> torch.nn.Module:
    if engine == "titan":
        from torchtitan.models.common.attention import ScaledDotProductAttention
        from torchtitan.models.llama3 import model_registry

        config = model_registry("debugmodel").model
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
        model = config.build()
        model.init_weights()
        return model
    if engine == "olmo":
        from olmo_core.nn.transformer import TransformerConfig

        model = TransformerConfig.olmo2_30M(vocab_size=VOCAB).build(init_device="cpu")
        model.init_weights(device=torch.device("cpu"))
        return model
    from litgpt import GPT, Config

    return GPT(Config.from_name("pythia-14m", vocab_size=VOCAB, padded_vocab_size=VOCAB))


def _status(key: str) -> float:
    """MiB of one /proc/self/status line (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def _with_peak(fn, peaks: list[float]):
    def call() -> None:
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:  # the peak starts again from what is resident now
            f.write("5")
        fn()
        peaks.append(_status("VmHWM") - before)

    return call


def child(engine: str, batch: int, seq: int, rounds: int, clock: str) -> dict:
    """Seconds and peak MiB of each contestant, ``rounds`` samples each (after one warm-up call)."""
    import torch.nn.functional as F

    from smallinit import Monitor

    torch.manual_seed(0)
    model = build(engine)
    x = torch.randint(0, VOCAB, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step() -> None:
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward() -> None:
        with torch.no_grad():
            model(x[:, :-1])

    with tempfile.TemporaryDirectory() as out:
        monitor = Monitor(model, every=1, batch=x, out=out)
        monitor.snapshot_steps, monitor._log = set(), lambda record: None  # no files: the measurement alone

        def refollow() -> None:
            monitor.adapter.parts = None
            monitor.measure(0)

        peaks: dict[str, list[float]] = {name: [] for name in CASES}
        calls = {
            "step": step,
            "forward": forward,
            "measure": lambda: monitor.measure(0),
            "refollow": refollow,
        }
        times = interleaved(
            {name: _with_peak(calls[name], peaks[name]) for name in CASES}, rounds=rounds, clock=clock
        )
        monitor.close()
    return {"times": times, "peaks": {name: p[1:] for name, p in peaks.items()}}  # the warm-up's dropped


def run(args: argparse.Namespace) -> list[Row]:
    rows = []
    for engine in args.engines:
        env = {
            **os.environ,
            "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD,
            "OMP_NUM_THREADS": str(args.threads),
        }
        sizes = ["--batch", str(args.batch), "--seq", str(args.seq), "--rounds", str(args.rounds)]
        cmd = [sys.executable, __file__, "--child", engine, *sizes, "--threads", str(args.threads)]
        r = subprocess.run([*cmd, "--clock", args.clock], env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"{engine}: {r.stderr.strip().splitlines()[-1]}")
        got = json.loads(r.stdout.strip().splitlines()[-1])
        times, peaks = got["times"], got["peaks"]
        what = f"{ENGINES[engine]}, {args.batch}×{args.seq}"
        for name in ("measure", "refollow", "forward"):
            extra = {"engine": engine, "case": name}
            seconds, mib = Stat.of(times[name]), Stat.of(peaks[name])
            rows.append(
                Row(
                    "engines",
                    f"{what}: {name} / step, time",
                    paired(times[name], times["step"]),
                    "steps",
                    note=f"{seconds.median * 1e3:.0f} vs {Stat.of(times['step']).median * 1e3:.0f} ms",
                    extra={**extra, "kind": "time"},
                )
            )
            rows.append(
                Row(
                    "engines",
                    f"{what}: {name} / step, peak memory",
                    paired(peaks[name], peaks["step"]),
                    "steps",
                    note=f"+{mib.median:.0f} vs +{Stat.of(peaks['step']).median:.0f} MiB",
                    extra={**extra, "kind": "memory", "mib": mib.median},
                )
            )
    return rows


def figure(rows: list[dict], path: Path) -> None:
    """One panel per kind (time, peak memory): per engine, each contestant in training steps, median with
    its [min, max] over rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {
        "refollow": "observation, parts followed each time (before)",
        "measure": "observation (now)",
        "forward": "forward without gradients",
    }
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, kind, title in zip(
        axes, ("time", "memory"), ("time, in training steps", "peak memory above resident, in training steps")
    ):
        for i, case in enumerate(labels):
            got = {r["engine"]: r for r in rows if r["kind"] == kind and r["case"] == case}
            y = [e + (i - 1) * 0.25 for e in range(len(engines))]  # top to bottom: before, now, forward
            med = [got[e]["median"] for e in engines]
            err = [
                [m - got[e]["min"] for m, e in zip(med, engines)],
                [got[e]["max"] - m for m, e in zip(med, engines)],
            ]
            ax.barh(y, med, height=0.24, xerr=err, label=labels[case], color=f"C{i}", capsize=2)
        ax.axvline(1.0, color="k", lw=0.8, ls=":")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(left=0)
    axes[0].set_yticks(range(len(engines)), [ENGINES[e] for e in engines])
    axes[0].invert_yaxis()
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    ap.add_argument("--json", help="write the rows and the machine description here")
    ap.add_argument("--figure", help="draw the rows of --from into this png")
    ap.add_argument("--from", dest="source", help="the --json of an earlier run, for --figure")
    ap.add_argument("--child", choices=list(ENGINES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.figure:
        figure(json.loads(Path(args.source).read_text())["rows"], Path(args.figure))
        return 0
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.seq, args.rounds, args.clock)))
        return 0
    rows = run(args)
    print(format_table(rows))
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
