"""`smallinit eval` end to end: the real lm-evaluation-harness on local tasks (tests/lmeval_tasks), offline.

The harness's per-example log-likelihoods and generations are recomputed with our own model, so the bridge
(export, tokenizer, remote code, harness) is checked against an independent computation, not just run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from smallinit.cli import main  # noqa: E402
from smallinit.config import Config  # noqa: E402
from smallinit.data import load_tokenizer  # noqa: E402
from smallinit.export.lmeval import run_eval  # noqa: E402
from smallinit.report import build_report  # noqa: E402
from smallinit.report.markup import num  # noqa: E402
from smallinit.train import Trainer, load_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tests" / "lmeval_tasks"
MC, GEN = "smallinit_tiny_mc", "smallinit_tiny_gen"


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus) -> Path:
    """A few training steps of a headwise-gated model (exported as our remote-code class)."""
    root = tmp_path_factory.mktemp("lmeval")
    cfg = Config.load(
        overrides=[
            "data.tokenizer=bytes",
            f"data.corpus={corpus}",
            "model.d_model=32",
            "model.n_layers=2",
            "model.n_heads=4",
            "model.n_kv_heads=2",
            "model.d_ff=64",
            "model.max_seq_len=128",
            "data.seq_len=64",
            "model.gate=headwise",
            "train.steps=6",
            "train.batch_size=8",
            "train.lr=1e-2",
            "train.warmup_steps=2",
            "train.eval_every=0",
            "train.eval_batches=1",
        ]
    )
    Trainer(cfg, root / "run", callbacks=[]).fit()
    return root / "run"


def loglikelihood(model, tok, context: str, continuation: str) -> float:
    ctx, cont = tok.encode(context), tok.encode(continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = model(ids[:, :-1]).logits.float().log_softmax(-1)[0]
    return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))


def generate_until(model, tok, context: str, max_tokens: int, until: str) -> str:
    ids, out = tok.encode(context), []
    with torch.no_grad():
        for _ in range(max_tokens):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt == tok.eos_id:
                break
            out.append(nxt)
    return tok.decode(out).split(until)[0]


def test_eval_runs_the_harness_and_matches_our_model(run, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the task YAMLs name their JSONL files relative to the repository root
    rc = main(["eval", str(run), "--tasks", f"{MC},{GEN}", "--include-path", str(TASKS), "--log-samples"])
    assert rc == 0
    assert "acc" in capsys.readouterr().out
    [results_file] = (run / "eval").glob("results-step_*.json")
    raw = json.loads(results_file.read_text())
    assert raw["smallinit"]["architecture"] == "SmallinitForCausalLM" and raw["smallinit"]["step"] == 6

    model, tok = load_model(run), load_tokenizer("bytes")
    hits, hits_norm = [], []
    for s in raw["samples"][MC]:
        lls = [ll for ll, _ in s["filtered_resps"]]
        ours = [loglikelihood(model, tok, ctx, cont) for ctx, cont in s["arguments"]]
        assert max(abs(a - b) for a, b in zip(lls, ours)) < 1e-3
        hits.append(max(range(len(ours)), key=ours.__getitem__) == s["doc"]["label"])
        norm = [ll / len(choice) for ll, choice in zip(ours, s["doc"]["choices"])]  # lm-eval: per character
        hits_norm.append(max(range(len(norm)), key=norm.__getitem__) == s["doc"]["label"])
    mc = raw["results"][MC]
    assert len(hits) == 8
    assert mc["acc,none"] == pytest.approx(sum(hits) / len(hits))
    assert mc["acc_norm,none"] == pytest.approx(sum(hits_norm) / len(hits_norm))

    matches = []
    for s in raw["samples"][GEN]:
        context, kwargs = s["arguments"][0]
        ours = generate_until(model, tok, context, kwargs["max_gen_toks"], kwargs["until"][0])
        assert s["filtered_resps"][0] == ours
        matches.append(ours == s["target"])
    assert raw["results"][GEN]["exact_match,none"] == pytest.approx(sum(matches) / len(matches))

    page = build_report(run).read_text()  # the report shows the harness's numbers
    assert "lm-evaluation-harness" in page and MC in page and num(mc["acc,none"]) in page


def test_eval_reuses_the_export_and_keeps_earlier_results(run, monkeypatch):
    monkeypatch.chdir(REPO)
    first = run_eval(run, [MC], limit=2, include_path=TASKS)
    second = run_eval(run / "checkpoints" / "step_0000006", [MC], limit=2, include_path=TASKS)
    assert first.export_dir == second.export_dir and first.results_file != second.results_file
    assert first.results_file.is_file() and second.results_file.is_file()
    assert len(list((run / "eval").glob("hf-step_*"))) == 1
    assert first.metrics[MC]["acc,none"] == second.metrics[MC]["acc,none"]
    assert json.loads(second.results_file.read_text())["n-samples"][MC]["effective"] == 2


def test_eval_user_errors_are_one_line(run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the tasks' data_files (relative to the repository root) are not found here
    cases = {
        "task data not found": ["eval", str(run), "--tasks", MC, "--include-path", str(TASKS)],
        "is not a folder": ["eval", str(run), "--tasks", MC, "--include-path", str(tmp_path / "missing")],
        "does not exist": ["eval", str(tmp_path / "not-a-run"), "--tasks", MC, "--include-path", str(TASKS)],
    }
    for what, argv in cases.items():
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()  # may hold transformers' progress bars before the error
        last = err.splitlines()[-1]
        assert last.startswith("smallinit: error: ") and what in last and err.count("smallinit: error") == 1
