"""Tokenizers: the shipped byte-level BPE ("default"), a 257-token byte tokenizer ("bytes"), the anchor task's
whole words ("anchor"), or a file.

The byte-level ones give ``decode(encode(text)) == text`` for any text (English, Chinese, emoji, control
characters). The end-of-text token ``<|endoftext|>`` separates documents; it is only ever produced by the
data pipeline, never by encoding text (a literal "<|endoftext|>" in a corpus is encoded as ordinary bytes,
or as ``<unk>`` by the anchor tokenizer), so a user's text cannot forge a document boundary.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from smallinit import io
from smallinit.errors import CheckpointError, DataError

EOS_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 8192
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
DEFAULT_TOKENIZER_FILE = BUILTIN_DIR / "tokenizer-default.json"
BUILTIN_TOKENIZERS = ("default", "bytes", "anchor")
# The anchor task's words (smallinit.data.anchor): its tokenizer is built here, with the other builtins.
MAX_ANCHORS = 16
MAX_NUMBERS = 256
ANSWER_MARK = "="
_UNK = "<unk>"


class Tokenizer:
    """A thin wrapper around a ``tokenizers.Tokenizer`` with an end-of-text token."""

    def __init__(self, hf: HFTokenizer, name: str = "custom"):
        eos_id = hf.token_to_id(EOS_TOKEN)
        if eos_id is None:
            raise DataError(
                f"tokenizer '{name}' has no {EOS_TOKEN} token; add it as a special token or train one "
                "with smallinit.data.train_tokenizer"
            )
        # Special tokens in text are encoded as plain bytes: only the pipeline inserts EOS.
        hf.encode_special_tokens = True
        self.hf = hf
        self.name = name
        self.eos_id: int = int(eos_id)
        self.vocab_size: int = int(hf.get_vocab_size(with_added_tokens=True))
        self._json = hf.to_str()
        self.fingerprint: str = hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts at once (parallel inside ``tokenizers``)."""
        if not texts:
            return []
        fast = getattr(self.hf, "encode_batch_fast", None)  # skips offset tracking where available
        encs = (fast or self.hf.encode_batch)(list(texts), add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer JSON atomically; returns the path."""
        path = Path(path)
        io.make_folder(path.parent)
        io.write_text_atomic(path, self._json)
        return path

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _byte_level_parts(hf: HFTokenizer) -> None:
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()


def bytes_tokenizer() -> Tokenizer:
    """256 byte tokens (id == byte value) plus ``<|endoftext|>`` (id 256): vocabulary 257."""
    byte_to_char = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins, unordered
    table = _bytes_to_unicode()
    assert set(table.values()) == set(byte_to_char)
    vocab = {table[b]: b for b in range(256)}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    _byte_level_parts(hf)
    hf.add_special_tokens([EOS_TOKEN])
    return Tokenizer(hf, name="bytes")


def anchor_token(k: int) -> str:
    """The token of anchor k (1-based)."""
    return f"A{k}"


def anchor_tokenizer() -> Tokenizer:
    """Whole-word tokenizer for every anchor task: <unk>, '=', A1…A16, numbers 0…255, EOS (vocabulary 275).

    EOS is only an added special token, not a word of the model, so a literal "<|endoftext|>" in text
    encodes as <unk> and cannot forge a document boundary.
    """
    words = [_UNK, ANSWER_MARK]
    words += [anchor_token(k) for k in range(1, MAX_ANCHORS + 1)]
    words += [str(i) for i in range(MAX_NUMBERS)]
    hf = HFTokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=_UNK))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens([EOS_TOKEN])
    return Tokenizer(hf, name="anchor")


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte -> printable character table used by the ByteLevel pre-tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def load_tokenizer(name: str | os.PathLike) -> Tokenizer:
    """``"default"`` (shipped BPE, vocabulary 8192), ``"bytes"`` (vocabulary 257), ``"anchor"`` (whole words of
    the synthetic anchor task, vocabulary 275) or a tokenizer.json path."""
    if isinstance(name, str) and name == "bytes":
        return bytes_tokenizer()
    if isinstance(name, str) and name == "anchor":
        return anchor_tokenizer()
    if isinstance(name, str) and name == "default":
        path = DEFAULT_TOKENIZER_FILE
        if not path.is_file():
            raise DataError(
                f"the default tokenizer file {path} is missing; reinstall smallinit or run "
                "scripts/build_builtin_data.py"
            )
    else:
        path = Path(name).expanduser()
        if not path.exists():
            raise DataError(
                f"tokenizer '{name}' not found: not one of {', '.join(BUILTIN_TOKENIZERS)} and no such file; "
                "pass 'default', 'bytes' or a path to a tokenizer.json"
            )
        if path.is_dir():
            path = path / "tokenizer.json"
            if not path.is_file():
                raise DataError(
                    f"no tokenizer.json in folder {name}; pass the path of the tokenizer.json file"
                )
    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exceptions on bad JSON
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(
            f"cannot read tokenizer file {path} ({msg}); pass a tokenizer.json saved by Hugging Face tokenizers"
        ) from None
    return Tokenizer(hf, name=str(name) if name == "default" else str(path))


def run_tokenizer(name: str, vocab_size: int) -> Tokenizer:
    """The tokenizer a run names (``data.tokenizer``), refused if it no longer has the model's vocabulary."""
    if name not in BUILTIN_TOKENIZERS and not Path(name).expanduser().exists():
        raise DataError(
            f"the run's tokenizer {name} (data.tokenizer in its config) is not found; a relative path "
            "is read from the current folder, so run from the folder the run was trained in"
        )
    tokenizer = load_tokenizer(name)
    if tokenizer.vocab_size != vocab_size:
        raise CheckpointError(
            f"tokenizer {name!r} has {tokenizer.vocab_size} tokens but the model was trained with "
            f"{vocab_size}; the tokenizer file changed since training"
        )
    return tokenizer


def train_tokenizer(
    documents: Iterable[str], vocab_size: int, out_path: str | os.PathLike | None = None
) -> Tokenizer:
    """Train a byte-level BPE with ``<|endoftext|>`` (id 0) on ``documents``; deterministic for a given input.

    The result is saved to ``out_path`` when given. A corpus too small for ``vocab_size`` (BPE merges only
    byte pairs that occur at least twice) gives a smaller vocabulary: it is kept, since a model takes its
    vocabulary size from its tokenizer, and one warning on the "smallinit" logger gives the size reached.
    """
    if int(vocab_size) < 258:
        raise DataError(
            f"tokenizer vocab_size {vocab_size} is too small; use at least 258 (256 bytes + end-of-text + 1 merge)"
        )
    hf = HFTokenizer(models.BPE())
    _byte_level_parts(hf)
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    counted = 0

    def _docs():
        nonlocal counted
        for d in documents:
            if d:
                counted += 1
                yield d

    hf.train_from_iterator(_docs(), trainer=trainer)
    if counted == 0:
        raise DataError("cannot train a tokenizer on an empty corpus; pass a corpus with some text")
    tok = Tokenizer(hf, name=str(out_path) if out_path is not None else "trained")
    if tok.vocab_size < int(vocab_size):
        logging.getLogger("smallinit").warning(
            f"tokenizer: the corpus gave a vocabulary of {tok.vocab_size}, not the {vocab_size} asked (no byte pair "
            "left that occurs twice); it is kept at that size; train on more text for a larger one"
        )
    if out_path is not None:
        tok.save(out_path)
    return tok
