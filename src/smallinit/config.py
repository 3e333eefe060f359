"""Typed configs (model / train / data / analysis), presets, TOML files and ``--set key=value`` overrides.

Resolution order: dataclass defaults → TOML file → ``--preset`` → ``--set`` overrides. A ``model.preset``
key starts the model section from that preset; the section's other keys then override it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from .errors import ConfigError

GATES = ("none", "headwise", "elementwise")


def _key(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = dataclasses.MISSING) -> Any:
    """A config key with its one-line meaning, which ``smallinit config`` prints beside it (config_keys)."""
    return field(default=default, default_factory=factory, metadata={"doc": doc})


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
    score: str = _key("softmax", "router score: softmax | sigmoid")
    aux_loss_weight: float = _key(0.01, "weight of the Switch-style load-balancing loss")
    z_loss_weight: float = _key(1e-3, "weight of the router z-loss")
    capacity_factor: float = _key(0.0, "0 → dropless (token dropping is not implemented)")


@dataclass
class ModelConfig:
    d_model: int = _key(64, "width d of the residual stream")
    n_layers: int = _key(6, "transformer blocks")
    n_heads: int = _key(4, "attention heads; divides d_model, and head_dim = d_model / n_heads is even (RoPE)")
    n_kv_heads: int = _key(4, "key/value heads (grouped-query attention); divides n_heads")
    d_ff: int = _key(256, "hidden width of the SwiGLU feed-forward")
    vocab_size: int = _key(8192, "vocabulary size; training sets it from the tokenizer")
    max_seq_len: int = _key(512, "longest sequence the model takes (RoPE table); data.seq_len ≤ max_seq_len")
    gamma: float = _key(1.0, "γ: every weight matrix starts from N(0, d_in^(−2γ)); 1 is the paper's choice, 0.5 the usual")
    norm_eps: float = _key(1e-12, "ε of every RMSNorm; the paper's 1e-12 keeps the norms from saturating")
    norm_eps_width: int = _key(0, "> 0: emulate the RMSNorm saturation at init of a model this wide (see "
                               "effective_norm_eps); 0 → off")
    gate: str = _key("elementwise", "attention output gate sigmoid(x W_θ): none | headwise | elementwise")
    qk_norm: bool = _key(False, "RMSNorm the queries and keys of each head before RoPE")
    tie_embeddings: bool = _key(True, "the LM head shares the token embedding's matrix")
    rope_theta: float = _key(10000.0, "RoPE base θ")
    moe: MoEConfig | None = _key(None, "mixture-of-experts feed-forward (the model.moe.* keys); absent → dense blocks")

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
            raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(ModelConfig.presets())}")
        raw = dict(PRESETS[name])
        for key, value in overrides.items():  # a nested section (moe) is merged key by key, not replaced
            both = isinstance(value, dict) and isinstance(raw.get(key), dict)
            raw[key] = {**raw[key], **value} if both else value
        return from_dict(ModelConfig, raw, "model")

    def validate(self) -> None:
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
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ConfigError(f"model.norm_eps must be > 0 (the paper uses 1e-12), got {self.norm_eps}")
        if self.norm_eps_width < 0:
            raise ConfigError(f"model.norm_eps_width must be ≥ 0 (0 = off, else a width such as 2048), "
                              f"got {self.norm_eps_width}")
        if self.gate not in GATES:
            raise ConfigError(f"model.gate must be one of {', '.join(GATES)}, got {self.gate!r}")
        if self.rope_theta <= 0:
            raise ConfigError(f"model.rope_theta must be > 0, got {self.rope_theta}")
        if self.moe is not None:
            m = self.moe
            _positive(m, "num_experts", "top_k", "every_n_layers")
            if m.top_k > m.num_experts:
                raise ConfigError(f"model.moe.top_k={m.top_k} exceeds model.moe.num_experts={m.num_experts}")
            if m.d_expert < 0 or m.aux_loss_weight < 0 or m.z_loss_weight < 0 or m.capacity_factor < 0:
                raise ConfigError("model.moe.d_expert and the MoE loss weights must be ≥ 0")
            if m.score not in ("softmax", "sigmoid"):
                raise ConfigError(f"model.moe.score must be softmax or sigmoid, got {m.score!r}")
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


# Our shape guesses (the paper gives sizes, not shapes; 1.5b has d_model 2048 as in its Fig. 1c).
# Parameter counts are computed by `smallinit info --preset NAME`; see the README for the table.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-1m": dict(d_model=64, n_layers=6, n_heads=4, n_kv_heads=4, d_ff=256, vocab_size=8192, max_seq_len=256),
    "cpu-5m": dict(d_model=192, n_layers=8, n_heads=6, n_kv_heads=6, d_ff=512, vocab_size=8192, max_seq_len=512),
    "cpu-20m": dict(d_model=384, n_layers=8, n_heads=6, n_kv_heads=6, d_ff=1152, vocab_size=8192, max_seq_len=512),
    "0.1b": dict(d_model=640, n_layers=12, n_heads=10, n_kv_heads=10, d_ff=1728, vocab_size=32768,
                 max_seq_len=2048, tie_embeddings=False),
    "0.3b": dict(d_model=1024, n_layers=16, n_heads=16, n_kv_heads=16, d_ff=2816, vocab_size=32768,
                 max_seq_len=2048, tie_embeddings=False),
    "0.5b": dict(d_model=1280, n_layers=18, n_heads=10, n_kv_heads=10, d_ff=3456, vocab_size=32768,
                 max_seq_len=2048, tie_embeddings=False),
    "1b": dict(d_model=1792, n_layers=20, n_heads=14, n_kv_heads=14, d_ff=4864, vocab_size=32768,
               max_seq_len=2048, tie_embeddings=False),
    "1.5b": dict(d_model=2048, n_layers=24, n_heads=16, n_kv_heads=16, d_ff=5504, vocab_size=32768,
                 max_seq_len=2048, tie_embeddings=False),
    # MoE (our shapes): fine-grained experts, 64 per layer, top-6 softmax routing, every layer MoE, no shared
    # expert; d_ff = top_k · d_expert, so a dense layer (moe.every_n_layers > 1) costs what an MoE layer does.
    # Counts by `smallinit info --preset NAME`: 1.48B total / 0.25B active; 3.06B / 0.50B.
    "moe-1.5b-a0.25b": dict(d_model=768, n_layers=24, n_heads=6, n_kv_heads=6, d_ff=2304, vocab_size=32768,
                            max_seq_len=2048, tie_embeddings=False,
                            moe=dict(num_experts=64, top_k=6, d_expert=384)),
    "moe-3b-a0.5b": dict(d_model=1024, n_layers=32, n_heads=8, n_kv_heads=8, d_ff=2688, vocab_size=32768,
                         max_seq_len=2048, tie_embeddings=False,
                         moe=dict(num_experts=64, top_k=6, d_expert=448)),
    # tiny MoE for CPU tests and demos: 8 experts, top-2
    "cpu-moe-1m": dict(d_model=64, n_layers=4, n_heads=4, n_kv_heads=4, d_ff=128, vocab_size=8192, max_seq_len=256,
                       moe=dict(num_experts=8, top_k=2, d_expert=64)),
    "cpu-moe-5m": dict(d_model=128, n_layers=6, n_heads=4, n_kv_heads=4, d_ff=384, vocab_size=8192, max_seq_len=512,
                       moe=dict(num_experts=8, top_k=2, d_expert=192)),
}
PRESET_ALIASES = {"tiny": "cpu-1m"}


@dataclass
class TrainConfig:
    steps: int = _key(300, "optimizer steps to train")
    seed: int = _key(0, "seed of the initial weights and of every batch (the batch of step s depends on seed and s)")
    lr: float = _key(3e-3, "peak learning rate of AdamW")
    min_lr_ratio: float = _key(0.1, "the learning rate a cosine or WSD schedule decays to, as a fraction of lr")
    schedule: str = _key("cosine", "learning-rate schedule after warmup: cosine | wsd (warmup-stable-decay) | constant")
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
    eval_every: int = _key(50, "measure the validation loss every N steps (and at step 0 and the last step); 0 → last only")
    eval_batches: int = _key(8, "validation batches (of batch_size sequences) per evaluation")
    checkpoint_every: int = _key(100, "write a checkpoint every N steps (and at the last step); 0 → last only")
    keep_checkpoints: int = _key(2, "newest checkpoints kept in RUN/checkpoints; older ones are deleted")
    log_every: int = _key(10, "write a metrics.jsonl record and a progress line every N steps")
    init_from: str = _key("", "start from the weights of this run or checkpoint folder (fresh optimizer, step 0); "
                          "empty → γ-init")
    device: str = _key("auto", "auto | cpu | cuda | cuda:N")
    precision: str = _key("auto", "auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16")
    compile: bool | str = _key("auto", 'torch.compile the blocks: true, false or "auto" (where it pays: tiny CPU '
                                       "models on long enough runs, or a warm compile cache; the choice is kept on "
                                       "resume)")
    parallel: str = _key("none", "none | ddp | fsdp (under torchrun)")
    activation_checkpointing: bool = _key(False, "keep only each block's input, recompute the rest in backward")
    dist_timeout: int = _key(1800, "seconds a collective may wait for another rank before the job fails")
    nonfinite: str = _key("stop", "on a non-finite loss or gradient: stop | skip (skip the batch and count it)")
    max_skips: int = _key(10, "nonfinite=skip: stop after this many skipped batches")
    threads: int = _key(0, "torch intra-op threads; 0 → torch's default")
    tensorboard: bool = _key(False, "mirror metrics.jsonl into RUN/tb/ (needs the tensorboard extra)")
    wandb: bool = _key(False, "mirror metrics.jsonl to Weights & Biases (needs the wandb package)")

    def validate(self) -> None:
        _positive(self, "steps", "batch_size", "grad_accum", "eval_batches", "keep_checkpoints", "log_every")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"train.lr must be > 0, got {self.lr}")
        for k in ("warmup_steps", "eval_every", "checkpoint_every", "max_skips", "threads", "seed"):
            if getattr(self, k) < 0:
                raise ConfigError(f"train.{k} must be ≥ 0, got {getattr(self, k)}")
        if not 0 <= self.min_lr_ratio <= 1 or not 0 < self.decay_frac <= 1:
            raise ConfigError("train.min_lr_ratio must be in [0, 1] and train.decay_frac in (0, 1]")
        if self.weight_decay < 0 or self.grad_clip < 0 or not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1:
            raise ConfigError("train.weight_decay and train.grad_clip must be ≥ 0, betas in [0, 1)")
        if self.adam_eps < 0:
            raise ConfigError(f"train.adam_eps must be ≥ 0, got {self.adam_eps}")
        _choice(self, "schedule", ("cosine", "wsd", "constant"))
        if self.precision == "fp16":
            raise ConfigError(
                "train.precision=fp16 is refused: ε = 1e-12 (and the small-init activations it protects) "
                "underflow to 0 in fp16, whose smallest subnormal is 6e-8; use bf16 or fp32"
            )
        _choice(self, "precision", ("auto", "fp32", "bf16"))
        _choice(self, "parallel", ("none", "ddp", "fsdp"))
        if self.dist_timeout <= 0:
            raise ConfigError(f"train.dist_timeout must be > 0 seconds, got {self.dist_timeout}")
        _choice(self, "nonfinite", ("stop", "skip"))
        if not isinstance(self.compile, bool) and self.compile != "auto":
            raise ConfigError(f'train.compile must be true, false or "auto", got {self.compile!r}')
        if self.batch_size > 2**24:  # every rank draws the whole batch's start positions each step
            raise ConfigError(f"train.batch_size={self.batch_size} is too large; use at most 2**24 sequences per step")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"train.grad_accum={self.grad_accum} must divide train.batch_size={self.batch_size}")


@dataclass
class DataConfig:
    corpus: str = _key("default", "builtin name (default, shakespeare, zh-poems), file, directory or glob")
    tokenizer: str = _key("default", "default | bytes | path to a tokenizer.json")
    text_field: str = _key("text", "the field holding the text in .jsonl / .parquet documents")
    seq_len: int = _key(128, "tokens per training sequence")
    val_fraction: float = _key(0.05, "fraction of the corpus held out as the validation split")

    def validate(self) -> None:
        _positive(self, "seq_len")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")


@dataclass
class AnalysisConfig:
    every: int = _key(0, "measure the model every N steps during training; 0 → off")
    # MoE expert i of a layer is NAME.i
    matrices: list[str] = _key(
        doc="glob patterns of the matrices whose stable rank and mean |cos| between rows are logged",
        factory=lambda: ["*.attn.q_proj.weight", "*.mlp.up_proj.weight", "*.mlp.up_proj.0"],
    )
    heatmaps: list[str] = _key(
        doc="glob patterns of the matrices whose row-cosine heatmaps are saved (RUN/analysis/rowcos_step_*.npz)",
        factory=lambda: ["blocks.0.attn.q_proj.weight", "blocks.0.mlp.up_proj.weight", "blocks.0.mlp.up_proj.0"],
    )
    snapshots: int = _key(4, "heatmap snapshots spread over training (the first measurement included)")
    heatmap_rows: int = _key(128, "rows per heatmap (a seeded sample of larger matrices)")
    batch_size: int = _key(4, "held-out sequences (the first validation windows) measured each time")

    def validate(self) -> None:
        if self.every < 0:
            raise ConfigError(f"analysis.every must be ≥ 0, got {self.every}")
        for key in ("matrices", "heatmaps"):
            value = getattr(self, key)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"analysis.{key} must be a list of name patterns, got {value!r}")
        if self.snapshots < 0 or self.heatmap_rows < 2 or self.batch_size < 1:
            raise ConfigError("analysis.snapshots must be ≥ 0, analysis.heatmap_rows ≥ 2, analysis.batch_size ≥ 1")


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
        raw = _read_json(p)
        for item in overrides:
            if not isinstance(raw, dict):
                break  # from_dict names the problem
            set_dotted(raw, *parse_override(item))
        return Config.from_dict(raw)

    @staticmethod
    def load(path: str | Path | None = None, *, preset: str | None = None, overrides: list[str] = ()) -> Config:
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
        lines: list[str] = []
        moe = next(f for f in dataclasses.fields(ModelConfig) if f.name == "moe")  # the one optional section
        docs = {k.key: k.doc for k in config_keys()} | {"model.moe": moe.metadata["doc"]}
        for section, table in self.to_dict().items():
            _toml_section(lines, section, table, docs)
        return "\n".join(lines).lstrip("\n") + "\n"


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
    keys = [KeyDoc("model.preset", "str", "cpu-1m", "start the [model] section from this preset "
                   f"({', '.join(ModelConfig.presets())}); its other keys then override the preset's")]

    def walk(obj: Any, prefix: str) -> None:
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            if f.name == "moe":
                walk(MoEConfig(), f"{prefix}moe.")
            else:
                tp = hints[f.name]
                type_name = str(tp) if typing.get_origin(tp) else tp.__name__  # list[str] has no __name__ of its own
                type_name = type_name.replace(" | ", " or ")  # bool | str: a Markdown table cell holds no "|"
                keys.append(KeyDoc(prefix + f.name, type_name, getattr(obj, f.name), f.metadata.get("doc", "")))

    default = Config()
    for section in ("model", "train", "data", "analysis"):
        walk(getattr(default, section), f"{section}.")
    return keys


def _toml_section(lines: list[str], name: str, table: dict[str, Any], docs: dict[str, str]) -> None:
    lines += ["", f"[{name}]"]
    nested = []
    for key, value in table.items():
        if isinstance(value, dict):
            nested.append((key, value))
            continue
        if value is None:  # an absent optional section
            lines.append(f"# [{name}.{key}] (absent): {docs[f'{name}.{key}']}")
            continue
        lines += [f"# {docs[f'{name}.{key}']}", f"{key} = {_toml_value(value)}"]
    for key, value in nested:
        _toml_section(lines, f"{name}.{key}", value, docs)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # Python's shortest round-trip form is valid TOML (1e-12, 0.003, 10000.0)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    # JSON's escapes are TOML's; DEL is the one control character JSON leaves raw and TOML refuses
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML config file, or a run's resolved config: its config.json, the run folder or one of its
    checkpoint folders (RUN/checkpoints/step_N)."""
    p = Path(path)
    if p.is_dir():
        run = p.parent.parent if p.parent.name == "checkpoints" else p
        p = run / "config.json" if (run / "config.json").is_file() else p
    if p.suffix == ".json" and p.is_file():
        return _read_json(p)
    return read_toml(p)


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        raise ConfigError(f"{p} is not valid JSON; the run folder is damaged") from None


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found; pass an existing .toml file, or a run folder or its "
                          "config.json")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deep
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value``: the value is read as a TOML literal (1e-12, true, "x", [1, 2]) or else kept as text."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.isidentifier() for part in key.split(".")):
        raise ConfigError(f"--set {item!r} is not of the form section.key=value (e.g. train.steps=200)")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    except RecursionError:
        raise ConfigError(f"--set {key}: the value nests too deeply; pass a plain value") from None
    return key, value


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"steps": 1}, "model.gamma": 1}`` → ``{"train.steps": 1, "model.gamma": 1}``."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{full}."))
        else:
            out[full] = value
    return out


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part!r} is a value, not a section")
        node = child
    node[last] = value


def from_dict(cls: type, raw: Any, where: str) -> Any:
    """Build dataclass ``cls`` from a dict, checking names and types; ``where`` names the section."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config section [{where}] must be a table, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        key = f"{where}." if where else ""
        key += unknown[0]
        raise ConfigError(  # repr() for keys with control characters: the message stays one line
            f"unknown config key {key if key.isprintable() else repr(key)}; known keys: {', '.join(sorted(names))}"
        )
    kwargs = {name: _coerce(hints[name], value, f"{where}.{name}" if where else name) for name, value in raw.items()}
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and len(args) == 1):
            return None
        if len(args) == 1:
            return _coerce(args[0], value, where)
        for arg in args:  # bool | str: the first type the value is
            try:
                return _coerce(arg, value, where)
            except ConfigError:
                pass
        raise ConfigError(f"config key {where} must be {' or '.join(a.__name__ for a in args)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # nan slips through every range check, and is not valid JSON
                raise ConfigError(f"config key {where} must be a finite number, got {value!r}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"config key {where} must be {tp.__name__}, got {value!r}")


def _positive(obj: Any, *names: str) -> None:
    section = type(obj).__name__.replace("Config", "").lower()
    for n in names:
        v = getattr(obj, n)
        if v <= 0:
            raise ConfigError(f"{section}.{n} must be > 0, got {v}")


def _choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(obj, name)
    if v not in choices:
        section = type(obj).__name__.replace("Config", "").lower()
        raise ConfigError(f"{section}.{name} must be one of {', '.join(choices)}, got {v!r}")
