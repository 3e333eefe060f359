"""The sink task (Bigram-Backcopy): its rule, its chain's statistics, a generator that is a pure function of
(task seed, run seed, step), and a training run on it that resumes bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from smallinit import Config
from smallinit.data import iter_documents, load_data, load_tokenizer
from smallinit.data.sink import BOS, SinkData, SinkTask
from smallinit.errors import DataError
from smallinit.train import Callback, Trainer
from support.runs import final_tensors

TASK = SinkTask(symbols=16, triggers=2, rate=0.2, alpha=0.5, val=64, seed=3)


def data(task: SinkTask = TASK, bos: bool = True) -> SinkData:
    return SinkData(task, load_tokenizer("anchor"), bos=bos)


def test_rule_copy_after_trigger_and_bos_at_position_0():
    seqs = data().train_symbols(64, 40, seed=0, step=0)
    assert seqs.shape == (64, 41) and (seqs[:, 0] == BOS).all() and (seqs[:, 1:] >= 0).all()
    trig = np.isin(seqs, TASK.trigger_set)
    assert not trig[:, 1].any()  # the first symbol has nothing to copy
    rows, cols = np.nonzero(trig[:, 1:-1])
    cols += 1
    assert len(rows) > 100  # enough triggers to mean something
    assert (seqs[rows, cols + 1] == seqs[rows, cols - 1]).all()
    no_bos = data(bos=False).train_symbols(8, 40, seed=0, step=0)
    assert (no_bos >= 0).all()


def test_bigram_steps_follow_the_chain():
    """Transitions out of non-trigger symbols match the task's matrix (frequencies within 4 standard errors)."""
    seqs = data().train_symbols(512, 128, seed=1, step=2)
    x, y = seqs[:, 1:-1].ravel(), seqs[:, 2:].ravel()
    plain = ~np.isin(x, TASK.trigger_set)
    counts = np.zeros((TASK.symbols, TASK.symbols))
    np.add.at(counts, (x[plain], y[plain]), 1)
    n = counts.sum(axis=1, keepdims=True)
    P = TASK.transitions
    se = np.sqrt(P * (1 - P) / np.maximum(n, 1))
    rows = ~np.isin(np.arange(TASK.symbols), TASK.trigger_set)
    assert (np.abs(counts / np.maximum(n, 1) - P)[rows] <= 4 * se[rows] + 1e-3).all()
    assert np.allclose(P.sum(axis=1), 1) and np.allclose(
        P[:, list(TASK.trigger_set)], TASK.rate / TASK.triggers
    )


def test_a_batch_is_a_pure_function_of_seed_and_step():
    d = data()
    later = d.train_symbols(8, 32, seed=5, step=7)  # computed first: nothing depends on what came before
    for step in range(7):
        d.train_symbols(8, 32, seed=5, step=step)
    assert np.array_equal(d.train_symbols(8, 32, seed=5, step=7), later)
    assert np.array_equal(data().train_symbols(8, 32, seed=5, step=7), later)  # a fresh object: the same
    assert not np.array_equal(d.train_symbols(8, 32, seed=5, step=8), later)
    assert not np.array_equal(d.train_symbols(8, 32, seed=6, step=7), later)
    other = SinkData(
        SinkTask(symbols=16, triggers=2, rate=0.2, alpha=0.5, val=64, seed=4),
        load_tokenizer("anchor"),
        bos=True,
    )
    assert not np.array_equal(other.train_symbols(8, 32, seed=5, step=7), later)


def test_ranks_split_the_global_batch_and_validation_is_the_same_for_every_run():
    d = data()
    x, y = d.batch(8, 32, seed=0, step=3)
    parts = [d.batch(8, 32, seed=0, step=3, rank=r, world_size=4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(
        torch.cat([p[1] for p in parts]), y
    )
    assert torch.equal(x[:, 1:], y[:, :-1]) and (x[:, 0] == load_tokenizer("anchor").eos_id).all()
    val = list(d.eval_batches(16, 32))
    assert [v[0].shape[0] for v in val] == [16] * 4
    assert all(torch.equal(a[0], b[0]) for a, b in zip(val, data().eval_batches(16, 32)))
    assert not any(torch.equal(v[0], x[:8]) for v in val[:1])
    assert len(list(d.eval_batches(16, 32, max_batches=2))) == 2


def test_tokens_decode_to_the_symbols():
    tok = load_tokenizer("anchor")
    d = data()
    seq = d.train_symbols(1, 10, seed=0, step=0)[0]
    assert tok.decode(d.tokens(seq[1:])).split() == [str(s) for s in seq[1:]]


def test_optimal_loss_by_hand():
    t = SinkTask(symbols=4, triggers=1, rate=0.5, alpha=1.0, seed=0)
    trig = t.trigger_set[0]
    a, b = [s for s in range(4) if s != trig][:2]
    P = t.transitions
    seqs = np.array([[BOS, a, trig, a, b]])  # uniform first symbol, bigram to trig, copy, bigram a → b
    expected = (np.log(3) - np.log(P[a, trig]) + 0.0 - np.log(P[a, b])) / 4
    assert t.optimal_loss(seqs) == pytest.approx(expected)


@pytest.mark.parametrize(
    "spec,words",
    [
        ("builtin:sink?symbols=2", "symbols=2 must be in 4..256"),
        ("builtin:sink?triggers=0", "triggers=0"),
        ("builtin:sink?rate=1", "rate=1.0 must be in (0, 1)"),
        ("builtin:sink?colour=3", "unknown parameter 'colour'"),
        ("builtin:sink?symbols=many", "symbols='many' is not a number"),
    ],
)
def test_bad_parameters_say_what_is_wrong(spec, words):
    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        SinkTask.from_params(spec)


def test_spec_round_trip_and_the_bytes_tokenizer_is_refused():
    assert SinkTask.from_params(TASK.spec()) == TASK
    assert SinkTask.from_params("builtin:sink") == SinkTask()
    cfg = Config.load(overrides=["data.corpus=builtin:sink?symbols=16", "data.tokenizer=bytes"])
    with pytest.raises(DataError, match='use data.tokenizer = "anchor"'):
        load_data(cfg.data, load_tokenizer("bytes"))


SINK_RUN = [
    "data.corpus=builtin:sink?symbols=16&triggers=2&val=16",
    "data.tokenizer=anchor",
    "data.bos=true",
    "data.seq_len=32",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.n_kv_heads=2",
    "model.d_ff=64",
    "train.batch_size=8",
    "train.warmup_steps=2",
    "train.eval_batches=2",
    "train.steps=12",
    "train.checkpoint_every=4",
    "train.eval_every=4",
    "train.keep_checkpoints=10",
    "train.log_every=4",
]


def test_a_resumed_run_on_the_sink_task_is_bit_exact(tmp_path):
    Trainer(Config.load(overrides=SINK_RUN), tmp_path / "full", callbacks=[]).fit()

    class StopAt6(Callback):  # between checkpoints: steps 5-6 are lost and redone from step 4
        def on_step_end(self, trainer, record):
            if trainer.step == 6:
                raise KeyboardInterrupt

    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        Trainer(Config.load(overrides=SINK_RUN), part, callbacks=[StopAt6()]).fit()
    Trainer(Config.load(overrides=SINK_RUN), part, resume=True, callbacks=[]).fit()
    full, resumed = final_tensors(tmp_path / "full"), final_tensors(part)
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)
    losses = [
        [json.loads(x).get("val_loss") for x in (run / "metrics.jsonl").read_text().splitlines()]
        for run in (tmp_path / "full", part)
    ]
    assert losses[0] == losses[1]


def test_the_sink_task_is_not_read_as_a_document_corpus():
    with pytest.raises(DataError, match="generated batch by batch"):
        next(iter_documents("builtin:sink?symbols=16"))
