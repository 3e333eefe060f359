"""Data: tokenisation throughput when building the token cache, and the batch sampler's cost per step.

Tokenisation: fresh processes with RAYON_NUM_THREADS=1 and =2 (tokenizers' thread pool is fixed at
start), alternating, each measuring on the builtin corpus
  encode  the cache builder's chunks through ``Tokenizer.encode_batch`` (documents already in memory)
  build   ``load_token_data`` into an empty cache folder, end to end (read, decompress, encode, write)
in MB of UTF-8 text per second. Sampler: ``get_batch`` for one step (the trainer calls it once per step)
timed interleaved with a full training step of the smallest preset, where its share is largest.

    python benchmarks/bench_data.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_train import ours_loss, train_step
from common import Row, Stat, add_common_args, interleaved, main, paired


def tokenise_worker(corpus: str) -> None:
    from smallinit.data import iter_documents, load_token_data, load_tokenizer
    from smallinit.data.cache import _chunks

    tok = load_tokenizer("default")
    docs = list(iter_documents(corpus))
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    t0, c0 = time.perf_counter(), time.process_time()
    n_tokens = sum(len(ids) for chunk in _chunks(iter(docs)) for ids in tok.encode_batch(chunk))
    encode_s, encode_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    with tempfile.TemporaryDirectory(prefix="smallinit-bench-cache-") as tmp:
        t0 = time.perf_counter()
        load_token_data(corpus, tok, cache_dir=tmp)
        build_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "mb": mb,
                "tokens": n_tokens,
                "encode_s": encode_s,
                "encode_cores": encode_cpu_s / encode_s,
                "build_s": build_s,
            }
        )
    )


def tokenise(threads: int, corpus: str) -> dict:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--tokenise-worker", corpus],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> list[Row]:
    from smallinit import ModelConfig, Transformer
    from smallinit.data import get_batch, load_token_data, load_tokenizer

    rows = []
    res: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for threads in res:
            res[threads].append(tokenise(threads, args.corpus))
    mb = res[1][0]["mb"]
    for kind in ("encode", "build"):
        for threads, rs in res.items():
            rows.append(
                Row(
                    "data",
                    f"tokenise {args.corpus} ({mb:.1f} MB), {kind}, {threads} rayon threads",
                    Stat.of([r["mb"] / r[f"{kind}_s"] for r in rs]),
                    "MB/s",
                )
            )
        speedup = Stat.of([b[f"{kind}_s"] / a[f"{kind}_s"] for a, b in zip(res[2], res[1])])
        rows.append(
            Row(
                "data",
                f"tokenise, {kind}: 2 / 1 rayon threads",
                speedup,
                "×",
                note="≈ 2 when both cores are used",
            )
        )
    for threads, rs in res.items():
        rows.append(
            Row(
                "data",
                f"tokenise, encode: CPU seconds per second, {threads} rayon threads",
                Stat.of([r["encode_cores"] for r in rs]),
                "cores",
                note="cores kept busy; 2 at best",
            )
        )

    tok = load_tokenizer("default")
    data = load_token_data(args.corpus, tok)
    cfg = ModelConfig.preset("cpu-1m", vocab_size=tok.vocab_size)
    model = Transformer(cfg, seed=0)
    x, y = get_batch(data.train, args.batch, args.seq, 0, 0)
    step = train_step(model, ours_loss, x, y)
    counter = iter(range(10**9))
    sampler_calls = 20

    def sampler() -> None:
        for _ in range(sampler_calls):
            get_batch(data.train, args.batch, args.seq, 0, next(counter))

    t = interleaved({"sampler": sampler, "step": step}, rounds=args.rounds * 3, warmup=1, clock=args.clock)
    share = paired(t["sampler"], t["step"], lambda s, st: s / sampler_calls / st)
    rows.append(
        Row(
            "data",
            f"get_batch / cpu-1m training step, batch {args.batch}×{args.seq}",
            share,
            "frac",
            "≤ 0.01",
            share.median <= 0.01,
            note=f"{Stat.of(t['sampler']).median / sampler_calls * 1e6:.0f} µs per batch, "
            f"{torch.get_num_threads()} threads",
        )
    )
    return rows


def add_args(ap: argparse.ArgumentParser, quick: bool = False) -> None:
    ap.add_argument("--rounds", type=int, default=2 if quick else 3)
    ap.add_argument("--corpus", default="default")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    add_common_args(ap)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--tokenise-worker":
        tokenise_worker(sys.argv[2])
        sys.exit(0)
    main(__doc__, add_args, run)
