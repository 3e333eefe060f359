"""Text generation from a trained run: load model and tokenizer together, then decode with a KV cache.

Each step samples the next token from the last position's logits z:

    temperature τ = 0  →  argmax z (greedy)
    otherwise          →  p = softmax(z / τ) restricted to the k most likely tokens (top-k), then to the
                          smallest set of most likely tokens whose mass reaches p_top (top-p, nucleus),
                          renormalised, and sampled with a generator seeded from ``seed``

The prompt goes through the model once (prefill); every later step feeds only the new token, whose keys
and values join the cache, so a step costs one position rather than the whole prefix. Generation stops at
``max_new_tokens`` or after the end-of-text token, which the data pipeline puts between documents. An
empty prompt starts from that token, i.e. at the beginning of a document.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from smallinit.config import Config
from smallinit.data import Tokenizer
from smallinit.data.tokenizer import run_tokenizer
from smallinit.errors import ConfigError
from smallinit.model import Transformer
from smallinit.train.checkpoint import load_model, resolve_checkpoint


def load_pretrained(
    path: str | os.PathLike, *, device: str | torch.device = "cpu"
) -> tuple[Transformer, Tokenizer]:
    """The model (eval mode) and the tokenizer it was trained with, from a run folder or a checkpoint folder.

    The tokenizer is the one the run's config names (``data.tokenizer``); it must still have the model's
    vocabulary size.
    """
    found = resolve_checkpoint(path)
    cfg = Config.from_dict(found.state["config"])
    tokenizer = run_tokenizer(cfg.data.tokenizer, cfg.model.vocab_size)
    return load_model(found, device=device), tokenizer


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # τ; 0 = greedy
    top_k: int | None = None  # keep the k most likely tokens; None = all
    top_p: float = 1.0  # keep the smallest most-likely set with this much probability; 1 = all
    seed: int = 0

    def validate(self) -> Sampling:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be ≥ 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top-k must be ≥ 1 (or unset for all tokens), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top-p must be in (0, 1] (1 = all tokens), got {self.top_p}")
        return self


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> int:
    """One token id from the logits (V,) of the last position, by ``sampling``'s rule."""
    if sampling.temperature == 0:
        return int(logits.argmax())
    z = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < z.numel():
        kth = z.topk(sampling.top_k).values[-1]
        z = z.masked_fill(z < kth, -math.inf)
    if sampling.top_p < 1:
        p, order = z.softmax(-1).sort(descending=True)
        before = p.cumsum(-1) - p  # mass of the more likely tokens
        z[order[before >= sampling.top_p]] = -math.inf  # the most likely token always stays (before = 0)
    return int(torch.multinomial(z.softmax(-1), 1, generator=generator))


@torch.no_grad()
def generate_ids(
    model: Transformer,
    prompt: list[int],
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    eos_id: int | None = None,
) -> list[int]:
    """The new token ids after ``prompt`` (the end-of-text id included when it ends the text)."""
    sampling.validate()
    if max_new_tokens < 0:
        raise ConfigError(f"max-new-tokens must be ≥ 0, got {max_new_tokens}")
    if not prompt:
        raise ConfigError("the prompt has no tokens; pass at least one token id")
    context = model.config.max_seq_len
    if len(prompt) > context:
        raise ConfigError(
            f"the prompt has {len(prompt)} tokens, more than the model's context of {context}; shorten it"
        )
    if len(prompt) + max_new_tokens > context:
        raise ConfigError(
            f"the prompt ({len(prompt)} tokens) and {max_new_tokens} new tokens exceed the model's "
            f"context of {context} tokens; ask for at most {context - len(prompt)} new tokens or "
            "shorten the prompt"
        )
    device = model.embed.weight.device
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    cache = model.new_cache()
    x = torch.tensor([prompt], device=device)
    out: list[int] = []
    while len(out) < max_new_tokens:
        logits = model(x, cache=cache).logits[0, -1]
        out.append(next_token(logits, sampling, generator))
        if out[-1] == eos_id:
            break
        x = torch.tensor([[out[-1]]], device=device)
    return out


def generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int = 100,
    sampling: Sampling = Sampling(),
) -> str:
    """The continuation of ``prompt`` as text (without the end-of-text token that may end it)."""
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    new = generate_ids(model, ids, max_new_tokens, sampling, eos_id=tokenizer.eos_id)
    if new and new[-1] == tokenizer.eos_id:
        new = new[:-1]
    return tokenizer.decode(new)
