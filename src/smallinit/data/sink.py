"""The sink task: Bigram-Backcopy (Guo et al. 2024, arXiv 2410.13835), a task whose solution needs a head that is
active on some tokens and idle on the others — the situation in which an attention sink forms.

Sequences follow a fixed random Markov chain over ``symbols`` symbols, except after a *trigger* symbol, where the
next symbol copies the one before the trigger::

    <bos> 17 40 T2 17 5 ...        (T2 is a trigger: the symbol after it repeats 17, the one before it)

A one-layer model solves it with a head that, on a trigger, attends to the previous token and copies it, and on
every other token does nothing (the bigram is read from the current token). Softmax attention cannot attend to
nothing; without a gate the head parks its attention on the first token (the BOS, with a small value vector):
the attention sink. The output gate lets the head close instead.

Parameters come from the corpus spec's query string, e.g. ``builtin:sink?symbols=64&triggers=3&seed=0``:

* ``symbols`` (64; 4–256) chain symbols, the number words 0…symbols−1 of the ``anchor`` tokenizer
* ``triggers`` (3; 1…symbols/2) how many of them are triggers, drawn from ``seed``
* ``rate`` (0.15; in (0, 1)) probability that a bigram step emits a trigger (uniformly one of them)
* ``alpha`` (0.3; > 0) Dirichlet concentration of each symbol's transition row over the non-triggers (small →
  near-deterministic bigrams)
* ``val`` (512) validation sequences
* ``seed`` (0) the chain and the triggers

Nothing is stored: the training sequences of step ``s`` are drawn fresh from a generator seeded with
(task seed, run seed, ``s``), so every step sees new data, any step's batch is recomputed without the ones before
it (exact resume) and every rank computes the same global batch. The validation sequences come from their own
stream of the task seed alone, so every run of a task is evaluated on the same sequences. With ``data.bos`` a
sequence is ``<bos>`` (the tokenizer's end-of-text token) followed by the chain; without it the chain starts at
position 0 and its first symbol is the only candidate for a sink.
"""

from __future__ import annotations

import functools
import hashlib
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch

from smallinit.data.tokenizer import MAX_NUMBERS, Tokenizer
from smallinit.errors import DataError

_FORMAT = 1  # bump when the generator changes (it is part of the fingerprint)
_STREAM_CHAIN, _STREAM_TRAIN, _STREAM_VAL = 0, 1, 2  # independent random streams
BOS = -1  # the BOS placeholder in symbol arrays


@dataclass(frozen=True)
class SinkTask:
    """The task's parameters; the transition matrix and the triggers are drawn from ``seed`` in ``__post_init__``."""

    symbols: int = 64
    triggers: int = 3
    rate: float = 0.15
    alpha: float = 0.3
    val: int = 512
    seed: int = 0
    trigger_set: tuple[int, ...] = field(init=False, default=())
    # (symbols, symbols) cumulative
    cdf: np.ndarray = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not 4 <= self.symbols <= MAX_NUMBERS:
            raise DataError(f"sink task: symbols={self.symbols} must be in 4..{MAX_NUMBERS}")
        if not 1 <= self.triggers <= self.symbols // 2:
            raise DataError(f"sink task: triggers={self.triggers} must be in 1..{self.symbols // 2}")
        if not 0 < self.rate < 1:
            raise DataError(f"sink task: rate={self.rate} must be in (0, 1)")
        if not self.alpha > 0:
            raise DataError(f"sink task: alpha={self.alpha} must be > 0")
        if self.val < 1 or self.seed < 0:
            raise DataError(f"sink task: val={self.val} must be ≥ 1 and seed={self.seed} ≥ 0")
        rng = np.random.default_rng([self.seed, _STREAM_CHAIN])
        trig = np.sort(rng.choice(self.symbols, size=self.triggers, replace=False))
        plain = np.setdiff1d(np.arange(self.symbols), trig)
        P = np.zeros((self.symbols, self.symbols))
        P[:, plain] = (1 - self.rate) * rng.dirichlet(np.full(len(plain), self.alpha), size=self.symbols)
        P[:, trig] = self.rate / self.triggers
        object.__setattr__(self, "trigger_set", tuple(int(t) for t in trig))
        object.__setattr__(self, "cdf", np.cumsum(P, axis=1))

    @property
    def transitions(self) -> np.ndarray:
        """P[x, y]: the probability of y after x when x is not a trigger (after a trigger the next symbol copies)."""
        return np.diff(self.cdf, axis=1, prepend=0.0)

    # -- sequences ----------------------------------------------------------------------------------------

    def sample(self, rng: np.random.Generator, n: int, length: int, *, bos: bool) -> np.ndarray:
        """``n`` sequences of ``length`` symbols (int64, BOS = -1 at position 0 when ``bos``)."""
        out = np.empty((n, length), dtype=np.int64)
        start = 1 if bos else 0
        if bos:
            out[:, 0] = BOS
        plain = np.setdiff1d(np.arange(self.symbols), self.trigger_set)
        is_trigger = np.zeros(self.symbols, dtype=bool)
        is_trigger[list(self.trigger_set)] = True
        u = rng.random((n, length))
        if start < length:  # the chain's first symbol: uniform over the non-triggers (nothing to copy yet)
            out[:, start] = plain[np.minimum((u[:, start] * len(plain)).astype(np.int64), len(plain) - 1)]
        for t in range(start + 1, length):
            cur = out[:, t - 1]
            bigram = np.minimum((u[:, t, None] >= self.cdf[cur]).sum(axis=1), self.symbols - 1)
            copy = out[:, t - 2] if t - 2 >= start else bigram
            out[:, t] = np.where(is_trigger[cur], copy, bigram)
        return out

    def optimal_loss(self, seqs: np.ndarray) -> float:
        """The Bayes-optimal mean next-token loss (nats) on ``seqs`` (symbol arrays as :meth:`sample` returns):
        0 after a trigger with something to copy, −log P[x, y] after any other symbol; BOS targets never occur."""
        x, y = seqs[:, :-1], seqs[:, 1:]
        prev = np.concatenate([np.full((len(seqs), 1), BOS), seqs[:, :-2]], axis=1)
        is_trigger = np.zeros(self.symbols, dtype=bool)
        is_trigger[list(self.trigger_set)] = True
        first = x == BOS  # the chain's first symbol: uniform over the non-triggers
        n_plain = self.symbols - self.triggers
        P = self.transitions
        copy = ~first & is_trigger[np.where(first, 0, x)] & (prev != BOS)
        nll = np.where(first, np.log(n_plain), -np.log(np.maximum(P[np.where(first, 0, x), y], 1e-300)))
        nll = np.where(copy, 0.0, nll)
        return float(nll.mean())

    # -- spec strings -------------------------------------------------------------------------------------

    @staticmethod
    def from_params(params: str = "") -> SinkTask:
        """Parse ``"symbols=64&triggers=3"`` (a spec's query string; ``builtin:sink?`` may lead)."""
        params = params.partition("?")[2] if is_sink_spec(params) or "?" in params else params
        known = {f.name: f.type for f in fields(SinkTask) if f.init}
        kwargs: dict = {}
        for key, values in urllib.parse.parse_qs(params, keep_blank_values=True).items():
            if key not in known:
                raise DataError(f"sink task: unknown parameter {key!r}; known: {', '.join(known)}")
            try:
                kwargs[key] = float(values[-1]) if key in ("rate", "alpha") else int(values[-1])
            except ValueError:
                raise DataError(f"sink task: {key}={values[-1]!r} is not a number") from None
        return SinkTask(**kwargs)

    def params(self) -> str:
        """The canonical query string (every parameter)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("trigger_set", "cdf")}
        return urllib.parse.urlencode(d)

    def spec(self) -> str:
        return f"builtin:sink?{self.params()}"

    def fingerprint(self) -> str:
        blob = json.dumps({"format": _FORMAT, "params": self.params()}, sort_keys=True).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()


class SinkData:
    """The sink task as a run's data: fresh training batches per step, fixed validation sequences."""

    def __init__(self, task: SinkTask, tokenizer: Tokenizer, *, bos: bool):
        ids = []
        for k in range(task.symbols):
            enc = tokenizer.encode(str(k))
            if len(enc) != 1:
                raise DataError(
                    f"the sink task's symbol {k} is not one token of tokenizer {tokenizer.name}; "
                    'use data.tokenizer = "anchor" (one token per number)'
                )
            ids.append(enc[0])
        self.task, self.bos = task, bos
        self.vocab_size, self.eos_id = tokenizer.vocab_size, tokenizer.eos_id
        self._ids = np.asarray(ids + [tokenizer.eos_id], dtype=np.int64)  # index −1 (BOS) → end-of-text

    def tokens(self, symbols: np.ndarray) -> np.ndarray:
        """Symbol arrays (BOS = −1) as token ids."""
        return self._ids[symbols]

    def _xy(self, symbols: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(self.tokens(symbols))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def train_symbols(self, batch_size: int, seq_len: int, seed: int, step: int) -> np.ndarray:
        """The global batch of step ``step``: (batch_size, seq_len + 1) symbols, a pure function of its arguments."""
        if seed < 0 or step < 0:
            raise DataError(f"seed {seed} and step {step} must be non-negative; pass non-negative integers")
        rng = np.random.default_rng([self.task.seed, _STREAM_TRAIN, int(seed), int(step)])
        return self.task.sample(rng, int(batch_size), int(seq_len) + 1, bos=self.bos)

    @functools.lru_cache(maxsize=4)  # noqa: B019 - a few lengths per run; the data object lives as long as the run
    def val_symbols(self, seq_len: int) -> np.ndarray:
        """The ``val`` validation sequences of ``seq_len + 1`` symbols (the same for every run of the task)."""
        rng = np.random.default_rng([self.task.seed, _STREAM_VAL])
        return self.task.sample(rng, self.task.val, int(seq_len) + 1, bos=self.bos)

    def batch(
        self, batch_size: int, seq_len: int, seed: int, step: int, *, rank: int = 0, world_size: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of this rank's rows of step ``step``'s global batch (as ``get_batch``)."""
        if world_size < 1 or not (0 <= rank < world_size) or batch_size % world_size:
            raise DataError(
                f"global batch size {batch_size} must divide over {world_size} ranks (rank {rank})"
            )
        b = batch_size // world_size
        return self._xy(self.train_symbols(batch_size, seq_len, seed, step)[rank * b : (rank + 1) * b])

    def eval_batches(
        self, batch_size: int, seq_len: int, max_batches: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The validation sequences in order, ``batch_size`` at a time; at most ``max_batches`` batches."""
        val = self.val_symbols(int(seq_len))
        n = len(val) if max_batches is None else min(len(val), max(0, int(max_batches)) * batch_size)
        for lo in range(0, n, batch_size):
            yield self._xy(val[lo : min(lo + batch_size, n)])

    def check(self, seq_len: int) -> None:
        """Nothing to check: any length can be generated."""

    def repeats(self, steps: int, batch_size: int, seq_len: int, corpus: str) -> None:
        """Never: every step's sequences are fresh."""

    def describe(self) -> str:
        bos = "<bos> then " if self.bos else ""
        return (
            f"generated fresh each step: {bos}a Bigram-Backcopy chain of {self.task.symbols} symbols, "
            f"{self.task.triggers} triggers; {self.task.val} validation sequences"
        )


def is_sink_spec(corpus: str) -> bool:
    return corpus == "builtin:sink" or corpus.startswith("builtin:sink?")
