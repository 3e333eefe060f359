"""One try of the sink-regime exploration: train a no-gate run on the sink task and append what it reached
(settings, sink per layer and Sink_0.3/0.8 along training, val loss against the task's optimum, CPU time) as one
JSON line to a log. The tries and their log are the record behind the ``sink`` recipe's regime (docs/findings-cpu.md).

    python scripts/explore_sink.py LOG.jsonl RUN_DIR --set model.gamma=1 --set train.lr=3e-3 ...
    python scripts/explore_sink.py --table LOG.jsonl      # the log as a Markdown table
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from smallinit.config import Config, parse_override, set_dotted
from smallinit.data.sink import SinkData, SinkTask
from smallinit.measures.sink import uniform_sink
from smallinit.monitor.metrics import read_metrics
from smallinit.monitor.records import AnalysisRecord, parse_record
from smallinit.train import AnalysisCallback, Trainer
from smallinit.train.callbacks import Progress

BASE = {
    "data.corpus": "builtin:sink",
    "data.tokenizer": "anchor",
    "data.bos": True,
    "data.seq_len": 256,
    "model.gamma": 1.0,
    "model.d_model": 64,
    "model.n_layers": 2,
    "model.n_heads": 2,
    "model.n_kv_heads": 2,
    "model.d_ff": 256,
    "model.norm_eps": 1e-12,
    "model.gate": "none",
    "train.batch_size": 32,
    "train.steps": 1000,
    "train.warmup_steps": 50,
    "train.eval_every": 250,
    "train.eval_batches": 4,
    "train.checkpoint_every": 0,
    "train.keep_checkpoints": 1,
    "train.log_every": 100,
    "train.threads": 1,
    "analysis.every": 250,
    "analysis.batch_size": 16,
}


def table(log: str) -> str:
    """One row per try: what it changed from BASE, the largest layer sink and Sink_0.3 along training, the final
    val loss against the task's optimum, and the CPU seconds it took."""
    rows = [
        "| try | changed from the base | largest layer sink at each analysis step (uniform 0.020) | Sink_0.3 at the "
        "end | val loss (optimum) | CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for line in Path(log).read_text().splitlines():
        r = json.loads(line)
        changed = ", ".join(
            f"{k.split('.', 1)[1]}={v}"
            for k, v in r["settings"].items()
            if k not in ("train.eval_every", "analysis.every", "train.log_every")
        )
        along = " → ".join(f"{max(a['sink']):.2f}" for a in r["along"])
        rows.append(
            f"| {r['note'].split(':')[0]} | {changed} | {along} | {r['along'][-1]['sink_share']['0.3']:.2f} | "
            f"{r['val_loss'][-1][1]:.3f} ({r['optimal_loss']:.3f}) | {r['cpu_s']:.0f} |"
        )
    return "\n".join(rows)


def main() -> None:
    if sys.argv[1:2] == ["--table"]:
        print(table(sys.argv[2]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("run")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    overrides = dict(BASE)
    for s in args.set:
        k, v = parse_override(s)
        overrides[k] = v
    raw = Config().to_dict()
    raw["model"]["max_seq_len"] = max(raw["model"]["max_seq_len"], int(overrides["data.seq_len"]))
    for k, v in overrides.items():
        set_dotted(raw, k, v)
    cfg = Config.from_dict(raw)
    cpu0, t0 = time.process_time(), time.time()
    trainer = Trainer(cfg, args.run, callbacks=[Progress(), AnalysisCallback(cfg.analysis)])
    trainer.fit()
    cpu, wall = time.process_time() - cpu0, time.time() - t0
    recs = read_metrics(args.run)
    task = SinkTask.from_params(cfg.data.corpus)
    data = SinkData(task, trainer.tokenizer, bos=cfg.data.bos)
    optimum = task.optimal_loss(
        data.val_symbols(cfg.data.seq_len)[: cfg.train.eval_batches * cfg.train.batch_size]
    )
    along = [
        {
            "step": a.step,
            "sink": [round(v, 4) for v in a.sink.per_layer],
            "sink_share": {str(eps): v for eps, v in a.sink.share_above.items()},
        }
        for a in map(parse_record, recs)
        if isinstance(a, AnalysisRecord) and a.sink
    ]
    evals = [(r["step"], round(r["val_loss"], 4)) for r in recs if "val_loss" in r]
    row = {
        "settings": {k: v for k, v in overrides.items() if BASE.get(k) != v or k in ("data.corpus",)},
        "note": args.note,
        "uniform": round(uniform_sink(cfg.data.seq_len), 4),
        "optimal_loss": round(optimum, 4),
        "val_loss": evals,
        "along": along,
        "max_layer_sink_end": max(along[-1]["sink"]),
        "cpu_s": round(cpu, 1),
        "wall_s": round(wall, 1),
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    with Path(args.log).open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(
        json.dumps(
            {k: row[k] for k in ("settings", "uniform", "optimal_loss", "max_layer_sink_end", "cpu_s")}
        )
    )
    print("sink along:", [(a["step"], max(a["sink"]), a["sink_share"]) for a in along])
    print("val:", evals, "optimum", optimum)


if __name__ == "__main__":
    main()
