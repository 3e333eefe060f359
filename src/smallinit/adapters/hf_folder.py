"""A Hugging Face model folder (``save_pretrained``): recognised, loaded offline, its tokenizer wrapped.

A folder counts as one when it holds a config.json with a ``model_type`` and safetensors weights
(``model.safetensors`` or its index); the model is loaded with ``AutoModelForCausalLM`` from local files
only, never running code shipped in the folder, and the tokenizer with ``AutoTokenizer``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ModelError
from ..io import read_json

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


# The parts of a tokenizers JSON that decide how text is encoded without special tokens and decoded (the
# post-processor only adds special tokens; padding and truncation are per-call settings).
ENCODING_PARTS = ("added_tokens", "normalizer", "pre_tokenizer", "model", "decoder")


def encoding_fingerprint(backend: Any) -> str:
    """A hash of how a ``tokenizers.Tokenizer`` encodes and decodes text: equal for the same tokenizer saved by
    smallinit and by transformers."""
    spec = json.loads(backend.to_str())
    return hashlib.sha256(json.dumps({k: spec.get(k) for k in ENCODING_PARTS}, sort_keys=True).encode()).hexdigest()


class HFTokenizer:
    """A transformers tokenizer with the members smallinit's text streaming and comparison use: ``encode``
    (no special tokens added), ``decode``, ``eos_id`` (between documents), ``fingerprint`` (same tokenizer?)."""

    def __init__(self, tokenizer: Any, name: str):
        if tokenizer.eos_token_id is None:
            raise ModelError(f"the tokenizer of {name} has no end-of-text token, which separates documents; "
                             "give it one (tokenizer.eos_token) and save it again")
        self.tokenizer, self.name = tokenizer, name
        self.eos_id = int(tokenizer.eos_token_id)
        self.vocab_size = len(tokenizer)
        self.backend = getattr(tokenizer, "backend_tokenizer", None)  # fast tokenizers: encode without length checks
        self.fingerprint = (encoding_fingerprint(self.backend) if self.backend is not None else
                            hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest())

    def encode(self, text: str) -> list[int]:
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


@dataclass
class HFModel:
    model: nn.Module
    tokenizer: HFTokenizer
    path: Path
    max_seq_len: int | None  # the config's max_position_embeddings, when it has one


def load_hf_folder(path: str | os.PathLike, *, device: str = "cpu") -> HFModel:
    """The causal LM (eval mode) and tokenizer of a Hugging Face folder."""
    path = Path(path)
    problem = hf_folder_problem(path)
    if problem is not None:
        raise ModelError(f"{path} is not a Hugging Face model folder: {problem}; it must hold {WHAT_IT_HOLDS}")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ModelError("reading a Hugging Face folder needs transformers: pip install 'smallinit[hf]'") from None
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one line per command, not a weight-loading bar
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"transformers cannot load {path} as a causal LM with its tokenizer: {first}") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tok = HFTokenizer(tokenizer, str(path))
    config = model.config.get_text_config()
    if tok.vocab_size > config.vocab_size:
        raise ModelError(f"the tokenizer of {path} has {tok.vocab_size} tokens but the model only "
                         f"{config.vocab_size} embeddings; save the model with its own tokenizer")
    return HFModel(model=model.to(device).eval(), tokenizer=tok, path=path,
                   max_seq_len=getattr(config, "max_position_embeddings", None))
