"""Memory of ``token_gap`` streamed over 1 MB and 10 MB of text: does it grow with the corpus?

Each measurement runs in a fresh child process: it builds two tiny byte-level models, records its RSS,
streams the whole corpus through ``token_gap`` (``text_batches`` → per-token gaps → fixed histogram and
bounded heaps), then reports its peak RSS (ru_maxrss). The corpora are Shakespeare repeated to size, as
JSONL (one document per line, the usual shape of a large corpus) and as one .txt file (one document,
which the corpus reader holds as one string).

    python benchmarks/bench_token_gap_memory.py [--sizes-mb 1 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time, torch
torch.set_num_threads(1)
from smallinit import ModelConfig, Transformer
from smallinit.analysis import text_batches, token_gap
from smallinit.data import load_tokenizer

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
tok = load_tokenizer("bytes")
cfg = ModelConfig(d_model=16, n_layers=1, n_heads=1, n_kv_heads=1, d_ff=32, vocab_size=tok.vocab_size, max_seq_len=256)
a, b = Transformer(cfg, seed=0).eval(), Transformer(cfg, seed=1).eval()
before = rss_mb()
t0 = time.perf_counter()
res = token_gap(a, b, text_batches(sys.argv[1], tok, seq_len=256, batch_size=32), tokenizer=tok, top_k=20)
print(json.dumps({"tokens": res.tokens, "rss_before_mb": before,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.perf_counter() - t0}))
"""


def write_corpora(folder: Path, mb: float) -> dict[str, Path]:
    from smallinit.data import iter_documents

    target = int(mb * 1e6)
    docs: list[str] = []
    size = 0
    while size < target:
        for d in iter_documents("shakespeare"):
            d = d[: target - size]
            docs.append(d)
            size += len(d.encode("utf-8"))
            if size >= target:
                break
    jsonl, txt = folder / f"c{mb:g}.jsonl", folder / f"c{mb:g}.txt"
    with open(jsonl, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    txt.write_text("\n".join(docs), encoding="utf-8")
    return {"jsonl": jsonl, "txt": txt}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in args.sizes_mb:
            for kind, path in write_corpora(Path(tmp), mb).items():
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(path)], check=True, capture_output=True, text=True
                ).stdout
                r = {"size_mb": mb, "format": kind, **json.loads(out.strip().splitlines()[-1])}
                r["growth_mb"] = r["peak_rss_mb"] - r["rss_before_mb"]
                rows.append(r)
                print(
                    f"{mb:>5g} MB {kind:<5} {r['tokens']:>11,} tokens  RSS before {r['rss_before_mb']:.0f} MB, "
                    f"peak {r['peak_rss_mb']:.0f} MB (+{r['growth_mb']:.1f} MB)  {r['seconds']:.0f} s",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
