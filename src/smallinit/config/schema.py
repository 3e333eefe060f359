"""The config schema: the typed sections (model, model.moe, train, data, analysis) with each key's default and
meaning, their validation, and ``Config``, which resolves them from files, presets and overrides.

Resolution order: dataclass defaults → TOML file → ``--preset`` → ``--set`` overrides. A ``model.preset``
key starts the model section from that preset; the section's other keys then override it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from smallinit.config.coerce import check_choices, from_dict
from smallinit.config.files import commented_toml, read_config_file, read_config_json
from smallinit.config.overrides import parse_override, set_dotted
from smallinit.config.presets import PRESET_ALIASES, PRESETS
from smallinit.errors import ConfigError, did_you_mean


def _key(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    refused: dict[str, str] | None = None,
) -> Any:
    """A config key with its one-line meaning, which ``smallinit config`` prints beside it (config_keys).

    ``refused``: value → why it is refused, which the coercer says instead of listing the choices (a likely
    try such as fp16 deserves its reason)."""
    return field(default=default, default_factory=factory, metadata={"doc": doc, "refused": refused or {}})


def emulated_eps(eps: float, width: int, d_model: int, gamma: float) -> float:
    """ε scaled from a width-``width`` model to a width-``d_model`` one at equal init-time RMSNorm saturation
    (``ModelConfig.effective_norm_eps``); ``width`` 0 leaves ε as it is."""
    return eps * (width / d_model) ** (2 * gamma) if width else eps


@dataclass
class MoEConfig:
    """Mixture-of-experts feed-forward: E experts of width d_expert, top-k routing, optional shared expert."""

    num_experts: int = _key(8, "experts E per MoE layer")
    top_k: int = _key(2, "experts each token is routed to")
    d_expert: int = _key(0, "hidden width of one expert; 0 → the model's d_ff")
    shared_expert: bool = _key(False, "add one always-active expert beside the routed ones")
    every_n_layers: int = _key(1, "1 → every block is MoE; 2 → every second block, ...")
    score: Literal["softmax", "sigmoid"] = _key("softmax", "router score: softmax | sigmoid")
    aux_loss_weight: float = _key(0.01, "weight of the Switch-style load-balancing loss")
    z_loss_weight: float = _key(1e-3, "weight of the router z-loss")
    capacity_factor: float = _key(0.0, "0 → dropless (token dropping is not implemented)")


@dataclass
class ModelConfig:
    d_model: int = _key(64, "width d of the residual stream")
    n_layers: int = _key(6, "transformer blocks")
    n_heads: int = _key(
        4, "attention heads; divides d_model, and head_dim = d_model / n_heads is even (RoPE)"
    )
    n_kv_heads: int = _key(4, "key/value heads (grouped-query attention); divides n_heads")
    d_ff: int = _key(256, "hidden width of the SwiGLU feed-forward")
    vocab_size: int = _key(8192, "vocabulary size; training sets it from the tokenizer")
    max_seq_len: int = _key(512, "longest sequence the model takes (RoPE table); data.seq_len ≤ max_seq_len")
    gamma: float = _key(
        1.0, "γ: every weight matrix starts from N(0, d_in^(−2γ)); 1 is the paper's choice, 0.5 the usual"
    )
    init_scales: list[str] = _key(
        doc="per-role overrides of the γ rule, ROLE=RULE: ROLE embedding | head | output | hidden, RULE std:X | "
        'gamma:X | zero | depth (÷√(2L)); e.g. ["embedding=std:1", "output=zero"] (docs/muon-and-role-scales.md)',
        factory=list,
    )
    norm_eps: float = _key(1e-12, "ε of every RMSNorm; the paper's 1e-12 keeps the norms from saturating")
    norm_eps_width: int = _key(
        0,
        "> 0: emulate the RMSNorm saturation at init of a model this wide (see effective_norm_eps); 0 → off",
    )
    gate: Literal["none", "headwise", "elementwise"] = _key(
        "elementwise", "attention output gate sigmoid(x W_θ): none | headwise | elementwise"
    )
    qk_norm: bool = _key(False, "RMSNorm the queries and keys of each head before RoPE")
    tie_embeddings: bool = _key(True, "the LM head shares the token embedding's matrix")
    rope_theta: float = _key(10000.0, "RoPE base θ")
    moe: MoEConfig | None = _key(
        None, "mixture-of-experts feed-forward (the model.moe.* keys); absent → dense blocks"
    )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def effective_norm_eps(self) -> float:
        """The ε the model's RMSNorms use: ``norm_eps``, or with ``norm_eps_width`` = W > 0,
        ε·(W/d_model)^(2γ), so that σ²(h) ≈ d^(−2γ) at init meets ε in the same ratio as in a width-W model
        with ``norm_eps``: the narrow model starts as saturated as the wide one."""
        return emulated_eps(self.norm_eps, self.norm_eps_width, self.d_model, self.gamma)

    @staticmethod
    def presets() -> list[str]:
        return list(PRESETS) + list(PRESET_ALIASES)

    @staticmethod
    def preset(name: str, **overrides: Any) -> ModelConfig:
        name = PRESET_ALIASES.get(name, name)
        if name not in PRESETS:
            raise ConfigError(
                f"unknown preset {name!r}{did_you_mean(name, ModelConfig.presets())}; choose one of: "
                f"{', '.join(ModelConfig.presets())}"
            )
        raw = dict(PRESETS[name])
        for key, value in overrides.items():  # a nested section (moe) is merged key by key, not replaced
            both = isinstance(value, dict) and isinstance(raw.get(key), dict)
            raw[key] = {**raw[key], **value} if both else value
        return from_dict(ModelConfig, raw, "model")

    def validate(self) -> None:
        check_choices(self, "model")
        _positive(self, "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "max_seq_len")
        for name in ("d_model", "n_layers", "d_ff", "vocab_size", "max_seq_len"):
            if getattr(self, name) > 2**31:  # beyond any real model; products of two must still fit in int64
                raise ConfigError(f"model.{name}={getattr(self, name)} is too large; use at most 2**31")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim = d_model / n_heads = {self.head_dim} must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads}")
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise ConfigError(f"model.gamma must be > 0, got {self.gamma}")
        if not isinstance(self.init_scales, list) or not all(isinstance(v, str) for v in self.init_scales):
            raise ConfigError(
                f'model.init_scales must be a list of ROLE=RULE strings such as ["output=zero"], '
                f"got {self.init_scales!r}"
            )
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ConfigError(f"model.norm_eps must be > 0 (the paper uses 1e-12), got {self.norm_eps}")
        if self.norm_eps_width < 0:
            raise ConfigError(
                f"model.norm_eps_width must be ≥ 0 (0 = off, else a width such as 2048), "
                f"got {self.norm_eps_width}"
            )
        if self.rope_theta <= 0:
            raise ConfigError(f"model.rope_theta must be > 0, got {self.rope_theta}")
        if self.moe is not None:
            m = self.moe
            check_choices(m, "model.moe")
            _positive(m, "num_experts", "top_k", "every_n_layers")
            if m.top_k > m.num_experts:
                raise ConfigError(f"model.moe.top_k={m.top_k} exceeds model.moe.num_experts={m.num_experts}")
            if m.d_expert < 0 or m.aux_loss_weight < 0 or m.z_loss_weight < 0 or m.capacity_factor < 0:
                raise ConfigError("model.moe.d_expert and the MoE loss weights must be ≥ 0")
            if m.capacity_factor != 0:
                raise ConfigError(
                    f"model.moe.capacity_factor={m.capacity_factor}: token dropping is not implemented; "
                    "use 0 (dropless)"
                )
            if m.every_n_layers > self.n_layers:
                raise ConfigError(
                    f"model.moe.every_n_layers={m.every_n_layers} exceeds model.n_layers={self.n_layers}, "
                    "so no layer would be MoE; lower it or drop the moe section"
                )


@dataclass
class TrainConfig:
    steps: int = _key(300, "optimizer steps to train")
    seed: int = _key(
        0, "seed of the initial weights and of every batch (the batch of step s depends on seed and s)"
    )
    optimizer: Literal["adamw", "muon"] = _key(
        "adamw",
        "adamw | muon (torch.optim.Muon on the 2-d hidden matrices, AdamW on embeddings, head, norms, biases, "
        "the attention gate and tensors that are not 2-d)",
    )
    lr: float = _key(3e-3, "peak learning rate of AdamW (and of Muon unless train.muon_lr is set)")
    muon_lr: float = _key(0.0, "optimizer=muon: peak learning rate of Muon's matrices; 0 → train.lr")
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = _key(
        "match_rms_adamw",
        "optimizer=muon: torch.optim.Muon's adjust_lr_fn: match_rms_adamw (0.2·√max(A, B): AdamW's lr "
        "carries over) | original (√max(1, A/B), Keller Jordan's; wants a larger muon_lr)",
    )
    min_lr_ratio: float = _key(
        0.1, "the learning rate a cosine or WSD schedule decays to, as a fraction of lr"
    )
    schedule: Literal["cosine", "wsd", "constant"] = _key(
        "cosine", "learning-rate schedule after warmup: cosine | wsd (warmup-stable-decay) | constant"
    )
    warmup_steps: int = _key(30, "steps of linear warmup from lr / warmup_steps to lr")
    decay_frac: float = _key(0.2, "wsd: the last fraction of the steps decays linearly to min_lr_ratio · lr")
    batch_size: int = _key(16, "sequences per optimizer step (global: over all ranks and accumulation steps)")
    grad_accum: int = _key(1, "micro-batches per step (divides batch_size): same result, less memory")
    weight_decay: float = _key(0.1, "AdamW's decoupled weight decay of the weight matrices")
    decay_norms_and_embeddings: bool = _key(False, "also decay norm weights, biases and embeddings")
    beta1: float = _key(0.9, "AdamW β1")
    beta2: float = _key(0.95, "AdamW β2")
    adam_eps: float = _key(1e-8, "AdamW ε")
    grad_clip: float = _key(1.0, "clip the global gradient norm to this; 0 → off")
    eval_every: int = _key(
        50, "measure the validation loss every N steps (and at step 0 and the last step); 0 → last only"
    )
    eval_batches: int = _key(8, "validation batches (of batch_size sequences) per evaluation")
    checkpoint_every: int = _key(
        100, "write a checkpoint every N steps (and at the last step); 0 → last only"
    )
    keep_checkpoints: int = _key(2, "newest checkpoints kept in RUN/checkpoints; older ones are deleted")
    log_every: int = _key(10, "write a metrics.jsonl record and a progress line every N steps")
    init_from: str = _key(
        "",
        "start from the weights of this run or checkpoint folder (fresh optimizer, step 0); empty → γ-init",
    )
    device: str = _key("auto", "auto | cpu | cuda | cuda:N")
    precision: Literal["auto", "fp32", "bf16"] = _key(
        "auto",
        "auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16",
        refused={
            "fp16": "ε = 1e-12 (and the small-init activations it protects) underflow to 0 in fp16, whose "
            "smallest subnormal is 6e-8; use bf16 or fp32"
        },
    )
    compile: bool | str = _key(
        "auto",
        'torch.compile the blocks: true, false or "auto" (where it pays: tiny CPU '
        "models on long enough runs, or a warm compile cache; the choice is kept on "
        "resume)",
    )
    parallel: Literal["none", "ddp", "fsdp"] = _key("none", "none | ddp | fsdp (under torchrun)")
    activation_checkpointing: bool = _key(
        False, "keep only each block's input, recompute the rest in backward"
    )
    dist_timeout: int = _key(1800, "seconds a collective may wait for another rank before the job fails")
    nonfinite: Literal["stop", "skip"] = _key(
        "stop", "on a non-finite loss or gradient: stop | skip (skip the batch and count it)"
    )
    max_skips: int = _key(10, "nonfinite=skip: stop after this many skipped batches")
    threads: int = _key(0, "torch intra-op threads; 0 → torch's default")
    tensorboard: bool = _key(False, "mirror metrics.jsonl into RUN/tb/ (needs the tensorboard extra)")
    wandb: bool = _key(False, "mirror metrics.jsonl to Weights & Biases (needs the wandb package)")

    def validate(self) -> None:
        check_choices(self, "train")
        _positive(self, "steps", "batch_size", "grad_accum", "eval_batches", "keep_checkpoints", "log_every")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"train.lr must be > 0, got {self.lr}")
        if not (self.muon_lr >= 0 and math.isfinite(self.muon_lr)):
            raise ConfigError(f"train.muon_lr must be ≥ 0 (0 → train.lr), got {self.muon_lr}")
        for k in ("warmup_steps", "eval_every", "checkpoint_every", "max_skips", "threads", "seed"):
            if getattr(self, k) < 0:
                raise ConfigError(f"train.{k} must be ≥ 0, got {getattr(self, k)}")
        if not 0 <= self.min_lr_ratio <= 1 or not 0 < self.decay_frac <= 1:
            raise ConfigError("train.min_lr_ratio must be in [0, 1] and train.decay_frac in (0, 1]")
        if self.weight_decay < 0 or self.grad_clip < 0 or not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1:
            raise ConfigError("train.weight_decay and train.grad_clip must be ≥ 0, betas in [0, 1)")
        if self.adam_eps < 0:
            raise ConfigError(f"train.adam_eps must be ≥ 0, got {self.adam_eps}")
        if self.dist_timeout <= 0:
            raise ConfigError(f"train.dist_timeout must be > 0 seconds, got {self.dist_timeout}")
        if not isinstance(self.compile, bool) and self.compile != "auto":
            raise ConfigError(f'train.compile must be true, false or "auto", got {self.compile!r}')
        if self.batch_size > 2**24:  # every rank draws the whole batch's start positions each step
            raise ConfigError(
                f"train.batch_size={self.batch_size} is too large; use at most 2**24 sequences per step"
            )
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"train.grad_accum={self.grad_accum} must divide train.batch_size={self.batch_size}"
            )

    # -- the evaluation schedule: the trainer evaluates where this says, the planner counts what it says --------

    def evaluates(self, step: int) -> bool:
        """Whether the validation loss is measured at ``step`` (0: before the first step): every ``eval_every``
        steps from 0, and always the last."""
        return (bool(self.eval_every) and step % self.eval_every == 0) or step == self.steps

    def eval_steps(self, start: int = 0) -> list[int]:
        """The steps a run evaluates at when training starts from step ``start`` (a resumed run's checkpoint)."""
        return _due_steps(self.evaluates, self.eval_every, self.steps, start)


@dataclass
class DataConfig:
    corpus: str = _key(
        "default",
        "builtin name (default, shakespeare, zh-poems, wiki-leads, python-stdlib, large), "
        "builtin:anchor?…, builtin:sink?… (generated), file, directory or glob",
    )
    tokenizer: str = _key("default", "default | bytes | path to a tokenizer.json")
    text_field: str = _key("text", "the field holding the text in .jsonl / .parquet documents")
    seq_len: int = _key(128, "tokens per training sequence")
    val_fraction: float = _key(0.05, "fraction of the corpus held out as the validation split")
    bos: bool = _key(
        False,
        "every sequence starts at a document boundary with the end-of-text token as BOS (for "
        "sink studies); false → windows start anywhere",
    )

    def validate(self) -> None:
        _positive(self, "seq_len")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")


@dataclass
class AnalysisConfig:
    every: int = _key(0, "measure the model every N steps during training; 0 → off")
    norm_every: int = _key(
        0,
        "also measure the RMSNorm factors alone every N steps (cheap: one forward), to time "
        "how long the norms stay saturated; 0 → only with the others",
    )
    # MoE expert i of a layer is NAME.i
    matrices: list[str] = _key(
        doc="glob patterns of the matrices whose stable rank and mean |cos| between rows are logged",
        factory=lambda: ["*.attn.q_proj.weight", "*.mlp.up_proj.weight", "*.mlp.up_proj.0"],
    )
    heatmaps: list[str] = _key(
        doc="glob patterns of the matrices whose row-cosine heatmaps are saved (RUN/analysis/rowcos_step_*.npz)",
        factory=lambda: [
            "blocks.0.attn.q_proj.weight",
            "blocks.0.mlp.up_proj.weight",
            "blocks.0.mlp.up_proj.0",
        ],
    )
    snapshots: int = _key(4, "heatmap snapshots spread over training (the first measurement included)")
    heatmap_rows: int = _key(128, "rows per heatmap (a seeded sample of larger matrices)")
    batch_size: int = _key(4, "held-out sequences (the first validation windows) measured each time")

    def validate(self) -> None:
        if self.every < 0 or self.norm_every < 0:
            raise ConfigError(
                f"analysis.every and analysis.norm_every must be ≥ 0, got {self.every}, {self.norm_every}"
            )
        for key in ("matrices", "heatmaps"):
            value = getattr(self, key)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"analysis.{key} must be a list of name patterns, got {value!r}")
        if self.snapshots < 0 or self.heatmap_rows < 2 or self.batch_size < 1:
            raise ConfigError(
                "analysis.snapshots must be ≥ 0, analysis.heatmap_rows ≥ 2, analysis.batch_size ≥ 1"
            )

    # -- the analysis schedule: the Monitor measures where this says, the planner counts what it says ----------

    def analyses(self, step: int) -> bool:
        """Whether the full analysis record is taken at ``step`` (0: before the first step)."""
        return bool(self.every) and step % self.every == 0

    def measures_norms(self, step: int) -> bool:
        """Whether a norm-factor record is taken at ``step`` (beside the full record where both are due)."""
        return bool(self.norm_every) and step % self.norm_every == 0

    def steps(self, total: int, start: int = 0) -> list[int]:
        """The steps of a ``total``-step run with a full analysis record, training from step ``start``."""
        return _due_steps(self.analyses, self.every, total, start)

    def norm_steps(self, total: int, start: int = 0) -> list[int]:
        """The steps of a ``total``-step run with a norm-factor record, training from step ``start``."""
        return _due_steps(self.measures_norms, self.norm_every, total, start)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=lambda: ModelConfig.preset("cpu-1m"))
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)

    def validate(self) -> Config:
        for section in (self.model, self.train, self.data, self.analysis):
            section.validate()
        if self.data.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"data.seq_len={self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Config:
        if not isinstance(raw, dict):
            raise ConfigError(f"a config must be a table of sections, got {raw!r}")
        raw = dict(raw)
        model = raw.pop("model", None) or {}
        if not isinstance(model, dict):
            raise ConfigError(f"config section [model] must be a table, got {model!r}")
        model = dict(model)
        preset = model.pop("preset", "cpu-1m")
        if not isinstance(preset, str):
            raise ConfigError(f"model.preset must be a name, got {preset!r}")
        cfg = from_dict(Config, raw, "")
        cfg.model = ModelConfig.preset(preset, **model)
        return cfg.validate()

    @staticmethod
    def from_json_file(path: str | Path, overrides: list[str] = ()) -> Config:
        """A resolved config as written to a run folder's config.json, then ``key=value`` overrides."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p} not found; is {p.parent} a run folder?")
        raw = read_config_json(p)
        for item in overrides:
            if not isinstance(raw, dict):
                break  # from_dict names the problem
            set_dotted(raw, *parse_override(item))
        return Config.from_dict(raw)

    @staticmethod
    def load(
        path: str | Path | None = None, *, preset: str | None = None, overrides: list[str] = ()
    ) -> Config:
        """Resolve a config: file (TOML, or a run's config.json), then preset, then ``key=value`` overrides.

        ``preset`` replaces the model keys it names, even where the file sets them (a run's config.json sets
        them all); the file's other model keys stay.
        """
        raw: dict[str, Any] = read_config_file(path) if path is not None else {}
        if preset is not None:
            model = raw.setdefault("model", {})
            if isinstance(model, dict):  # else from_dict names the problem
                for key in PRESETS.get(PRESET_ALIASES.get(preset, preset), {}):
                    model.pop(key, None)
                model["preset"] = preset
        for item in overrides:
            key, value = parse_override(item)
            set_dotted(raw, key, value)
        return Config.from_dict(raw)

    def to_toml(self) -> str:
        """The config as a TOML file that ``Config.load`` reads back to an equal config, each key under a
        comment giving its meaning."""
        moe = next(f for f in dataclasses.fields(ModelConfig) if f.name == "moe")  # the one optional section
        docs = {k.key: k.doc for k in config_keys()} | {"model.moe": moe.metadata["doc"]}
        return commented_toml(self.to_dict(), docs)


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, e.g. "train.lr"
    type: str  # "int", "float", "bool", "str" or "list[str]"
    default: Any  # the value when neither file, preset nor --set gives one
    doc: str


def config_keys() -> list[KeyDoc]:
    """Every config key with its type, default and meaning; the [model.moe] keys take MoEConfig's defaults.

    ``model.preset`` is not a key of ModelConfig but a starting point: the model keys of that preset.
    """
    keys = [
        KeyDoc(
            "model.preset",
            "str",
            "cpu-1m",
            "start the [model] section from this preset "
            f"({', '.join(ModelConfig.presets())}); its other keys then override the preset's",
        )
    ]

    def walk(obj: Any, prefix: str) -> None:
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            if f.name == "moe":
                walk(MoEConfig(), f"{prefix}moe.")
            else:
                tp = hints[f.name]
                # documented as the choices' type; the meaning lists them
                if typing.get_origin(tp) is Literal:
                    tp = type(typing.get_args(tp)[0])
                # list[str] has no __name__ of its own
                type_name = str(tp) if typing.get_origin(tp) else tp.__name__
                type_name = type_name.replace(" | ", " or ")  # bool | str: a Markdown table cell holds no "|"
                keys.append(
                    KeyDoc(prefix + f.name, type_name, getattr(obj, f.name), f.metadata.get("doc", ""))
                )

    default = Config()
    for section in ("model", "train", "data", "analysis"):
        walk(getattr(default, section), f"{section}.")
    return keys


def _due_steps(due: Callable[[int], bool], every: int, last: int, start: int) -> list[int]:
    """The steps from ``start`` to ``last`` at which ``due`` holds; ``start`` itself only when it is 0, since a run
    resumed from step ``start`` measured that step before it stopped. ``due`` can hold only at multiples of
    ``every`` and at ``last``, so only those are asked (a long run is not walked step by step)."""
    first = start + 1 if start else 0
    asked = {last}.union(range(-(-first // every) * every, last + 1, every) if every else ())
    return sorted(s for s in asked if s >= first and due(s))


def _positive(obj: Any, *names: str) -> None:
    section = type(obj).__name__.replace("Config", "").lower()
    for n in names:
        v = getattr(obj, n)
        if v <= 0:
            raise ConfigError(f"{section}.{n} must be > 0, got {v}")
