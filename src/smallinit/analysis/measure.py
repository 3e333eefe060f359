"""All single-model measurements from one forward pass, and ``smallinit analyze`` / ``compare`` on a model.

:func:`measure_activations` observes the residual stream, norm inputs and attention inputs of any model
through its adapter (smallinit.adapters) in a single forward and derives sink scores, residual flow and
measured norm factors from them; the matrix statistics come from the weights. :func:`analyze_checkpoint`
runs it on held-out batches of a trained smallinit run or of a Hugging Face model folder.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from smallinit.adapters import HFModel, HFTokenizer, as_adapter, hf_folder_problem, load_hf_folder
from smallinit.adapters.hf_folder import WHAT_IT_HOLDS as HF_FOLDER
from smallinit.adapters.hf_folder import encoding_fingerprint, how_to_give, trainer_output_choice
from smallinit.analysis.result import AnalysisResult
from smallinit.analysis.tokens import TokenGapResult, text_batches, token_gap, with_progress
from smallinit.config import Config, DataConfig, flatten
from smallinit.data import Tokenizer, load_data, load_tokenizer
from smallinit.data.tokenizer import BUILTIN_TOKENIZERS
from smallinit.errors import CheckpointError, ConfigError, DataError
from smallinit.export.hf import hf_tokenizer
from smallinit.io import read_json
from smallinit.measures.activations import Activations, measure_activations
from smallinit.measures.condensation import matrix_stats, unoriented_matrices
from smallinit.measures.norm_factor import relative_factor
from smallinit.train.checkpoint import load_model as _load_model
from smallinit.train.checkpoint import resolve_checkpoint


@dataclass
class LoadedRun:
    model: nn.Module
    config: Config
    step: int
    path: Path  # the checkpoint folder


def load_run(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> LoadedRun:
    """A trained model with its resolved config, from a run folder or a checkpoint folder."""
    found = resolve_checkpoint(path)
    return LoadedRun(
        model=_load_model(found, device=device),
        config=Config.from_dict(found.state["config"]),
        step=found.step,
        path=found.path,
    )


NEITHER = (
    "a smallinit run folder (checkpoints/step_N/ inside), a smallinit checkpoint folder (state.json and "
    "model.safetensors) or a Hugging Face model folder (" + HF_FOLDER + ")"
)


def load_measured(
    path: str | os.PathLike,
    *,
    hf: bool = False,
    device: str = "cpu",
    tokenizer: str | os.PathLike | None = None,
) -> LoadedRun | HFModel:
    """What ``analyze`` and ``compare`` measure: a smallinit run or checkpoint, or (detected from its
    config.json, or with ``hf``) a Hugging Face model folder or Trainer output_dir with its tokenizer, or with
    ``tokenizer`` (a folder, a tokenizer.json, or a builtin name: 'default', 'bytes') in its place."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder; pass {NEITHER}")
    if hf or hf_folder_problem(path) is None or trainer_output_choice(path)[1] is not None:
        return load_hf_folder(path, device=device, tokenizer=_given_tokenizer(tokenizer))
    config = read_json(path / "config.json") if (path / "config.json").is_file() else None
    if isinstance(config, dict) and "model_type" in config:  # a Hugging Face config without its weights
        load_hf_folder(path)  # says what is missing
    ours = (path / "state.json").is_file() or (path / "checkpoints").is_dir() or isinstance(config, dict)
    if not ours:
        raise CheckpointError(f"{path} holds no model; pass {NEITHER}")
    return load_run(path, device=device)


def _given_tokenizer(spec: str | os.PathLike | None) -> Any:
    """A --tokenizer for a Hugging Face folder: smallinit's builtin ones as transformers tokenizers, else the
    path as it is (read by the adapter)."""
    if isinstance(spec, str) and spec in BUILTIN_TOKENIZERS and not Path(spec).exists():
        tok = hf_tokenizer(load_tokenizer(spec), 1 << 30)
        tok.name_or_path = f"smallinit's builtin {spec!r}"  # what messages call it
        return tok
    return spec


def held_out_batches(
    cfg: Config,
    tokenizer: Tokenizer,
    *,
    data: str | os.PathLike | None = None,
    batches: int = 4,
    batch_size: int = 8,
    seq_len: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(x, y) batches: the run's validation split, or the first windows of ``data`` (streamed)."""
    seq_len = _check_seq_len(seq_len or cfg.data.seq_len, cfg.model.max_seq_len)
    if data is None:
        yield from load_data(cfg.data, tokenizer).eval_batches(batch_size, seq_len, batches)
        return
    stream = text_batches(
        data, tokenizer, seq_len=seq_len, batch_size=batch_size, text_field=cfg.data.text_field
    )
    for i, xy in enumerate(stream):
        if i == batches:
            return
        yield xy


def _check_seq_len(seq_len: int, max_seq_len: int) -> int:
    if not 1 <= seq_len <= max_seq_len:
        raise ConfigError(
            f"sequence length {seq_len} is outside 1..{max_seq_len} (the model's max_seq_len); "
            "pass a smaller data.seq_len (--set data.seq_len=N)"
        )
    return seq_len


@torch.no_grad()
def analyze_model(
    model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, cosine_rows: int = 1024
) -> AnalysisResult:
    """Every single-model measurement, averaged over ``batches`` (equal-sized batches weigh equally), for any
    model an adapter reads: what does not apply to the model is named in ``not_measured`` (measure_activations),
    the rest measured."""
    adapter = as_adapter(model)
    module = adapter.module
    device = next(module.parameters()).device
    per_batch, n_tokens = [], 0
    for x, y in batches:
        per_batch.append(measure_activations(adapter, x.to(device), y.to(device)))
        n_tokens += y.numel()
    if not per_batch:
        raise DataError(
            "no complete sequence to analyse; pass more text with --data or a smaller data.seq_len "
            "(--set data.seq_len=N)"
        )
    return AnalysisResult(
        **vars(Activations.mean(per_batch)),
        tokens=n_tokens,
        seq_len=int(x.shape[1]),  # the sink's reference (uniform attention) depends on it
        matrices=tuple(matrix_stats(module, max_rows=cosine_rows)),
        matrices_left_out=unoriented_matrices(module),
    )


HF_SEQ_LEN = 256  # the default sequence length for a Hugging Face model (smallinit runs use their own)
# compare's default budget: two tiny models (d = 64, 2 layers, vocabulary 8,192) compare 32,768 tokens in
# 49 s on this project's 2-core CPU machine under load, 1 min 15 s with loading (docs/analysis.md)
COMPARE_TOKENS = 32_768


def hf_batches(
    tokenizer: HFTokenizer | Tokenizer,
    max_seq_len: int | None,
    *,
    data: str | os.PathLike | None,
    batch_size: int,
    seq_len: int | None,
    max_tokens: int | None = None,
    batches: int | None = None,
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], int, str]:
    """(batches, sequence length, what the text is) where a Hugging Face model takes part: the first windows
    of ``data``, else of the builtin corpus, through the model's own tokenizer, refused (DataError) when that
    tokenizer turns the first batch into unknown or end-of-text tokens or a handful of ids."""
    seq_len = _check_seq_len(seq_len or min(HF_SEQ_LEN, max_seq_len or HF_SEQ_LEN), max_seq_len or 1 << 30)
    corpus = data if data is not None else DataConfig().corpus
    stream = text_batches(corpus, tokenizer, seq_len=seq_len, batch_size=batch_size, max_tokens=max_tokens)
    text = (
        f"{data} (--data; whether the model was trained on it, smallinit cannot tell)"
        if data is not None
        else f"the start of smallinit's builtin corpus {corpus!r}: if the model was trained on it, this is training "
        "text, not held out"
    )
    stream = itertools.islice(stream, batches)
    first = next(stream, None)  # judged before anything is measured on it
    # (a smallinit run's tokenizer, which a compared folder shares, is its training's: nothing to judge)
    problem = (
        tokenizer.encoding_problem(first[0])
        if first is not None and isinstance(tokenizer, HFTokenizer)
        else None
    )
    if problem is not None:
        raise DataError(
            f"the tokenizer {tokenizer.name} {problem}, so nothing measured on it would mean anything; "
            + how_to_give(given=tokenizer.name)
        )
    return itertools.chain([first] if first is not None else [], stream), seq_len, text


def analyze_checkpoint(
    path: str | os.PathLike,
    *,
    data: str | os.PathLike | None = None,
    batches: int = 4,
    batch_size: int = 8,
    seq_len: int | None = None,
    device: str = "cpu",
    hf: bool = False,
    tokenizer: str | os.PathLike | None = None,
    progress: TextIO | None = None,
) -> AnalysisResult:
    """``smallinit analyze``: load a run, checkpoint or Hugging Face folder and measure it on held-out text (a
    Hugging Face model's result has its ``hf_config`` where a run's has ``config`` and ``step``; ``data`` says
    which text it is, ``note`` which folder of a Trainer output_dir). Progress lines go to ``progress``;
    ``tokenizer`` replaces a Hugging Face folder's own."""
    run = load_measured(path, hf=hf, device=device, tokenizer=tokenizer)
    if isinstance(run, HFModel):
        stream, seq_len, text = hf_batches(
            run.tokenizer, run.max_seq_len, data=data, batch_size=batch_size, seq_len=seq_len, batches=batches
        )
        stream = with_progress(
            stream, label="analyze", total_tokens=batches * batch_size * seq_len, echo=progress
        )
        return replace(
            analyze_model(run.model, stream),
            checkpoint=str(run.path),
            hf_config=run.model.config.to_dict(),
            data=text,
            note=run.note or None,
        )
    if tokenizer is not None:
        raise ConfigError(
            "--tokenizer is for a Hugging Face folder; a smallinit run is measured with its own "
            f"(data.tokenizer = {run.config.data.tokenizer})"
        )
    tok = load_tokenizer(run.config.data.tokenizer)
    total = batches * batch_size * (seq_len or run.config.data.seq_len)
    result = analyze_model(
        run.model,
        with_progress(
            held_out_batches(
                run.config, tok, data=data, batches=batches, batch_size=batch_size, seq_len=seq_len
            ),
            label="analyze",
            total_tokens=total,
            echo=progress,
        ),
    )
    m = run.config.model
    text = (
        f"{data} (--data)"
        if data is not None
        else f"the validation split of {run.config.data.corpus}, held out from the run's training text"
    )
    return replace(
        result,
        checkpoint=str(run.path),
        step=run.step,
        config=run.config.to_dict(),
        data=text,
        norm_factor_analytic=relative_factor(m.gamma, m.norm_eps, m.d_model),
    )


def compare_checkpoints(
    path_a: str | os.PathLike,
    path_b: str | os.PathLike,
    *,
    data: str | os.PathLike | None = None,
    batch_size: int = 8,
    seq_len: int | None = None,
    max_tokens: int | None = COMPARE_TOKENS,
    bins: int = 10,
    top_k: int = 20,
    labels: tuple[str, str] | None = None,
    device: str = "cpu",
    hf: bool = False,
    tokenizer: str | os.PathLike | None = None,
    progress: TextIO | None = None,
) -> TokenGapResult:
    """``smallinit compare``: token-level gap of two trained models on held-out text (default: A's
    validation split, or the builtin corpus for Hugging Face models; or ``data``, streamed), at most about
    ``max_tokens`` of it (None: all). Either may be a Hugging Face folder (``tokenizer`` replaces its own); both
    must use the same tokenizer. Progress lines go to ``progress``."""
    a = load_measured(path_a, hf=hf, device=device, tokenizer=tokenizer)
    b = load_measured(path_b, hf=hf, device=device, tokenizer=tokenizer)
    if tokenizer is not None and not (isinstance(a, HFModel) or isinstance(b, HFModel)):
        raise ConfigError(
            "--tokenizer is for Hugging Face folders; smallinit runs are compared with their own "
            "(data.tokenizer)"
        )
    tok = _tokenizer(a)
    if _encoding(_tokenizer(b)) != _encoding(tok):
        raise DataError(
            f"{path_a} and {path_b} use different tokenizers; token-level comparison needs the same one"
        )
    if isinstance(a, HFModel) or isinstance(b, HFModel):
        max_len = min(
            (m.max_seq_len if isinstance(m, HFModel) else m.config.model.max_seq_len) or 1 << 30
            for m in (a, b)
        )
        batches, seq_len, text = hf_batches(
            tok, max_len, data=data, batch_size=batch_size, seq_len=seq_len, max_tokens=max_tokens
        )
    else:
        seq_len = _check_seq_len(
            seq_len or min(a.config.data.seq_len, b.config.data.seq_len),
            min(a.config.model.max_seq_len, b.config.model.max_seq_len),
        )
        text = (
            str(data)
            if data is not None
            else f"the validation split of {a.config.data.corpus}, held out from A's training text"
        )
        if data is None:
            limit = None if max_tokens is None else -(-max_tokens // (batch_size * seq_len))
            batches = load_data(a.config.data, tok).eval_batches(batch_size, seq_len, limit)
        else:
            batches = text_batches(
                data,
                tok,
                seq_len=seq_len,
                batch_size=batch_size,
                text_field=a.config.data.text_field,
                max_tokens=max_tokens,
            )
    window = batch_size * seq_len  # both streams stop at the first whole batch past max_tokens
    total = None if max_tokens is None else -(-max_tokens // window) * window
    result = token_gap(
        a.model,
        b.model,
        with_progress(batches, label="compare", total_tokens=total, echo=progress),
        tokenizer=tok,
        bins=bins,
        top_k=top_k,
    )
    la, lb = labels or (_run_name(a.path), _run_name(b.path))
    notes = [m.note for m in (a, b) if isinstance(m, HFModel) and m.note]
    result.meta = {
        **result.meta,
        "label_a": la,
        "label_b": lb,
        "checkpoint_a": str(a.path),
        "checkpoint_b": str(b.path),
        "step_a": getattr(a, "step", None),
        "step_b": getattr(b, "step", None),
        "seq_len": seq_len,
        "settings_a": _settings(a),
        "settings_b": _settings(b),
        "data": text,
        "max_tokens": max_tokens,
        **({"notes": notes} if notes else {}),
    }
    return result


def _tokenizer(m: LoadedRun | HFModel) -> Tokenizer | HFTokenizer:
    return m.tokenizer if isinstance(m, HFModel) else load_tokenizer(m.config.data.tokenizer)


def _encoding(tok: Tokenizer | HFTokenizer) -> str:
    """What must match for two models to be compared token by token: how text becomes tokens."""
    return tok.fingerprint if isinstance(tok, HFTokenizer) else encoding_fingerprint(tok.hf)


ANALYSIS_FILE = "analysis.json"  # what `smallinit analyze` writes, and the HTML report reads back
# what a comparison's claim depends on, and what must match for comparisons to be pooled over seeds
SETTINGS = (
    "model.gamma",
    "model.norm_eps",
    "model.norm_eps_width",
    "model.gate",
    "model.d_model",
    "model.n_layers",
    "train.lr",
    "train.seed",
)


def run_settings(flat_config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a compared run that say which claim the comparison can test (kept in compare.json)."""
    return {k: flat_config.get(k) for k in SETTINGS}


def _settings(m: LoadedRun | HFModel) -> dict[str, Any]:
    return {} if isinstance(m, HFModel) else run_settings(flatten(m.config.to_dict()))


def _run_name(checkpoint: Path) -> str:
    """The run folder's name for RUN/checkpoints/step_N, else the folder's own name."""
    return checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else checkpoint.name


def default_output_dir(checkpoint: str | os.PathLike) -> Path:
    """Where ``smallinit analyze`` writes by default: RUN/analysis for a checkpoint RUN/checkpoints/step_N,
    else CHECKPOINT/analysis (``checkpoint`` is the resolved folder, e.g. ``analyze_checkpoint().checkpoint``)."""
    p = Path(checkpoint)
    return (p.parent.parent if p.parent.name == "checkpoints" else p) / "analysis"


def loss_note(cfg: Config, data: str | None, here: tuple[int, int, int]) -> str:
    """Which text ``smallinit analyze`` measured its loss on (``data``: --data; ``here``: batches, batch size and
    sequence length of its windows), beside the windows of the run's validation loss, and whether the two compare."""
    if data:
        return "this loss is on the --data text; training's val loss is on its validation split, so they do not compare"
    train = (cfg.train.eval_batches, cfg.train.batch_size, cfg.data.seq_len)
    if here == train:
        return "this loss is on the validation windows training's val loss is measured on, so the two compare directly"
    return (
        f"this loss is on {here[0] * here[1]} windows of {here[2]} tokens from the start of the validation split, "
        f"training's val loss on {train[0] * train[1]} windows of {train[2]} tokens, so the two differ a little; "
        f"to measure on training's windows add --set train.eval_batches={train[0]} --set "
        f"train.batch_size={train[1]} --set data.seq_len={train[2]}"
    )
