"""Scoring the anchor-function probe: in-distribution accuracy, and reasoning vs memorising on held-out pairs.

The model reads ``<EOS> question =`` and its most likely next token is its answer. On the training pairs
(fresh questions) the answer is right or wrong; on a held-out pair (a, b) it is the composition
x + δ_a + δ_b (reasoning, the inferential solution), the trained answer of the mirror (b, a) (memorising,
the symmetric solution), or something else.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from smallinit.data import Tokenizer
from smallinit.data.anchor import AnchorTask, Question
from smallinit.errors import ConfigError


def _answers(model: nn.Module, tok: Tokenizer, questions: list[Question], batch_size: int) -> list[int]:
    """The model's greedy answer (a token id) to each question."""
    rows = [[tok.eos_id, *tok.encode(q.text)] for q in questions]
    if len({len(r) for r in rows}) != 1:
        raise ConfigError("anchor questions must tokenize to equal lengths; use data.tokenizer=anchor")
    out = []
    for lo in range(0, len(rows), batch_size):
        x = torch.tensor(rows[lo : lo + batch_size], dtype=torch.long)
        logits = model(x.to(_device(model))).logits
        out += logits[:, -1].argmax(-1).tolist()
    return out


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _token(tok: Tokenizer, number: int) -> int:
    ids = tok.encode(str(number))
    if len(ids) != 1:
        raise ConfigError(
            f"the tokenizer splits the number {number} into {len(ids)} tokens; use data.tokenizer=anchor"
        )
    return ids[0]


@torch.no_grad()
def anchor_scores(
    model: nn.Module,
    tokenizer: Tokenizer,
    task: AnchorTask,
    *,
    n: int = 512,
    seed: int = 0,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Fractions over ``n`` fresh questions of each kind (the pairs visited round robin).

    ``in_distribution``: right answers on training pairs. ``heldout_reasoning`` / ``heldout_memorising`` /
    ``heldout_other``: on held-out pairs, the composition / the mirror's trained answer / anything else.
    ``per_pair`` breaks the held-out fractions down by pair.
    """
    was_training = model.training
    model.eval()
    try:
        train_q, held_q = task.probes("train", n, seed), task.probes("heldout", n, seed)
        train_a = _answers(model, tokenizer, train_q, batch_size)
        held_a = _answers(model, tokenizer, held_q, batch_size)
    finally:
        model.train(was_training)
    in_dist = sum(a == _token(tokenizer, q.answer) for q, a in zip(train_q, train_a)) / n
    per_pair: dict[str, dict[str, float]] = {}
    reasoning = memorising = 0
    for pair in task.heldout:
        qa = [(q, a) for q, a in zip(held_q, held_a) if q.pair == pair]
        r = sum(a == _token(tokenizer, q.answer) for q, a in qa)
        m = sum(a == _token(tokenizer, q.memorised) for q, a in qa)
        reasoning, memorising = reasoning + r, memorising + m
        per_pair[f"A{pair[0]} A{pair[1]}"] = {
            "reasoning": r / len(qa),
            "memorising": m / len(qa),
            "n": len(qa),
        }
    return {
        "in_distribution": in_dist,
        "heldout_reasoning": reasoning / n,
        "heldout_memorising": memorising / n,
        "heldout_other": (n - reasoning - memorising) / n,
        "n": n,
        "per_pair": per_pair,
    }
