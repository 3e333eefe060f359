"""A Hugging Face model folder (``save_pretrained``): recognised, loaded offline, its tokenizer wrapped.

A folder counts as one when it holds a config.json with a ``model_type`` and safetensors weights
(``model.safetensors`` or its index); the model is loaded with ``AutoModelForCausalLM`` from local files
only, never running code shipped in the folder, and the tokenizer with ``AutoTokenizer`` (or the one given).
A folder saved without a tokenizer is refused rather than measured with the empty default transformers would
build for it, and so is a tokenizer that cannot be the model's (far fewer tokens than it has embeddings). A
transformers Trainer ``output_dir`` is read as the model saved at its top, else its latest ``checkpoint-N``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from torch import nn

from smallinit.errors import ModelError
from smallinit.io import read_json

WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
WHAT_IT_HOLDS = "config.json with a model_type, and model.safetensors, as save_pretrained writes them"


def hf_folder_problem(path: str | os.PathLike) -> str | None:
    """None when ``path`` looks like a Hugging Face model folder, else what it lacks."""
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        return "it has no config.json"
    raw = read_json(config)
    if not isinstance(raw, dict) or "model_type" not in raw:
        return "its config.json has no model_type"
    if not any((path / w).is_file() for w in WEIGHTS):
        return "it has no model.safetensors"
    return None


# Files one of which a folder saved with a tokenizer holds (save_pretrained writes tokenizer_config.json with any).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "tekken.json",
)
# smallinit's builtin tokenizers a Hugging Face folder may be measured with: name → (tokens, kind); the sizes are
# data.tokenizer's (a layer above this one; tests/cli/test_newcomer_trips.py holds them equal)
SUGGESTED_BUILTINS = {"default": (8192, "BPE"), "bytes": (257, "byte-level")}


def how_to_give(vocab_size: int | None = None, given: str = "") -> str:
    """How to pass a tokenizer: a builtin one suggested only where it covers the model's ``vocab_size`` and is
    not the one ``given`` already."""
    builtins = []
    for name, (size, kind) in SUGGESTED_BUILTINS.items():
        covers = vocab_size is None or coverage_problem(size, vocab_size) is None
        if covers and f"'{name}'" not in given and name != given:
            builtins.append(f"'{name}' for smallinit's builtin {size:,}-token {kind} one")
    return (
        "pass the model's tokenizer with --tokenizer PATH_OR_FOLDER (a folder saved by save_pretrained, "
        + ("a tokenizer.json, or " + " or ".join(builtins) if builtins else "or a tokenizer.json")
        + ")"
    )


# A model's vocabulary is its tokenizer's, padded at most a little (Pythia 50,304 embeddings for 50,277 tokens);
# a tokenizer under half the embeddings is not the model's and leaves most of them unread.
COVER_SHARE = 0.5
# The measured text must encode to real tokens: at most half unknown or end-of-text, and at least this many
# distinct ids in the first batch (an empty tokenizer gives one or two).
MIN_DISTINCT = 8


def coverage_problem(n_tokens: int, vocab_size: int) -> str | None:
    """None when a tokenizer of ``n_tokens`` can be that of a model with ``vocab_size`` embeddings, else why not."""
    if n_tokens > vocab_size:
        return f"has {n_tokens:,} tokens but the model only {vocab_size:,} embeddings"
    if n_tokens < COVER_SHARE * vocab_size:
        return (
            f"has {n_tokens:,} tokens for the model's {vocab_size:,} embeddings, so it is not the model's "
            f"tokenizer (under {COVER_SHARE:.0%} of the vocabulary)"
        )
    return None


def _checkpoints(path: Path) -> list[Path]:
    """The ``checkpoint-N`` model folders a transformers Trainer wrote into ``path``, latest first."""
    steps = sorted(
        (
            (int(m.group(1)), c)
            for c in path.glob("checkpoint-*")
            if (m := re.fullmatch(r"checkpoint-(\d+)", c.name)) and hf_folder_problem(c) is None
        ),
        reverse=True,
    )
    return [c for _, c in steps]


def trainer_output_choice(path: Path) -> tuple[Path, str | None]:
    """(the folder to load, a note saying which) for a transformers Trainer ``output_dir``: the model saved at
    its top when there is one, else its latest ``checkpoint-N``; any other folder is itself, without a note."""
    steps = _checkpoints(path)
    if not steps:
        return path, None
    last = steps[0]
    if hf_folder_problem(path) is None:
        return path, (
            f"{path} is a Trainer output folder: measured the model saved at its top, not its "
            f"{len(steps)} checkpoint-N folders (the latest {last.name})"
        )
    return last, (
        f"{path} is a Trainer output folder with no model saved at its top: measured its latest "
        f"checkpoint, {last.name}"
    )


# The parts of a tokenizers JSON that decide how text is encoded without special tokens and decoded (the
# post-processor only adds special tokens; padding and truncation are per-call settings).
ENCODING_PARTS = ("added_tokens", "normalizer", "pre_tokenizer", "model", "decoder")


def encoding_fingerprint(backend: Any) -> str:
    """A hash of how a ``tokenizers.Tokenizer`` encodes and decodes text: equal for the same tokenizer saved by
    smallinit and by transformers."""
    spec = json.loads(backend.to_str())
    return hashlib.sha256(
        json.dumps({k: spec.get(k) for k in ENCODING_PARTS}, sort_keys=True).encode()
    ).hexdigest()


class HFTokenizer:
    """A transformers tokenizer with the members smallinit's text streaming and comparison use: ``encode``
    (no special tokens added), ``decode``, ``eos_id`` (between documents), ``fingerprint`` (same tokenizer?)."""

    def __init__(self, tokenizer: Any, name: str):
        if tokenizer.eos_token_id is None:
            raise ModelError(
                f"the tokenizer of {name} has no end-of-text token, which separates documents; "
                "give it one (tokenizer.eos_token) and save it again"
            )
        self.tokenizer, self.name = tokenizer, name
        self.eos_id = int(tokenizer.eos_token_id)
        self.unk_id = tokenizer.unk_token_id
        self.vocab_size = len(tokenizer)
        # fast tokenizers: encode without length checks
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.fingerprint = (
            encoding_fingerprint(self.backend)
            if self.backend is not None
            else hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()
        )

    def encode(self, text: str) -> list[int]:
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def encoding_problem(self, ids: Any) -> str | None:
        """None when ``ids`` (the first batch of the measured text, a tensor) are real tokens, else what they are."""
        special = (
            (ids == self.eos_id) | (ids == self.unk_id) if self.unk_id is not None else ids == self.eos_id
        )
        share, distinct = float(special.float().mean()), int(ids.unique().numel())
        if share > 0.5:
            return f"encodes the text to {share:.0%} unknown or end-of-text tokens"
        if distinct < MIN_DISTINCT:
            return f"encodes the first {ids.numel():,} tokens of the text to only {distinct} distinct ids"
        return None


@dataclass
class HFModel:
    model: nn.Module
    tokenizer: HFTokenizer
    path: Path
    max_seq_len: int | None  # the config's max_position_embeddings, when it has one
    note: str | None = None  # which folder of a Trainer output_dir was loaded


def read_tokenizer(source: str | os.PathLike) -> Any:
    """A transformers tokenizer from a folder saved by save_pretrained or a tokenizers JSON file."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(source).expanduser()
    try:
        if path.is_dir():
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
        if path.is_file():
            tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
            vocab = tok.get_vocab()  # a bare tokenizer.json names no end-of-text token: take the usual ones
            eos = next((t for t in ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>") if t in vocab), None)
            if eos is not None:
                tok.eos_token = eos
            return tok
    except Exception as exc:  # tokenizers and transformers raise plain Exceptions on a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot read a tokenizer from {path}: {first}") from None
    raise ModelError(
        f"tokenizer {source} not found: pass a folder saved by save_pretrained, a tokenizer.json, or "
        "'default'"
    )


def load_hf_folder(path: str | os.PathLike, *, device: str = "cpu", tokenizer: Any = None) -> HFModel:
    """The causal LM (eval mode) and tokenizer of a Hugging Face folder (or a Trainer output_dir, see
    :func:`trainer_output_choice`); ``tokenizer`` (a transformers tokenizer, or a path for :func:`read_tokenizer`)
    replaces the folder's own."""
    top = Path(path)
    path, note = trainer_output_choice(top) if top.is_dir() else (top, None)
    problem = hf_folder_problem(path)
    if problem is not None:
        raise ModelError(
            f"{path} is not a Hugging Face model folder: {problem}; it must hold {WHAT_IT_HOLDS}"
        )
    if "smallinit_gate" in (read_json(path / "config.json") or {}):
        raise ModelError(
            f"{path} holds a model with smallinit's attention gate, which this command does not load; load it "
            "with smallinit.load_gated and measure it with smallinit.analysis (sink_scores, ...)"
        )
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ModelError(
            "reading a Hugging Face folder needs transformers: pip install 'smallinit[hf]'"
        ) from None
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one line per command, not a weight-loading bar
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True)
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer, source = read_tokenizer(tokenizer), str(tokenizer)
        elif tokenizer is None:
            # in a Trainer output_dir, a model saved without one takes the other folder's (top or latest
            # checkpoint); a folder without any is refused, since transformers would build an empty default
            # that encodes all text to nothing or to <unk>
            folders = (path, top, *(_checkpoints(top) if note else ()))
            folder = next((f for f in folders if any((f / t).is_file() for t in TOKENIZER_FILES)), None)
            if folder is None:
                raise ModelError(
                    f"{path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}, ...); "
                    + how_to_give(model.config.get_text_config().vocab_size)
                )
            tokenizer, source = AutoTokenizer.from_pretrained(folder, local_files_only=True), str(folder)
        else:
            source = getattr(tokenizer, "name_or_path", "") or "the tokenizer given"
    # SafetensorError: a weights file cut short or garbled
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"transformers cannot load {path} as a causal LM with its tokenizer: {first}"
        ) from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tok = HFTokenizer(tokenizer, source)
    config = model.config.get_text_config()
    problem = coverage_problem(tok.vocab_size, config.vocab_size)
    if problem is not None:
        given = f" ({source})" if source != str(path) else ""
        raise ModelError(
            f"the tokenizer of {path}{given} {problem}; {how_to_give(config.vocab_size, source)}"
        )
    return HFModel(
        model=model.to(device).eval(),
        tokenizer=tok,
        path=path,
        max_seq_len=getattr(config, "max_position_embeddings", None),
        note=note,
    )
