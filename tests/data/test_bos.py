"""data.bos: every window starts at a document boundary, its first token the end-of-text token as BOS."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smallinit import Config
from smallinit.data import get_batch, iter_eval_batches, load_data, load_tokenizer
from smallinit.data.batching import document_starts
from smallinit.errors import DataError
from smallinit.train import Trainer
from support.runs import TINY_MODEL

EOS = 9


def stream(lengths: list[int]) -> np.ndarray:
    """Documents of the given lengths (tokens 1…), each followed by EOS, as the token cache lays them out."""
    parts, doc = [], 0
    for n in lengths:
        doc += 1
        parts += [*(np.arange(n) % 8 + 10 * doc), EOS]
    return np.asarray(parts, dtype=np.int64)


def test_training_windows_start_at_a_boundary_and_hold_the_next_document():
    tokens = stream([5, 30, 3, 40, 12, 2, 50])
    starts = document_starts(tokens, EOS)
    for step in range(20):
        x, y = get_batch(tokens, 16, 8, seed=1, step=step, starts=starts)
        assert (x[:, 0] == EOS).all()
        assert (x[:, 1] % 10 == 0).all()  # the first token of a document
        assert (y[:, :-1] == x[:, 1:]).all()
    seen = {int(s) for step in range(50) for s in get_batch(tokens, 16, 8, 1, step, starts=starts)[0][:, 1]}
    fits = {int(tokens[s + 1]) for s in starts if s + 9 <= len(tokens)}
    assert seen == fits  # every boundary with room for a window is used, and no other position


def test_evaluation_windows_are_aligned_and_do_not_overlap():
    tokens = stream([5, 3, 40, 2, 2, 30, 12])
    starts = document_starts(tokens, EOS)
    xs = np.concatenate([x.numpy() for x, _ in iter_eval_batches(tokens, 2, 8, starts=starts)])
    assert (xs[:, 0] == EOS).all()
    firsts = [int(row[1]) for row in xs]
    where = [int(np.flatnonzero(tokens == f)[0]) - 1 for f in firsts]  # each window's start offset
    assert all(b - a >= 8 for a, b in zip(where, where[1:]))  # every target scored at most once
    # boundaries at 5, 9, 50, 53, 56, 87, 100: 9 overlaps the window from 5, 53 and 56 the one from 50, 100 has no room
    assert where == [5, 50, 87]


def test_a_split_without_a_fitting_boundary_is_refused():
    tokens = stream([40])
    with pytest.raises(DataError, match="no document boundary"):
        get_batch(tokens, 2, 8, 0, 0, starts=document_starts(tokens, EOS))


def test_a_run_with_bos_trains_on_aligned_windows(tmp_path):
    cfg = Config.load(
        overrides=[
            *TINY_MODEL,
            "data.corpus=zh-poems",
            "data.bos=true",
            "train.batch_size=4",
            "train.steps=2",
            "train.warmup_steps=1",
            "train.eval_batches=1",
            "train.eval_every=0",
            "train.log_every=1",
        ]
    )
    tok = load_tokenizer("bytes")
    data = load_data(cfg.data, tok)
    x, _ = data.batch(8, 32, seed=0, step=0)
    assert (x[:, 0] == tok.eos_id).all()
    assert all((x[:, 0] == tok.eos_id).all() for x, _ in data.eval_batches(4, 32, 3))
    Trainer(cfg, tmp_path / "run", callbacks=[]).fit()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["bos"] is True
    cfg.data.bos = False
    plain = load_data(cfg.data, tok).batch(8, 32, seed=0, step=0)[0]
    assert not (plain[:, 0] == tok.eos_id).all()
