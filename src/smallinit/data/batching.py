"""Batches from a flat token stream, stateless: batch ``step`` is a pure function of (seed, step).

Training batches are random windows whose start offsets come from a fresh generator seeded with
``[seed, step]``, so any step's batch can be recomputed without replaying the ones before it (exact
resume), and every rank computes the same global batch and takes its own contiguous slice (the data a
run sees does not depend on the number of ranks).

BOS-aligned windows (``data.bos``): given ``starts``, the positions of the end-of-text tokens that separate
documents, every window begins at one of them, so position 0 of every sequence is an end-of-text token acting as
BOS and the document follows it (a document shorter than the window runs on into the next one). Training windows
draw their start uniformly among those positions; evaluation windows take them in order, skipping any that would
overlap the window before, so every target token is still scored at most once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from smallinit.errors import DataError


def _check_sizes(n_tokens: int, batch_size: int, seq_len: int, what: str = "corpus") -> None:
    if batch_size < 1:
        raise DataError(f"batch size {batch_size} is invalid; use a positive batch size")
    if seq_len < 1:
        raise DataError(f"data.seq_len {seq_len} is invalid; use a positive sequence length")
    if n_tokens < seq_len + 1:
        raise DataError(
            f"{what} has {n_tokens} tokens, fewer than one sequence of seq_len+1 = {seq_len + 1}; "
            "use a larger corpus or a smaller data.seq_len"
        )


def document_starts(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """The positions (int64, ascending) of the end-of-text tokens in ``tokens``: where BOS-aligned windows begin."""
    return np.flatnonzero(np.asarray(tokens) == eos_id).astype(np.int64)


def fitting_starts(starts: np.ndarray, n_tokens: int, seq_len: int, what: str = "corpus") -> np.ndarray:
    """The document starts from which a whole window of seq_len + 1 tokens fits; DataError if there is none."""
    fit = starts[: np.searchsorted(starts, int(n_tokens) - int(seq_len), side="left")]
    if not len(fit):
        raise DataError(
            f"{what} has no document boundary (end-of-text token) followed by seq_len+1 = {seq_len + 1} tokens, "
            "so data.bos has no window to give; use a corpus with more documents, a smaller data.seq_len, or "
            "data.bos = false"
        )
    return fit


def batch_starts(
    n_tokens: int, batch_size: int, seq_len: int, seed: int, step: int, *, starts: np.ndarray | None = None
) -> np.ndarray:
    """Start offsets (int64, shape (batch_size,)) of the windows of global batch ``step``.

    Each window covers tokens [start, start + seq_len + 1), so start <= n_tokens - seq_len - 1. With ``starts``
    (document boundaries) every offset is one of them.
    """
    _check_sizes(int(n_tokens), int(batch_size), int(seq_len))
    if seed < 0 or step < 0:
        raise DataError(f"seed {seed} and step {step} must be non-negative; pass non-negative integers")
    rng = np.random.default_rng([int(seed), int(step)])
    if starts is None:
        return rng.integers(0, int(n_tokens) - int(seq_len), size=int(batch_size), dtype=np.int64)
    fit = fitting_starts(starts, n_tokens, seq_len)
    return fit[rng.integers(0, len(fit), size=int(batch_size), dtype=np.int64)]


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(seq_len + 1, dtype=np.int64)[None, :]
    w = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def get_batch(
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    seed: int,
    step: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    starts: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x and targets y (y = x shifted by one), int64, shape (batch_size // world_size, seq_len).

    ``batch_size`` is the global batch; rank r takes rows [r * b, (r + 1) * b) of it, b = batch_size // world_size.
    With ``starts`` (document boundaries) every window begins at one of them.
    """
    if world_size < 1 or not (0 <= rank < world_size):
        raise DataError(f"rank {rank} / world size {world_size} is invalid; need 0 <= rank < world_size")
    if batch_size % world_size:
        raise DataError(
            f"global batch size {batch_size} does not divide by the {world_size} ranks; "
            "use a batch size that is a multiple of the number of ranks"
        )
    offsets = batch_starts(len(tokens), batch_size, seq_len, seed, step, starts=starts)
    b = batch_size // world_size
    return _windows(tokens, offsets[rank * b : (rank + 1) * b], seq_len)


def epochs(steps: int, batch_size: int, seq_len: int, n_train_tokens: int) -> float:
    """How many times over a run of ``steps`` global batches reads its train split, on average."""
    return int(steps) * int(batch_size) * int(seq_len) / max(1, int(n_train_tokens))


def repeat_message(steps: int, batch_size: int, seq_len: int, n_train_tokens: int, corpus: str) -> str | None:
    """One line when a run's tokens exceed one epoch of its corpus's train split (it sees data again), else None."""
    n = epochs(steps, batch_size, seq_len, n_train_tokens)
    if n <= 1.0:
        return None
    return (
        f"data repeats: {int(steps) * int(batch_size) * int(seq_len):,} training tokens are {n:.2f} epochs of "
        f"the {int(n_train_tokens):,}-token train split of data.corpus={corpus!r}; use a larger corpus "
        "(e.g. data.corpus=large, ≈ 25M train tokens with the byte tokenizer) or fewer train.steps"
    )


def n_eval_windows(n_tokens: int, seq_len: int) -> int:
    """How many non-overlapping evaluation windows a split of ``n_tokens`` tokens holds."""
    return max(0, (int(n_tokens) - 1) // int(seq_len))


def eval_starts(n_tokens: int, seq_len: int, starts: np.ndarray) -> np.ndarray:
    """BOS-aligned evaluation windows: document starts in order, each at least ``seq_len`` after the last taken."""
    fit = fitting_starts(starts, n_tokens, seq_len, what="validation split")
    taken, next_free = [], -1
    for s in fit.tolist():
        if s >= next_free:
            taken.append(s)
            next_free = s + int(seq_len)
    return np.asarray(taken, dtype=np.int64)


def iter_eval_batches(
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    max_batches: int | None = None,
    *,
    starts: np.ndarray | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic evaluation batches: consecutive windows with stride ``seq_len`` from the start.

    Window k has inputs tokens[k*seq_len : (k+1)*seq_len] and the targets one further, so every target
    token is scored at most once. The last batch may be smaller; at most ``max_batches`` batches. With ``starts``
    (document boundaries) the windows begin at document boundaries instead (:func:`eval_starts`).
    """
    _check_sizes(len(tokens), int(batch_size), int(seq_len), what="validation split")
    offsets = (
        np.arange(n_eval_windows(len(tokens), seq_len), dtype=np.int64) * seq_len
        if starts is None
        else eval_starts(len(tokens), seq_len, starts)
    )
    n_win = len(offsets)
    if max_batches is not None:
        n_win = min(n_win, max(0, int(max_batches)) * batch_size)
    for lo in range(0, n_win, batch_size):
        yield _windows(tokens, offsets[lo : min(lo + batch_size, n_win)], seq_len)
