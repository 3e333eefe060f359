"""``smallinit.audit(model)`` and ``smallinit audit TARGET``: one model's init and norms, read off its weights
and one forward. Per matrix σ, d_in, implied γ, truncation, ties and whether it is still fresh-random
(smallinit.auditing.matrices); the recipe the weights look like (smallinit.auditing.recipe); per norm (layer, call
or written out) its ε and its factor σ/√(σ² + ε) on a batch, with the saturation warning. A model on meta is
audited from its shapes and, for a smallinit preset, its config."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smallinit.adapters import as_adapter
from smallinit.adapters.protocol import readable_norm_forms
from smallinit.analysis.measure import held_out_batches, hf_batches, load_measured
from smallinit.analysis.tokens import text_batches
from smallinit.auditing.matrices import MatrixRow, matrix_rows
from smallinit.auditing.recipe import Recipe, fit_recipe
from smallinit.config import Config, DataConfig, ModelConfig
from smallinit.data import load_tokenizer
from smallinit.errors import CheckpointError, ConfigError, ModelError
from smallinit.fields import to_json
from smallinit.init import param_roles
from smallinit.init.branches import residual_writers
from smallinit.init.norm_calls import NormCalls, norm_call_sites
from smallinit.io import make_folder, write_json_atomic
from smallinit.measures.activations import evaluating
from smallinit.measures.norm_factor import SATURATED, norm_factors_from_observed, relative_factor
from smallinit.model import Transformer
from smallinit.train.checkpoint import latest_checkpoint, load_weights, resolve_checkpoint

FAIL_ON = ("saturated", "fresh-random")


@dataclass(frozen=True)
class NormRow:
    """One norm: a layer (by module name) or a call site (smallinit.init.norm_calls); its ε, its measured
    factor on the batch (None: not measured, ``note`` says why), and whether that factor is saturated."""

    name: str
    kind: str  # "layer", "rms_norm", "layer_norm", "hand-written"
    eps: float | None
    factor: float | None = None
    saturated: bool | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return to_json(self)


@dataclass(frozen=True)
class AuditResult:
    model: str
    source: str
    matrices: tuple[MatrixRow, ...]
    recipe: Recipe
    norms: tuple[NormRow, ...]
    claims_trained: bool | None  # a checkpoint past step 0 (or --trained); None: not known
    data: str  # the text the norm factors were measured on, or why none
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    step: int | None = None  # the training step the weights are of, where known

    @property
    def fresh_random(self) -> list[str]:
        return [r.name for r in self.matrices if r.fresh_random]

    @property
    def saturated(self) -> list[str]:
        return [n.name for n in self.norms if n.saturated]

    def failures(self, fail_on: tuple[str, ...]) -> list[str]:
        """One line per condition of ``fail_on`` the model meets."""
        out = []
        if "saturated" in fail_on and self.saturated:
            out.append(
                f"saturated: {len(self.saturated)} norms below factor {SATURATED} ({self.saturated[0]} …)"
            )
        if "fresh-random" in fail_on and self.fresh_random:
            out.append(
                f"fresh-random: {len(self.fresh_random)} of {len(self.matrices)} matrices look freshly drawn "
                f"({self.fresh_random[0]} …)"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**to_json(self), "fresh_random": self.fresh_random, "saturated": self.saturated}

    def save(self, path: str | os.PathLike) -> Path:
        make_folder(Path(path).parent)
        write_json_atomic(path, self.to_dict(), indent=1)
        return Path(path)

    def table(self) -> str:
        """The audit as a plain-text table."""

        def num(v, fmt=".3g") -> str:
            return "–" if v is None else format(v, fmt)

        lines = [f"audit of {self.model} ({self.source})", ""]
        head = f"{'matrix':<44} {'shape':>14} {'d_in':>6} {'σ':>9} {'γ':>6} {'trunc':>6} {'edge':>6}  flags"
        lines += [head, "-" * len(head)]
        for r in self.matrices:
            flags = [
                f
                for f, on in (
                    ("fresh-random", r.fresh_random),
                    (_fresh_parts(r), bool(r.fresh_parts)),
                    ("zero", r.zero),
                    ("writes residual", r.writes_residual),
                    (f"tied: {', '.join(r.tied)}", bool(r.tied)),
                    (r.not_read, bool(r.not_read)),
                )
                if on
            ]
            lines.append(
                f"{r.name[-44:]:<44} {'×'.join(map(str, r.shape)):>14} {num(r.d_in, 'd'):>6} "
                f"{num(r.sigma, '.3g'):>9} {num(r.gamma, '.3f'):>6} {num(r.truncation, '.2f'):>6} "
                f"{num(r.edge, '.2f'):>6}  {'; '.join(flags)}"
            )
        lines += ["", f"recipe: {self.recipe.summary}"]
        for fit in self.recipe.roles.values():
            spreads = f"spread ln σ {num(fit.sigma_spread, '.3f')}, γ {num(fit.gamma_spread, '.3f')}"
            lines.append(f"  {fit.role} ({fit.matrices}): {fit.describe}  [{spreads}]")
        lines += ["", f"norms (factor = σ/√(σ² + ε) on {self.data}):"]
        for n in self.norms:
            sat = "  SATURATED" if n.saturated else ""
            extra = f"  ({n.note})" if n.note else ""
            lines.append(
                f"  {n.name:<40} {n.kind:<12} ε {num(n.eps, '.3g'):>9}  factor {num(n.factor, '.4f')}{sat}{extra}"
            )
        if not self.norms:
            lines.append("  none: no norm layer, and the forward calls no norm")
        lines.append("")
        if self.saturated:
            lines.append(
                f"warning: {len(self.saturated)} norms are saturated (factor < {SATURATED}): ε, not the input, "
                "sets their scale; lower ε (smallinit.set_norm_eps_(model, 1e-12))"
            )
        if self.fresh_random:
            claim = {True: "this checkpoint claims to be trained, yet ", None: "", False: ""}[
                self.claims_trained
            ]
            lines.append(
                f"warning: {claim}{len(self.fresh_random)} of {len(self.matrices)} matrices look freshly drawn "
                "(i.i.d. entries, spectrum inside the random-matrix bulk)"
                + (": weights re-initialised on load?" if self.claims_trained else "")
            )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines).rstrip() + "\n"


def _fresh_parts(row: MatrixRow) -> str:
    shown = ", ".join(map(str, row.fresh_parts[:6])) + (", …" if len(row.fresh_parts) > 6 else "")
    return f"fresh-random experts: {len(row.fresh_parts)} of {row.shape[0]} ({shown})"


def _default_tokens(vocab: int) -> tuple[torch.Tensor | None, str]:
    """A batch of the builtin corpus through smallinit's default tokenizer (or bytes) where the model's
    vocabulary holds its ids."""
    for name in ("default", "bytes"):
        tok = load_tokenizer(name)
        if tok.vocab_size <= vocab:
            x, _ = next(text_batches(DataConfig().corpus, tok, seq_len=64, batch_size=4))
            return x, f"the builtin corpus through smallinit's {name!r} tokenizer"
    return None, f"no batch: the vocabulary ({vocab}) holds no builtin tokenizer's ids; pass tokens="


@torch.no_grad()
def audit(
    model: Any,
    tokens: torch.Tensor | None = None,
    *,
    trained: bool | None = None,
    config: ModelConfig | None = None,
    source: str = "in memory",
    data: str | None = None,
    step: int | None = None,
) -> AuditResult:
    """The audit of ``model`` (any model an adapter reads). ``tokens``: the batch the norm factors are
    measured on (default: the builtin corpus where the model's vocabulary holds it); ``trained``: whether
    the weights claim to be trained (fresh-random matrices are then a re-init); ``config``: a smallinit
    model config, for what a model on meta can be told from it."""
    adapter = as_adapter(model)
    module: nn.Module = adapter.module
    meta = any(p.is_meta for p in module.parameters())
    notes: list[str] = []
    if isinstance(model, Transformer) and config is None:
        config = model.config
    example = getattr(adapter, "example_inputs", None)
    probe = torch.zeros(1, 8, dtype=torch.long)
    roles = param_roles(module, example(probe) if example else None)
    writers, why = residual_writers(module, example(probe) if example else None)
    if why:
        notes.append(f"output projections not found: {why}")
    rows = matrix_rows(module, roles, set(writers))
    try:
        vocab = int(adapter.vocab_size)
    except ModelError as e:  # a forward that cannot run on token ids: no head role, no batch
        vocab = None
        notes.append(str(e))
    recipe = fit_recipe(rows, vocab)
    if meta:
        notes.append(
            "the model is on meta: σ, γ and the factors need weights; d_in, ties and ε are from shapes"
        )
    with evaluating(module):  # dropout off: the factors are the model's own, the same on every audit
        norms = _norms(adapter, module, tokens, meta, config, example, data, vocab)
    return AuditResult(
        model=type(module).__name__,
        source=source,
        matrices=tuple(rows),
        recipe=recipe,
        norms=tuple(norms[0]),
        claims_trained=trained,
        data=norms[1],
        notes=tuple(notes + norms[2]),
        step=step,
    )


def _norms(
    adapter, module, tokens, meta, config, example, data, vocab
) -> tuple[list[NormRow], str, list[str]]:
    """Each norm's row, what text its factor was measured on (or why none was), and notes."""
    layers, unreadable = readable_norm_forms(module)
    notes = [f"norm {name}: {why}" for name, why in unreadable.items()]
    at_init = None
    if config is not None:  # what the config's γ and ε give at init, σ² = d^(−2γ)
        at_init = float(relative_factor(config.gamma, config.effective_norm_eps, config.d_model))
    if meta:
        text = "no batch (the model is on meta)"
        sites, why = norm_call_sites(
            module, example(torch.zeros(1, 8, dtype=torch.long)) if example else None
        )
        if why:
            notes.append(f"norm calls not known: {why}")
        rows = [NormRow(n, "layer", f.eps) for n, f in layers.items()]
        rows += [NormRow(s.name, s.kind, s.eps, note=_site_note(s)) for s in sites.values()]
        if at_init is not None:
            rows = [
                NormRow(r.name, r.kind, r.eps, note=f"at init from the config: {at_init:.4f}") for r in rows
            ]
        return rows, text, notes
    if tokens is None and vocab is None:
        tokens, text = None, "no batch: the model's forward does not run on token ids; pass tokens="
    elif tokens is None:
        tokens, text = _default_tokens(vocab)
    else:
        text = data or f"the given batch ({tuple(tokens.shape)})"
    if tokens is None:
        rows = [NormRow(n, "layer", f.eps, note="not measured: no batch") for n, f in layers.items()]
        return rows, text, notes
    device = next(module.parameters()).device
    calls = NormCalls(module)
    try:
        with calls:
            observed = adapter.observe(tokens.to(device), kinds=("norms",))
    except ModelError as e:
        rows = [
            NormRow(n, "layer", f.eps, note="not measured: the forward failed") for n, f in layers.items()
        ]
        return rows, f"no batch: {e}", notes
    factors, missing = norm_factors_from_observed(adapter, observed)
    rows = []
    for name in dict.fromkeys([*layers, *factors, *missing]):
        site = calls.sites.get(name)
        eps = site.eps if site else layers[name].eps if name in layers else None
        f = factors.get(name)
        note = missing.get(name, _site_note(site) if site else "")
        rows.append(
            NormRow(name, site.kind if site else "layer", eps, f, None if f is None else f < SATURATED, note)
        )
    return rows, text, notes


def _site_note(site) -> str:
    note = f"called at {site.where}"
    return note + "; no ε given: the dtype's default" if site.default_eps else note


def audit_path(
    target: str | os.PathLike,
    *,
    data: str | os.PathLike | None = None,
    trained: bool | None = None,
    batch_size: int = 4,
    seq_len: int | None = None,
    tokenizer: str | os.PathLike | None = None,
) -> AuditResult:
    """``smallinit audit TARGET``: a Hugging Face folder, a smallinit run or checkpoint folder, a
    model.safetensors beside its config.json, or a smallinit preset name (built on meta: shapes and config).
    ``tokenizer`` replaces a Hugging Face folder's own (as for analyze)."""
    path = Path(target)
    if not path.exists() and str(target) in ModelConfig.presets():
        cfg = ModelConfig.preset(str(target))
        with torch.device("meta"):
            model = Transformer(cfg)
        return audit(model, config=cfg, source=f"preset {target}, on meta", trained=trained)
    if path.is_file() and path.suffix == ".safetensors":
        path = path.parent
    if not path.exists():
        raise CheckpointError(
            f"{target} does not exist; pass a Hugging Face folder, a smallinit run or checkpoint folder, or a "
            f"preset name ({', '.join(ModelConfig.presets())})"
        )
    run = load_measured(path, tokenizer=tokenizer)
    if hasattr(run, "tokenizer"):  # a Hugging Face folder
        stream, _, text = hf_batches(
            run.tokenizer, run.max_seq_len, data=data, batch_size=batch_size, seq_len=seq_len or 64, batches=1
        )
        x = next(stream, (None, None))[0]
        return audit(run.model, x, trained=trained, source=str(path), data=text)
    tok = load_tokenizer(run.config.data.tokenizer)
    batch = next(
        held_out_batches(
            run.config,
            tok,
            data=data,
            batches=1,
            batch_size=batch_size,
            seq_len=seq_len or min(64, run.config.data.seq_len),
        ),
        None,
    )
    if batch is None:
        raise ConfigError(f"no batch of text for {path}; pass --data with more text")
    text = f"{data} (--data)" if data is not None else f"the validation split of {run.config.data.corpus}"
    return audit(
        run.model,
        batch[0],
        trained=run.step > 0 if trained is None else trained,
        config=run.config.model,
        source=f"{path} (step {run.step})",
        data=text,
        step=run.step,
    )


def audit_start(cfg: Config, *, source: str = "a run's start") -> AuditResult:
    """The weights a smallinit run started from, built as its trainer built them (the model of its config drawn
    from train.seed, or train.init_from's weights), with the norm factors on the batch its Monitor measures (the
    first analysis.batch_size sequences of the validation split): the run's step 0, which no checkpoint keeps."""
    model = Transformer(cfg.model, seed=cfg.train.seed)
    if cfg.train.init_from:
        load_weights(model, resolve_checkpoint(cfg.train.init_from))
    x, _ = next(
        held_out_batches(
            cfg, load_tokenizer(cfg.data.tokenizer), batches=1, batch_size=cfg.analysis.batch_size
        )
    )
    return audit(
        model, x, trained=False, config=cfg.model, source=f"{source} (step 0)",
        data=f"the Monitor's held-out batch of the validation split of {cfg.data.corpus}", step=0,
    )  # fmt: skip


def audit_latest(run_dir: str | os.PathLike) -> AuditResult | None:
    """The audit of a run folder's newest intact checkpoint; None where it holds none."""
    return audit_path(run_dir) if latest_checkpoint(Path(run_dir)) is not None else None
