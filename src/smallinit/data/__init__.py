"""Data: corpora (builtin and user files), tokenizers, the token cache and stateless batching."""

from smallinit.data.batching import (
    batch_starts,
    epochs,
    get_batch,
    iter_eval_batches,
    n_eval_windows,
    repeat_message,
)
from smallinit.data.cache import TokenData, default_cache_dir, load_token_data
from smallinit.data.corpus import BUILTIN_CORPORA, corpus_fingerprint, iter_documents
from smallinit.data.source import RunData, load_data
from smallinit.data.tokenizer import EOS_TOKEN, Tokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "BUILTIN_CORPORA",
    "EOS_TOKEN",
    "TokenData",
    "RunData",
    "Tokenizer",
    "batch_starts",
    "corpus_fingerprint",
    "default_cache_dir",
    "epochs",
    "get_batch",
    "iter_documents",
    "iter_eval_batches",
    "load_data",
    "load_token_data",
    "load_tokenizer",
    "n_eval_windows",
    "repeat_message",
    "train_tokenizer",
]
