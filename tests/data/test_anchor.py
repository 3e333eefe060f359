"""The anchor-function task: deterministic, held-out pairs never trained, answers follow the rules."""

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from smallinit.data import corpus_fingerprint, iter_documents, load_token_data, load_tokenizer
from smallinit.data.anchor import AnchorTask
from smallinit.errors import DataError
from smallinit.model import ModelOutput
from smallinit.study.judging.anchor import anchor_scores

SPEC = "builtin:anchor?anchors=5&holdout=3&n=3000&seed=7&length=9"


def parse(doc: str) -> tuple[int, int, int, int]:
    """(key, a, b, answer) of a training document, read back from its words alone."""
    words = doc.split()
    assert words[-2] == "="
    at = next(i for i, w in enumerate(words) if w.startswith("A"))
    assert words[at + 1].startswith("A") and sum(w.startswith("A") for w in words) == 2
    return int(words[at - 1]), int(words[at][1:]), int(words[at + 1][1:]), int(words[-1])


def test_deterministic_and_seeded():
    a = list(iter_documents(SPEC))
    assert a == list(iter_documents(SPEC)) and len(a) == 3000
    assert corpus_fingerprint(SPEC) == corpus_fingerprint(SPEC)
    other = SPEC.replace("seed=7", "seed=8")
    assert list(iter_documents(other)) != a and corpus_fingerprint(other) != corpus_fingerprint(SPEC)
    assert AnchorTask().offsets == (5, 1, -2, -8)  # the paper's anchors by default


def test_heldout_pairs_never_in_training_data_and_answers_follow_the_rules():
    task = AnchorTask.from_params(SPEC)
    assert len(task.heldout) == 3 and not set(task.heldout) & {(b, a) for a, b in task.heldout}
    seen = set()
    for doc in iter_documents(SPEC):
        key, a, b, answer = parse(doc)
        seen.add((a, b))
        expected = key + task.offsets[a - 1] + task.offsets[b - 1]
        if (b, a) in task.heldout:  # the mirror of a held-out pair is trained off the composition
            expected += task.twist
        assert answer == expected and 0 <= answer < task.numbers
    all_pairs = set(itertools.product(range(1, 6), repeat=2))
    assert seen == all_pairs - set(task.heldout)  # every other pair is trained

    # nor anywhere in the token stream the trainer sees (no pair formed across documents either)
    tok = load_tokenizer("anchor")
    data = load_token_data(SPEC, tok, val_fraction=0.1)
    ids = {tok.encode(f"A{k}")[0] for k in range(1, 6)}
    for split in (data.train, data.val):
        s = np.asarray(split)
        bigrams = set(zip(s[:-1].tolist(), s[1:].tolist()))
        for a, b in task.heldout:
            assert (tok.encode(f"A{a}")[0], tok.encode(f"A{b}")[0]) not in bigrams
        assert np.isin(s, list(ids)).sum() == 2 * int((s == tok.eos_id).sum())  # two anchors per document
    assert len(data.train) + len(data.val) == 3000 * (9 + 3)  # 9 question words, '=', answer, EOS


def test_probes():
    task = AnchorTask.from_params(SPEC)
    held = task.probes("heldout", 30, seed=1)
    assert {q.pair for q in held} == set(task.heldout)
    for q in held:
        a, b = q.pair
        assert q.answer == q.key + task.offsets[a - 1] + task.offsets[b - 1]
        assert q.memorised == q.answer + task.twist  # what the trained mirror (b, a) says
        words = q.text.split()
        assert len(words) == 10 and words[-1] == "=" and f"{q.key} A{a} A{b}" in q.text
    train = task.probes("train", 50, seed=1)
    assert {q.pair for q in train} <= set(task.train_pairs) and all(q.memorised is None for q in train)
    assert task.probes("train", 50, seed=1) == train and task.probes("train", 50, seed=2) != train


def test_label_noise_fraction():
    task = AnchorTask(n=4000, label_noise=0.25, seed=3)
    wrong = 0
    for doc in task.documents():
        key, a, b, answer = parse(doc)
        wrong += answer != key + task.shift((a, b))
    assert abs(wrong / 4000 - 0.25 * (1 - 1 / task.numbers)) < 0.03


def test_tokenizer_whole_words():
    tok = load_tokenizer("anchor")
    doc = next(iter(iter_documents(SPEC)))
    ids = tok.encode(doc)
    assert len(ids) == len(doc.split()) and tok.decode(ids) == doc
    assert tok.hf.token_to_id("<unk>") not in ids
    assert tok.eos_id not in tok.encode("<|endoftext|> 3")  # text cannot forge a document boundary


@pytest.mark.parametrize(
    "params, expect",
    [
        ("anchors=1", "anchors=1"),
        ("antchors=4", "unknown parameter"),
        ("seed=x", "not a number"),
        ("twist=0", "twist"),
        ("holdout=7", "holdout=7"),
        ("offsets=1,2", "offsets"),
        ("numbers=20", "raise numbers"),
    ],
)
def test_bad_parameters_one_line(params, expect):
    with pytest.raises(DataError, match=expect) as e:
        list(iter_documents(f"builtin:anchor?{params}"))
    assert "\n" not in str(e.value)


class RuleModel(nn.Module):
    """A model that answers every question by a rule (compose, or copy the mirror) — to check the scoring."""

    def __init__(self, task: AnchorTask, tok, memorise: bool):
        super().__init__()
        self.task, self.tok, self.memorise = task, tok, memorise
        self.anchor_ids = {tok.encode(f"A{k}")[0]: k for k in range(1, task.anchors + 1)}

    def forward(self, tokens, targets=None):
        logits = torch.zeros(*tokens.shape, self.tok.vocab_size)
        for row, seq in enumerate(tokens.tolist()):
            at = next(i for i, t in enumerate(seq) if t in self.anchor_ids)
            key = int(self.tok.decode([seq[at - 1]]))
            pair = (self.anchor_ids[seq[at]], self.anchor_ids[seq[at + 1]])
            if self.memorise and pair in self.task.heldout:
                pair = (pair[1], pair[0])
            logits[row, -1, self.tok.encode(str(key + self.task.shift(pair)))[0]] = 1.0
        return ModelOutput(logits=logits)


@pytest.mark.parametrize("memorise", [False, True])
def test_scores_of_rule_models(memorise):
    task, tok = AnchorTask.from_params(SPEC), load_tokenizer("anchor")
    s = anchor_scores(RuleModel(task, tok, memorise), tok, task, n=60)
    assert s["in_distribution"] == 1.0
    assert (s["heldout_reasoning"], s["heldout_memorising"]) == ((0.0, 1.0) if memorise else (1.0, 0.0))
    assert s["heldout_other"] == 0.0 and s["n"] == 60
