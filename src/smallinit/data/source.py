"""The data a run trains and evaluates on, from its data config: a tokenised corpus (``TokenData``, through the
token cache) or a task generated batch by batch (``SinkData``). Both give ``batch(batch_size, seq_len, seed,
step, rank=, world_size=)``, ``eval_batches(batch_size, seq_len, max_batches)``, ``check(seq_len)``, ``repeats(…)`` and
``describe()``, so the trainer and the measurements never ask which one they hold."""

from __future__ import annotations

from smallinit.config import DataConfig
from smallinit.data.cache import TokenData, load_token_data
from smallinit.data.sink import SinkData, SinkTask, is_sink_spec
from smallinit.data.tokenizer import Tokenizer

RunData = TokenData | SinkData


def load_data(cfg: DataConfig, tokenizer: Tokenizer) -> RunData:
    """The run's data: ``builtin:sink?…`` is generated, anything else is read through the token cache."""
    if is_sink_spec(cfg.corpus):
        return SinkData(SinkTask.from_params(cfg.corpus), tokenizer, bos=cfg.bos)
    data = load_token_data(cfg.corpus, tokenizer, val_fraction=cfg.val_fraction, text_field=cfg.text_field)
    data.bos = cfg.bos
    return data
