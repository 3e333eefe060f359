"""Token-level comparison of two models (the paper's C7): where does one model gain on the other?

For each position, on the true next token: p_A, p_B, the symmetric gap Δ_sym = (p_A − p_B)/(p_A + p_B)
∈ [−1, 1] (> 0: A is better), the losses, and the token's difficulty = (loss_A + loss_B)/2. Computed as
Δ_sym = tanh((loss_B − loss_A)/2), which is the same quantity without underflow when both p are tiny.

:func:`token_gap` streams over batches and keeps fixed-size state only, so memory does not grow with the
corpus: a fine histogram of difficulty (log-spaced below 1 nat, 0.001 nat wide above, up to 40 nats)
holding per-bin sums, merged at the end into quantile bins (default 10) of equal token count, to within
one fine bin;
and two bounded heaps for the tokens with the largest gaps either way (ranked by the loss difference,
which orders tokens exactly as Δ_sym does).
"""

from __future__ import annotations

import heapq
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch import nn

from smallinit.adapters import as_adapter
from smallinit.data import Tokenizer, iter_documents
from smallinit.errors import DataError
from smallinit.io import write_result

# Fine difficulty bins (nats): [0, 1e-5), log-spaced to 1, then 0.001 wide to 40, then [40, ∞).
FINE_EDGES = np.unique(np.concatenate([[0.0], np.geomspace(1e-5, 1.0, 2001), np.linspace(1.0, 40.0, 39001)]))
PIECE_CHARS = 1 << 16  # long documents are encoded in pieces this long, split after a newline


@dataclass
class TokenGapBatch:
    """Per-token values for one batch, all (B, T); loss in nats."""

    p_a: torch.Tensor
    p_b: torch.Tensor
    loss_a: torch.Tensor
    loss_b: torch.Tensor
    delta_sym: torch.Tensor
    difficulty: torch.Tensor

    @property
    def loss_diff(self) -> torch.Tensor:
        """loss_B − loss_A: > 0 where A is better (same sign as Δ_sym)."""
        return self.loss_b - self.loss_a


def _token_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = as_adapter(model).observe(x).logits.float()
    return -torch.log_softmax(logits, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1).double()


@torch.no_grad()
def token_gap_batch(
    model_a: nn.Module, model_b: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> TokenGapBatch:
    """Per-token p, loss, Δ_sym and difficulty of models A and B on inputs x and next tokens y (B, T)."""
    loss_a, loss_b = _token_loss(model_a, x, y), _token_loss(model_b, x, y)
    return TokenGapBatch(
        p_a=torch.exp(-loss_a),
        p_b=torch.exp(-loss_b),
        loss_a=loss_a,
        loss_b=loss_b,
        delta_sym=torch.tanh((loss_b - loss_a) / 2),
        difficulty=(loss_a + loss_b) / 2,
    )


@dataclass
class GapToken:
    """One position with a large gap: the context before it, the true token, and both models' view."""

    context: list[int]
    target: int
    p_a: float
    p_b: float
    delta_sym: float
    loss_diff: float
    context_text: str = ""
    target_text: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class DifficultyBin:
    lo: float  # difficulty range (nats)
    hi: float
    count: int
    mean_difficulty: float
    mean_delta_sym: float
    se_delta_sym: float  # standard error of the mean (tokens treated as independent)
    mean_loss_diff: float  # loss_B − loss_A
    se_loss_diff: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class TokenGapResult:
    FILE = "compare.json"

    tokens: int
    mean_delta_sym: float
    mean_loss_a: float
    mean_loss_b: float
    bins: list[DifficultyBin]
    top_a: list[GapToken]  # largest gaps where A is better
    top_b: list[GapToken]  # largest gaps where B is better
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "mean_delta_sym": self.mean_delta_sym,
            "mean_loss_a": self.mean_loss_a,
            "mean_loss_b": self.mean_loss_b,
            "bins": [b.to_dict() for b in self.bins],
            "top_a": [t.to_dict() for t in self.top_a],
            "top_b": [t.to_dict() for t in self.top_b],
            "meta": self.meta,
        }

    def save(self, folder: str | os.PathLike) -> Path:
        """FOLDER/compare.json, which the HTML report reads back."""
        return write_result(Path(folder) / self.FILE, self.to_dict())

    @staticmethod
    def from_dict(raw: dict) -> TokenGapResult:
        return TokenGapResult(
            tokens=raw["tokens"],
            mean_delta_sym=raw["mean_delta_sym"],
            mean_loss_a=raw["mean_loss_a"],
            mean_loss_b=raw["mean_loss_b"],
            bins=[DifficultyBin(**b) for b in raw["bins"]],
            top_a=[GapToken(**t) for t in raw["top_a"]],
            top_b=[GapToken(**t) for t in raw["top_b"]],
            meta=dict(raw.get("meta", {})),
        )


class TokenGapAccumulator:
    """Fixed-memory running statistics of per-token gaps (see the module docstring)."""

    def __init__(self, *, top_k: int = 20, context: int = 24):
        self.edges = FINE_EDGES
        n = len(self.edges)
        self.count = np.zeros(n, dtype=np.int64)
        self.sums = {k: np.zeros(n) for k in ("difficulty", "delta", "delta2", "diff", "diff2")}
        self.loss_a = self.loss_b = 0.0
        self.top_k, self.context = top_k, context
        self.heaps: dict[str, list] = {"a": [], "b": []}
        self._tie = itertools.count()  # heap tie-breaker: first seen wins, deterministic

    def add(self, x: torch.Tensor, y: torch.Tensor, gap: TokenGapBatch) -> None:
        diff = gap.loss_diff.cpu().numpy().ravel()
        delta = gap.delta_sym.cpu().numpy().ravel()
        difficulty = gap.difficulty.cpu().numpy().ravel()
        idx = np.searchsorted(self.edges, difficulty, side="right") - 1
        self.count += np.bincount(idx, minlength=len(self.count))
        for key, v in (
            ("difficulty", difficulty),
            ("delta", delta),
            ("delta2", delta**2),
            ("diff", diff),
            ("diff2", diff**2),
        ):
            self.sums[key] += np.bincount(idx, weights=v, minlength=len(self.count))
        self.loss_a += gap.loss_a.sum().item()
        self.loss_b += gap.loss_b.sum().item()
        if self.top_k:
            self._push(x, y, gap, diff, "a")
            self._push(x, y, gap, -diff, "b")

    def _push(self, x, y, gap: TokenGapBatch, score: np.ndarray, side: str) -> None:
        heap = self.heaps[side]
        k = min(self.top_k, score.size)
        T = y.shape[1]
        for flat in np.argpartition(-score, k - 1)[:k]:
            s = float(score[flat])
            if s <= 0 or (len(heap) == self.top_k and s <= heap[0][0]):
                continue
            b, t = divmod(int(flat), T)
            item = GapToken(
                context=x[b, max(0, t + 1 - self.context) : t + 1].tolist(),
                target=int(y[b, t]),
                p_a=gap.p_a[b, t].item(),
                p_b=gap.p_b[b, t].item(),
                delta_sym=gap.delta_sym[b, t].item(),
                loss_diff=gap.loss_diff[b, t].item(),
            )
            entry = (s, -next(self._tie), item)
            if len(heap) < self.top_k:
                heapq.heappush(heap, entry)
            else:
                heapq.heapreplace(heap, entry)

    def result(self, bins: int = 10, tokenizer: Tokenizer | None = None) -> TokenGapResult:
        n = int(self.count.sum())
        if n == 0:
            raise DataError("token_gap saw no tokens; pass a corpus with at least one sequence of text")
        cum = np.cumsum(self.count)
        # Cut after the fine bin where the cumulative count first reaches each quantile.
        cuts = sorted({int(np.searchsorted(cum, q * n)) for q in np.arange(1, bins) / bins} | {len(cum) - 1})
        out, start = [], 0
        for stop in cuts:
            sl = slice(start, stop + 1)
            c = int(self.count[sl].sum())
            start = stop + 1
            if c == 0:
                continue
            s = {k: float(v[sl].sum()) for k, v in self.sums.items()}
            out.append(
                DifficultyBin(
                    lo=float(self.edges[sl.start]),
                    hi=float(self.edges[stop + 1]) if stop + 1 < len(self.edges) else float("inf"),
                    count=c,
                    mean_difficulty=s["difficulty"] / c,
                    mean_delta_sym=s["delta"] / c,
                    se_delta_sym=_se(s["delta"], s["delta2"], c),
                    mean_loss_diff=s["diff"] / c,
                    se_loss_diff=_se(s["diff"], s["diff2"], c),
                )
            )
        top = {
            side: [e[2] for e in sorted(h, key=lambda e: (-e[0], -e[1]))] for side, h in self.heaps.items()
        }
        if tokenizer is not None:
            for item in top["a"] + top["b"]:
                item.context_text = tokenizer.decode(item.context)
                item.target_text = tokenizer.decode([item.target])
        return TokenGapResult(
            tokens=n,
            mean_delta_sym=float(self.sums["delta"].sum()) / n,
            mean_loss_a=self.loss_a / n,
            mean_loss_b=self.loss_b / n,
            bins=out,
            top_a=top["a"],
            top_b=top["b"],
        )


def _se(total: float, total_sq: float, n: int) -> float:
    if n < 2:
        return float("nan")
    var = max(total_sq / n - (total / n) ** 2, 0.0) * n / (n - 1)
    return float(np.sqrt(var / n))


def _pieces(doc: str) -> Iterator[str]:
    """A document in pieces of about PIECE_CHARS, cut after a newline where there is one."""
    start = 0
    while start < len(doc):
        stop = start + PIECE_CHARS
        if stop < len(doc):
            nl = doc.rfind("\n", start, stop)
            stop = nl + 1 if nl > start else stop
        yield doc[start:stop]
        start = stop


def text_batches(
    corpus: str | os.PathLike,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    batch_size: int = 8,
    text_field: str = "text",
    max_tokens: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Stream (x, y) batches of consecutive windows from a corpus (documents followed by EOS, as in
    training), without holding the corpus in memory. At most ``max_tokens`` predicted tokens."""
    buf: list[int] = []
    rows: list[list[int]] = []
    emitted = 0

    def full_rows() -> Iterator[list[int]]:
        nonlocal buf
        while len(buf) >= seq_len + 1:
            yield buf[: seq_len + 1]
            buf = buf[seq_len:]  # the window's last token is the next window's first input

    for doc in iter_documents(corpus, text_field=text_field):
        for piece in _pieces(doc):
            buf.extend(tokenizer.encode(piece))
            for row in full_rows():
                rows.append(row)
                if len(rows) == batch_size:
                    yield _to_xy(rows)
                    emitted += batch_size * seq_len
                    rows = []
                    if max_tokens is not None and emitted >= max_tokens:
                        return
        buf.append(tokenizer.eos_id)
    for row in full_rows():
        rows.append(row)
    if rows:
        yield _to_xy(rows)


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def with_progress(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    label: str,
    total_tokens: int | None,
    echo: TextIO | None,
    every_s: float = 10.0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` as they are, with progress lines on ``echo`` (None: silent): one before the first batch, one
    after it (the first estimate of the time left), one at most every ``every_s`` seconds, one at the end. The
    time counted is the consumer's too: a batch is done when the next one is asked for."""
    if echo is None:
        yield from batches
        return
    of = f" of {total_tokens:,}" if total_tokens else ""
    print(f"{label}: measuring {f'{total_tokens:,} ' if total_tokens else ''}tokens", file=echo, flush=True)
    start = last = time.monotonic()
    done = n = 0
    for x, y in batches:
        yield x, y
        done, n = done + y.numel(), n + 1
        now = time.monotonic()
        if (n == 1 or now - last >= every_s) and not (total_tokens and done >= total_tokens):
            last, spent = now, now - start
            left = (
                f" ({done / total_tokens:.0%}), about {_duration(spent / done * (total_tokens - done))} left"
                if total_tokens
                else ""
            )
            print(f"{label}: {done:,}{of} tokens in {_duration(spent)}{left}", file=echo, flush=True)
    print(f"{label}: {done:,} tokens in {_duration(time.monotonic() - start)}", file=echo, flush=True)


def _to_xy(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.tensor(rows, dtype=torch.long)
    return w[:, :-1], w[:, 1:]


def token_gap(
    model_a: nn.Module,
    model_b: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    tokenizer: Tokenizer | None = None,
    bins: int = 10,
    top_k: int = 20,
    context: int = 24,
) -> TokenGapResult:
    """Compare two models token by token over a stream of (x, y) batches (see :func:`text_batches`).

    Returns mean Δ_sym, per-difficulty-bin means (quantile bins), and the ``top_k`` largest gaps each way,
    decoded with ``context`` tokens of context when a tokenizer is given.
    """
    if bins < 1 or top_k < 0 or context < 0:
        raise DataError(f"need bins ≥ 1, top_k ≥ 0 and context ≥ 0, got {bins}, {top_k}, {context}")
    device = next(model_a.parameters()).device
    acc = TokenGapAccumulator(top_k=top_k, context=context)
    halves = (TokenGapAccumulator(top_k=0), TokenGapAccumulator(top_k=0))  # even and odd batches
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        gap = token_gap_batch(model_a, model_b, x, y)
        acc.add(x.cpu(), y.cpu(), gap)
        halves[i % 2].add(x.cpu(), y.cpu(), gap)
    result = acc.result(bins, tokenizer)
    if all(h.count.sum() for h in halves):
        # a claim's precondition judged on one half of the tokens and its profile on the other (smallinit C7)
        gate, profile = (h.result(bins) for h in halves)
        result.meta["split"] = {
            "gate_mean_delta_sym": gate.mean_delta_sym,
            "gate_tokens": gate.tokens,
            "profile_bins": [b.mean_delta_sym for b in profile.bins],
            "profile_tokens": profile.tokens,
        }
    return result


def bigram_loss(
    train: np.ndarray, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int, k: float = 0.1
) -> float:
    """Mean next-token loss (nats) on ``batches`` of an add-``k`` bigram model counted on ``train`` tokens:
    the floor a trained language model should be under before its token-level profile means anything."""
    train = np.asarray(train, dtype=np.int64)
    codes, counts = np.unique(train[:-1] * vocab_size + train[1:], return_counts=True)
    unigram = np.bincount(train[:-1], minlength=vocab_size).astype(np.float64)
    total, n = 0.0, 0
    for x, y in batches:
        prev, nxt = x.reshape(-1).numpy().astype(np.int64), y.reshape(-1).numpy().astype(np.int64)
        want = prev * vocab_size + nxt
        at = np.minimum(np.searchsorted(codes, want), len(codes) - 1)
        pair = np.where(codes[at] == want, counts[at], 0).astype(np.float64)
        total += float(-np.log((pair + k) / (unigram[prev] + k * vocab_size)).sum())
        n += len(prev)
    return total / max(n, 1)
