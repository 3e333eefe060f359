"""The token cache: a corpus tokenised once into flat train/val token files, memory-mapped on later loads.

Layout: ``<cache>/tokens/<key>/{train.bin,val.bin,meta.json}``, ``key`` = sha256 of (corpus fingerprint,
tokenizer fingerprint, val_fraction, seed, format version). Each document's tokens are followed by one
EOS token. Documents go to train or val by a hash of (document index, seed), so the split is stable and
needs no state; when there are at least two documents each split gets at least one (and a corpus of a
single document is split by position instead).

Writes are atomic: data goes to uniquely named temporary files that are renamed into place, metadata last,
so a reader sees either no cache or a complete one, and two processes building the same key (for example
the ranks of one torchrun job) cannot corrupt it; where ``fcntl`` exists they also take a lock so that only
one of them does the work. A cache whose files do not match its metadata is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from smallinit import io
from smallinit.data.batching import (
    document_starts,
    fitting_starts,
    get_batch,
    iter_eval_batches,
    repeat_message,
)
from smallinit.data.corpus import corpus_fingerprint, iter_documents
from smallinit.data.tokenizer import Tokenizer
from smallinit.errors import DataError, StorageError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CACHE_ENV = "SMALLINIT_CACHE"
_CHUNK_DOCS = 256  # documents per encode_batch call ...
_CHUNK_CHARS = 2 << 20  # ... or fewer, so a chunk holds at most ~2M characters (bounded memory)
_COPY_BLOCK = 1 << 24  # tokens per block when rewriting a split file
_PROGRESS_EVERY_S = 10.0


@dataclass
class TokenData:
    """Train and val token streams (1-D, uint16 when vocab_size <= 65535 else uint32, usually memmaps).

    ``bos`` (``data.bos``): windows begin at the end-of-text tokens between documents (``data.batching``).
    """

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    eos_id: int
    path: Path | None = None
    meta: dict = field(default_factory=dict)
    from_cache: bool = False
    bos: bool = False
    _starts: dict = field(default_factory=dict, repr=False, compare=False)  # split → end-of-text positions

    @property
    def dtype(self) -> np.dtype:
        return self.train.dtype

    def starts(self, split: str) -> np.ndarray | None:
        """The document boundaries of ``split`` ("train" or "val") when windows are BOS-aligned, else None."""
        if not self.bos:
            return None
        if split not in self._starts:
            self._starts[split] = document_starts(self.train if split == "train" else self.val, self.eos_id)
        return self._starts[split]

    def batch(
        self, batch_size: int, seq_len: int, seed: int, step: int, *, rank: int = 0, world_size: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of training batch ``step`` (``data.batching.get_batch``)."""
        return get_batch(
            self.train,
            batch_size,
            seq_len,
            seed,
            step,
            rank=rank,
            world_size=world_size,
            starts=self.starts("train"),
        )

    def eval_batches(
        self, batch_size: int, seq_len: int, max_batches: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The validation windows in order (``data.batching.iter_eval_batches``)."""
        return iter_eval_batches(self.val, batch_size, seq_len, max_batches, starts=self.starts("val"))

    def check(self, seq_len: int) -> None:
        """DataError unless each split holds a whole window (a BOS-aligned one with ``bos``)."""
        for split, name, tokens in (("train", "train", self.train), ("val", "validation", self.val)):
            if len(tokens) < seq_len + 1:
                raise DataError(
                    f"the {name} split has {len(tokens)} tokens, fewer than one sequence of {seq_len + 1}; "
                    "use a larger corpus, another data.val_fraction or a smaller data.seq_len"
                )
            if self.bos:
                fitting_starts(self.starts(split), len(tokens), seq_len, what=f"the {name} split")

    def repeats(self, steps: int, batch_size: int, seq_len: int, corpus: str) -> str | None:
        """One line when the run reads its train split more than once (``data.batching.repeat_message``)."""
        return repeat_message(steps, batch_size, seq_len, len(self.train), corpus)

    def describe(self) -> str:
        aligned = f", {len(self.starts('train')):,} documents to start from (data.bos)" if self.bos else ""
        return f"{len(self.train):,} training, {len(self.val):,} validation tokens{aligned}"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "smallinit"


def cache_key(corpus_fp: str, tokenizer_fp: str, val_fraction: float, seed: int) -> str:
    payload = {
        "corpus": corpus_fp,
        "tokenizer": tokenizer_fp,
        "val_fraction": float(val_fraction),
        "seed": int(seed),
        "format": FORMAT_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


_M64 = (1 << 64) - 1


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def doc_uniform(seed: int, doc_index: np.ndarray | int) -> np.ndarray:
    """A uniform number in [0, 1) per document, from (seed, document index) only."""
    idx = np.atleast_1d(np.asarray(doc_index, dtype=np.uint64))
    with np.errstate(over="ignore"):
        s = _mix64(np.full(idx.shape, int(seed) & _M64, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
        z = _mix64(s ^ ((idx + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _validate(val_fraction: float, seed: int) -> None:
    if not (0.0 <= float(val_fraction) < 1.0):
        raise DataError(f"val_fraction {val_fraction} is out of range; use a value in [0, 1), e.g. 0.05")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise DataError(f"data seed {seed!r} is not an integer; pass an integer seed")


def load_token_data(
    corpus: str,
    tokenizer: Tokenizer,
    *,
    val_fraction: float = 0.05,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    text_field: str = "text",
) -> TokenData:
    """Tokenise ``corpus`` with ``tokenizer`` (once; later calls memory-map the cached result)."""
    _validate(val_fraction, seed)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = cache_key(corpus_fingerprint(corpus, text_field), tokenizer.fingerprint, val_fraction, seed)
    folder = root / "tokens" / key[:40]
    data = _open(folder, key)
    if data is not None:
        return data
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(
            f"cannot create token cache folder {folder} ({e.strerror}); set {CACHE_ENV} to a writable folder"
        ) from None
    with _lock(folder):
        data = _open(folder, key)  # another process may have built it while we waited
        if data is not None:
            return data
        _build(
            folder,
            key,
            corpus,
            tokenizer,
            val_fraction=float(val_fraction),
            seed=int(seed),
            text_field=text_field,
        )
    data = _open(folder, key)
    if data is None:
        raise DataError(
            f"token cache {folder} could not be read back after writing; check the disk and retry"
        )
    data.from_cache = False
    return data


@contextlib.contextmanager
def _lock(folder: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no advisory locks here: unique temp names keep concurrent builds safe anyway
        yield
        return
    try:
        fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # e.g. a filesystem without locks
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def _open(folder: Path, key: str) -> TokenData | None:
    """The cached TokenData, or None when there is no complete, consistent cache."""
    meta_path = folder / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("key") != key or meta.get("format") != FORMAT_VERSION:
            return None
        dtype = np.dtype(meta["dtype"])
        arrays = {}
        for split in ("train", "val"):
            n = int(meta[f"n_{split}_tokens"])
            path = folder / f"{split}.bin"
            if path.stat().st_size != n * dtype.itemsize:
                log.warning("token cache %s: %s does not match its metadata; rebuilding", folder, path.name)
                return None
            arrays[split] = np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        return TokenData(
            train=arrays["train"],
            val=arrays["val"],
            vocab_size=int(meta["vocab_size"]),
            eos_id=int(meta["eos_id"]),
            path=folder,
            meta=meta,
            from_cache=True,
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _chunks(docs: Iterator[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    chars = 0
    for d in docs:
        chunk.append(d)
        chars += len(d)
        if len(chunk) >= _CHUNK_DOCS or chars >= _CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


class _SplitWriter:
    """Appends token runs to a temporary file and remembers one document span (a move candidate)."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path = path
        self.dtype = dtype
        self.f = open(path, "wb")  # noqa: SIM115 - closed in finish()
        self.n_tokens = 0
        self.n_docs = 0
        self.candidate: tuple[float, int, int] | None = None  # (u, start, length)

    def add(self, ids: list[int], u: float, prefer_low: bool) -> None:
        start, length = self.n_tokens, len(ids) + 1
        c = self.candidate
        if c is None or (u < c[0] if prefer_low else u > c[0]):
            self.candidate = (u, start, length)
        self.n_tokens += length
        self.n_docs += 1

    def write(self, tokens: list[int]) -> None:
        if tokens:
            np.asarray(tokens, dtype=self.dtype).tofile(self.f)

    def finish(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


def _tmp(folder: Path, name: str) -> Path:
    return folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"


def _build(
    folder: Path,
    key: str,
    corpus: str,
    tokenizer: Tokenizer,
    *,
    val_fraction: float,
    seed: int,
    text_field: str,
) -> None:
    dtype = token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_id
    if tokenizer.vocab_size > np.iinfo(dtype).max + 1:
        raise DataError(f"vocabulary of {tokenizer.vocab_size} tokens is too large; use at most 2**32 tokens")
    tmps = {s: _tmp(folder, s) for s in ("train", "val")}
    t0 = last = time.monotonic()
    writers: dict[str, _SplitWriter] = {}
    try:
        for s in ("train", "val"):
            writers[s] = _SplitWriter(tmps[s], dtype)
        n_docs = 0
        for chunk in _chunks(iter_documents(corpus, text_field)):
            encoded = tokenizer.encode_batch(chunk)
            us = doc_uniform(seed, np.arange(n_docs, n_docs + len(chunk), dtype=np.uint64))
            runs: dict[str, list[int]] = {"train": [], "val": []}
            for ids, u in zip(encoded, us.tolist()):
                split = "val" if u < val_fraction else "train"
                writers[split].add(ids, u, prefer_low=(split == "train"))
                run = runs[split]
                run.extend(ids)
                run.append(eos)
            for split, run in runs.items():
                writers[split].write(run)
            n_docs += len(chunk)
            now = time.monotonic()
            if now - last >= _PROGRESS_EVERY_S:
                last = now
                n_tok = writers["train"].n_tokens + writers["val"].n_tokens
                log.info(
                    "tokenising %s: %d documents, %d tokens, %.0f tokens/s",
                    corpus,
                    n_docs,
                    n_tok,
                    n_tok / (now - t0),
                )
        for w in writers.values():
            w.finish()
        tr, va = writers["train"], writers["val"]
        n_train, n_val = tr.n_tokens, va.n_tokens
        if n_docs == 1:
            n_train, n_val = _split_single(tr, va, dtype, val_fraction)
            n_train_docs, n_val_docs = 1, (1 if n_val else 0)  # the one document, split by position
        else:
            n_train_docs, n_val_docs = tr.n_docs, va.n_docs
            if val_fraction > 0 and n_val_docs == 0:
                _move(tr, va, dtype)
                n_train_docs, n_val_docs = n_train_docs - 1, 1
            elif n_train_docs == 0:
                _move(va, tr, dtype)
                n_train_docs, n_val_docs = 1, n_val_docs - 1
            n_train, n_val = tr.n_tokens, va.n_tokens
        meta = {
            "format": FORMAT_VERSION,
            "key": key,
            "corpus": str(corpus),
            "text_field": text_field,
            "tokenizer": tokenizer.name,
            "tokenizer_fingerprint": tokenizer.fingerprint,
            "vocab_size": tokenizer.vocab_size,
            "eos_id": eos,
            "dtype": dtype.name,
            "val_fraction": val_fraction,
            "seed": seed,
            "n_documents": n_docs,
            "n_train_documents": n_train_docs,
            "n_val_documents": n_val_docs,
            "n_train_tokens": n_train,
            "n_val_tokens": n_val,
            "seconds": round(time.monotonic() - t0, 3),
        }
        # Metadata goes last: until it is in place no reader trusts the data files.
        (folder / "meta.json").unlink(missing_ok=True)
        os.replace(tmps["train"], folder / "train.bin")
        os.replace(tmps["val"], folder / "val.bin")
        io.write_json_atomic(folder / "meta.json", meta, indent=1, sort_keys=False)
        log.info(
            "tokenised %s: %d documents, %d train + %d val tokens in %.1f s (cache %s)",
            corpus,
            n_docs,
            n_train,
            n_val,
            meta["seconds"],
            folder,
        )
    except (OSError, StorageError) as e:
        why = e.strerror if isinstance(e, OSError) else e.why
        raise DataError(
            f"cannot write token cache in {folder} ({why}); free disk space or set {CACHE_ENV} "
            "to a writable folder"
        ) from None
    finally:
        for w in writers.values():
            w.f.close()
        for p in tmps.values():
            p.unlink(missing_ok=True)


def _split_single(
    tr: _SplitWriter, va: _SplitWriter, dtype: np.dtype, val_fraction: float
) -> tuple[int, int]:
    """One document: its tokens (with the EOS) split by position, the last val_fraction going to val."""
    src = tr if tr.n_tokens else va
    tokens = np.fromfile(src.path, dtype=dtype)
    n = len(tokens)
    n_val = 0
    if val_fraction > 0 and n >= 2:
        n_val = min(max(1, round(n * val_fraction)), n - 1)
    for w, part in ((tr, tokens[: n - n_val]), (va, tokens[n - n_val :])):
        with open(w.path, "wb") as f:
            part.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        w.n_tokens = len(part)
    return n - n_val, n_val


def _move(src: _SplitWriter, dst: _SplitWriter, dtype: np.dtype) -> None:
    """Move src's candidate document (to an empty dst): dst = that span, src = the rest."""
    assert src.candidate is not None and dst.n_tokens == 0
    _, start, length = src.candidate
    tokens = np.memmap(src.path, dtype=dtype, mode="r", shape=(src.n_tokens,))
    new_src = src.path.with_name(src.path.name + ".move")
    try:
        with open(dst.path, "wb") as f:
            np.asarray(tokens[start : start + length]).tofile(f)
            f.flush()
            os.fsync(f.fileno())
        with open(new_src, "wb") as f:
            for lo, hi in ((0, start), (start + length, src.n_tokens)):
                for b in range(lo, hi, _COPY_BLOCK):
                    np.asarray(tokens[b : min(b + _COPY_BLOCK, hi)]).tofile(f)
            f.flush()
            os.fsync(f.fileno())
        del tokens
        os.replace(new_src, src.path)
    finally:
        new_src.unlink(missing_ok=True)
    src.n_tokens -= length
    dst.n_tokens = length
