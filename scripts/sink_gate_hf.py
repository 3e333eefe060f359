"""The paper's Fig. 1g on a stock Hugging Face Llama: does add_attention_gate_ remove the attention sink?

A tiny LlamaForCausalLM (the sink recipe's cpu shape: 1 layer, 1 head, d = 64, d_ff = 256) at γ = 1 and
ε = 1e-12, with and without the elementwise gate, trained by transformers' Trainer on the sink task
(``builtin:sink?alpha=0.1`` with a BOS, 16 × 256 tokens a step, lr 1e-2, warmup 50, cosine) and measured by
the Monitor (``watch(trainer)``) on 16 held-out sequences. Each seed trains both arms from the same data
stream; the per-seed difference sink(no gate) − sink(gate) at the end is judged by the project's rule (the
paired t-test of smallinit.study.judging), under C3's precondition that a sink formed without the gate.

    nice python scripts/sink_gate_hf.py --seeds 0 1 2 3 --steps 600 --out /tmp/sink-gate

Prints one line per run and the verdict; writes each run's Trainer folder (the Monitor's records under
``<run>/smallinit``) and summary.json under --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers

from smallinit.data import load_tokenizer
from smallinit.data.sink import SinkData, SinkTask
from smallinit.integrations.hf import model_init, watch
from smallinit.measures.sink import SINK_RATIO, sink_threshold, uniform_sink
from smallinit.monitor.metrics import read_metrics
from smallinit.monitor.records import AnalysisRecord
from smallinit.study.judging.claims.comparison import Comparison

SEQ, BATCH = 256, 16


class SinkStream(torch.utils.data.IterableDataset):
    """Step s's 16 sequences, drawn from (task seed, run seed, s) as smallinit's own trainer draws them."""

    def __init__(self, data: SinkData, seed: int, steps: int):
        self.data, self.seed, self.steps = data, seed, steps

    def __iter__(self):
        for step in range(self.steps):
            for row in torch.from_numpy(
                self.data.tokens(self.data.train_symbols(BATCH, SEQ - 1, self.seed, step))
            ):
                yield {"input_ids": row, "labels": row}


def run(data: SinkData, vocab: int, seed: int, gate: str, steps: int, out: Path) -> dict:
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    val = torch.from_numpy(data.tokens(data.val_symbols(SEQ - 1)[:BATCH]))
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-2,
        warmup_steps=50,
        lr_scheduler_type="cosine",
        weight_decay=0.1,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        logging_steps=steps,
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model_init=model_init(config, gamma=1.0, norm_eps=1e-12, gate=gate, seed=seed),
        args=args,
        train_dataset=SinkStream(data, seed, steps),
    )
    watch(trainer, every=max(1, steps // 4), batch=val, norm_every=0)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    records = [r for r in map(AnalysisRecord.from_dict, read_metrics(out / "smallinit")) if r is not None]
    last = records[-1]
    return {
        "seed": seed,
        "gate": gate,
        "sink": last.sink.mean,
        "sink_along": {r.step: r.sink.mean for r in records},
        "loss": last.loss,
        "seconds": seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    tok = load_tokenizer("anchor")
    data = SinkData(SinkTask.from_params("alpha=0.1"), tok, bos=True)
    results = []
    for seed in a.seeds:
        for gate in ("none", "elementwise"):
            r = run(data, tok.vocab_size, seed, gate, a.steps, a.out / f"seed{seed}-{gate}")
            results.append(r)
            print(
                f"seed {seed} gate {gate:<11} sink {r['sink']:.4f}  loss {r['loss']:.3f}  {r['seconds']:.0f} s"
                f"  along {', '.join(f'{s}:{v:.3f}' for s, v in r['sink_along'].items())}",
                flush=True,
            )
    by = {(r["seed"], r["gate"]): r["sink"] for r in results}
    uniform, threshold = uniform_sink(SEQ), sink_threshold(SEQ)
    none = sum(by[s, "none"] for s in a.seeds) / len(a.seeds)  # C3's precondition: the no-gate arm's mean
    formed = none > threshold
    diff = Comparison.by_seed(
        "sink no gate − gate at γ1 (Fig. 1g), HF Llama + add_attention_gate_",
        {s: by[s, "none"] - by[s, "elementwise"] for s in a.seeds},
        "> 0",
        untestable=""
        if formed
        else f"no sink formed: no-gate mean {none:.3f} ≤ {SINK_RATIO:g} × {uniform:.3f}",
    )
    test = diff.test()
    verdict = test if isinstance(test, str) else test.outcome_at(0.05)
    summary = {
        "runs": results,
        "uniform_sink": uniform,
        "sink_threshold": threshold,
        "comparison": diff.to_dict(),
        "verdict": verdict,
        "interval": None if isinstance(test, str) else [test.lo, test.hi],
        "p": None if isinstance(test, str) else test.p,
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        f"no-gate sink {none:.4f}, uniform attention {uniform:.4f}, formed above {threshold:.4f}: "
        + ("yes" if formed else "no")
    )
    print(diff.text())
    print(
        f"verdict (paired t-test, α = 0.05): {verdict}"
        + ("" if isinstance(test, str) else f", 95 % [{test.lo:+.3f}, {test.hi:+.3f}], p = {test.p:.2g}")
    )


if __name__ == "__main__":
    main()
