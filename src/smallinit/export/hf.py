"""Hugging Face bridge: export a smallinit checkpoint to a ``transformers`` folder, and γ-init any HF config.

``export_hf`` writes safetensors + config.json + tokenizer files that ``AutoModelForCausalLM`` and
``AutoTokenizer`` load offline. It picks the stock class that computes exactly what our model computes:

    gate none,        no QK-norm      → LlamaForCausalLM
    gate none,        QK-norm         → Qwen3ForCausalLM (per-head q/k RMSNorm before RoPE)
    gate elementwise, QK-norm, dense  → Qwen3NextForCausalLM, every layer full attention, full rotary;
                                        its q_proj emits [query | gate] per head and its RMSNorms scale by
                                        (1 + w), so W_θ is interleaved into q_proj and norm weights stored as w − 1
    MoE, no gate, softmax, no shared expert, QK-norm
                                      → Qwen3MoeForCausalLM (top-k renormalised iff k > 1, as ours)
    MoE, no gate, softmax, no shared expert, no QK-norm, every layer MoE, k > 1
                                      → MixtralForCausalLM
    anything else (headwise gate, elementwise gate without QK-norm, other MoE)
                                      → SmallinitForCausalLM, our own class shipped in the folder
                                        (trust_remote_code=True; auto_map in config.json)

``init_hf`` builds any causal-LM architecture from a Hugging Face config, applies the γ rule and the
paper's ε to every norm, and saves it: pretraining from scratch with small init on a stock architecture.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from smallinit import io
from smallinit.adapters.hf import transformers_too_old
from smallinit.adapters.hf_folder import coverage_problem, read_tokenizer
from smallinit.config import Config, ModelConfig
from smallinit.data import EOS_TOKEN, load_tokenizer
from smallinit.data.tokenizer import run_tokenizer
from smallinit.errors import CheckpointError, ConfigError, SmallinitError
from smallinit.export.gated import add_attention_gate_
from smallinit.init import InitReport, gamma_init_, set_norm_eps_
from smallinit.init.eps import EPS_ATTRS, NormEpsError
from smallinit.init.gate import KINDS, GateReport
from smallinit.model import Transformer
from smallinit.train.checkpoint import load_weights, resolve_checkpoint

REMOTE_DIR = Path(__file__).resolve().parent / "remote"
REMOTE_FILES = ("configuration_smallinit.py", "modeling_smallinit.py")
REMOTE_CLASS = "SmallinitForCausalLM"
EPS_FIELDS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon")


class ExportError(SmallinitError):
    """The Hugging Face bridge cannot do what was asked (missing package, occupied output folder, ...)."""


@dataclass
class ExportResult:
    out_dir: Path
    architecture: str  # the transformers class written to config.json
    remote_code: bool  # True → load with trust_remote_code=True
    reason: str  # why this class reproduces the model exactly
    step: int  # the checkpoint's training step


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise ExportError("transformers is not installed; pip install 'smallinit[hf]'") from None
    if why := transformers_too_old(transformers.__version__):
        raise ExportError(why)
    return transformers


def choose_architecture(cfg: ModelConfig) -> tuple[str, str]:
    """The transformers class that computes exactly what ``cfg`` computes, and why."""
    if cfg.moe is not None:
        m = cfg.moe
        if cfg.gate == "none" and m.score == "softmax" and not m.shared_expert:
            if cfg.qk_norm:
                return "Qwen3MoeForCausalLM", (
                    "MoE without gate, softmax top-k routing, no shared expert, QK-norm: Qwen3-MoE"
                )
            if m.every_n_layers == 1 and m.top_k > 1:
                return "MixtralForCausalLM", (
                    "MoE without gate or QK-norm, softmax top-k (k > 1, renormalised), every layer: Mixtral"
                )
        return REMOTE_CLASS, "MoE with a gate, shared expert, sigmoid scores or dense layers: no stock class"
    if cfg.gate == "none":
        if cfg.qk_norm:
            return "Qwen3ForCausalLM", "no gate, per-head QK RMSNorm before RoPE: Qwen3 attention"
        return "LlamaForCausalLM", "no gate, no QK-norm: Llama"
    if cfg.gate == "elementwise" and cfg.qk_norm:
        return "Qwen3NextForCausalLM", (
            "elementwise gate with QK-norm: Qwen3-Next gated attention, all layers full attention, full rotary"
        )
    if cfg.gate == "headwise":
        return REMOTE_CLASS, "headwise gate: no stock class has one sigmoid per head"
    return REMOTE_CLASS, "elementwise gate without QK-norm: Qwen3-Next always normalises q and k"


def hf_config(cfg: ModelConfig, architecture: str, eos_id: int):
    """The transformers config object for ``architecture``."""
    transformers = require_transformers()
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.effective_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=None,
    )
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    stock = dict(common, head_dim=cfg.head_dim, hidden_act="silu", attention_bias=False, rope_parameters=rope)
    if architecture == "LlamaForCausalLM":
        return transformers.LlamaConfig(**stock, mlp_bias=False)
    if architecture == "Qwen3ForCausalLM":
        return transformers.Qwen3Config(**stock, use_sliding_window=False)
    if architecture == "Qwen3MoeForCausalLM":
        return transformers.Qwen3MoeConfig(
            **stock,
            use_sliding_window=False,
            num_experts=cfg.moe.num_experts,
            num_experts_per_tok=cfg.moe.top_k,
            moe_intermediate_size=cfg.moe.d_expert or cfg.d_ff,
            decoder_sparse_step=cfg.moe.every_n_layers,
            mlp_only_layers=[],
            norm_topk_prob=cfg.moe.top_k > 1,  # ours renormalises the top-k weights only when k > 1
        )
    if architecture == "MixtralForCausalLM":  # every layer MoE: intermediate_size is the expert width
        return transformers.MixtralConfig(
            **dict(stock, intermediate_size=cfg.moe.d_expert or cfg.d_ff),
            num_local_experts=cfg.moe.num_experts,
            num_experts_per_tok=cfg.moe.top_k,
            sliding_window=None,
            router_jitter_noise=0.0,
        )
    if architecture == "Qwen3NextForCausalLM":
        return transformers.Qwen3NextConfig(
            **dict(stock, rope_parameters=dict(rope, partial_rotary_factor=1.0)),
            layer_types=["full_attention"] * cfg.n_layers,
            num_experts=0,
            mlp_only_layers=list(range(cfg.n_layers)),
        )
    from smallinit.export.remote.configuration_smallinit import SmallinitConfig

    moe: dict[str, Any] = {}
    if cfg.moe is not None:
        moe = dict(
            num_experts=cfg.moe.num_experts,
            num_experts_per_tok=cfg.moe.top_k,
            moe_intermediate_size=cfg.moe.d_expert or cfg.d_ff,
            moe_shared_expert=cfg.moe.shared_expert,
            moe_every_n_layers=cfg.moe.every_n_layers,
            moe_score=cfg.moe.score,
        )
    config = SmallinitConfig(
        **common,
        rope_theta=cfg.rope_theta,
        attn_output_gate=cfg.gate,
        qk_norm=cfg.qk_norm,
        initializer_gamma=cfg.gamma,
        **moe,
    )
    config.auto_map = {
        "AutoConfig": "configuration_smallinit.SmallinitConfig",
        "AutoModelForCausalLM": f"modeling_smallinit.{REMOTE_CLASS}",
    }
    return config


def hf_tensors(
    state: dict[str, torch.Tensor], cfg: ModelConfig, architecture: str
) -> dict[str, torch.Tensor]:
    """Our parameter names → Hugging Face names (``model.layers.N.self_attn.q_proj.weight``, ...)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue  # tied: transformers re-ties lm_head to the embedding on load
        parts = name.split(".")
        if parts[0] == "embed":
            new = "model.embed_tokens.weight"
        elif parts[0] == "norm":
            new = "model.norm.weight"
        elif parts[0] == "lm_head":
            new = name
        else:  # blocks.N.<module>.<rest>
            module = {
                "attn_norm": "input_layernorm",
                "attn": "self_attn",
                "mlp_norm": "post_attention_layernorm",
                "mlp": "mlp",
            }[parts[2]]
            new = ".".join(["model", "layers", parts[1], module, *parts[3:]])
        out[new] = t.detach().to(torch.float32).contiguous()
    if architecture == "Qwen3NextForCausalLM":
        _to_qwen3_next(out, cfg)
    if architecture in ("Qwen3MoeForCausalLM", "MixtralForCausalLM"):
        _to_fused_experts(out)
    return out


def _to_fused_experts(t: dict[str, torch.Tensor]) -> None:
    """Qwen3-MoE / Mixtral: router ``mlp.gate``; experts ``gate_up_proj`` = [gate; up] (E, 2·d_e, d)."""
    for name in [n for n in t if n.endswith(".mlp.router.weight")]:
        pre = name[: -len("router.weight")]
        t[pre + "gate.weight"] = t.pop(name)
        gate, up = t.pop(pre + "gate_proj"), t.pop(pre + "up_proj")
        t[pre + "experts.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        t[pre + "experts.down_proj"] = t.pop(pre + "down_proj")


def _to_qwen3_next(t: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    """Qwen3-Next: q_proj rows are [query_h | gate_h] per head h; RMSNorm multiplies by (1 + w)."""
    H, hd, d = cfg.n_heads, cfg.head_dim, cfg.d_model
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}.self_attn."
        q = t[pre + "q_proj.weight"].view(H, hd, d)
        g = t.pop(pre + "g_proj.weight").view(H, hd, d)
        t[pre + "q_proj.weight"] = torch.cat([q, g], dim=1).reshape(2 * H * hd, d).contiguous()
    for name in list(t):
        if (
            name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight"))
            or name == "model.norm.weight"
        ):
            t[name] = t[name] - 1.0  # exact for weights in [0.5, 2] (Sterbenz), within an ulp elsewhere


def hf_tokenizer(tokenizer, max_len: int):
    """Our tokenizer as a fast HF tokenizer: same tokenizer.json, EOS (and padding) ``<|endoftext|>``."""
    transformers = require_transformers()
    # split_special_tokens keeps our rule that text never encodes to EOS (only the data pipeline inserts it)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.hf,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        split_special_tokens=True,
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
    )


def _check_against_class(tensors: dict[str, torch.Tensor], config, architecture: str) -> None:
    """Build the target class on the meta device and check that names and shapes match one to one."""
    transformers = require_transformers()
    if architecture == REMOTE_CLASS:
        from smallinit.export.remote.modeling_smallinit import SmallinitForCausalLM as cls
    else:
        cls = getattr(transformers, architecture)
    with torch.device("meta"):
        model = cls(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if expected != got:
        diff = sorted(set(expected) ^ set(got)) or [k for k in expected if expected[k] != got[k]]
        raise CheckpointError(f"the {architecture} export does not match the model at {diff[0]}; report this")


@contextlib.contextmanager
def _publishing(out_dir: Path) -> Iterator[Path]:
    """A temporary folder that becomes ``out_dir`` when the block succeeds (io.publishing), its files
    readable as the umask says. Refuses an out_dir that holds files: an export never replaces one."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir} already exists and is not empty; choose another output folder")
    with io.publishing(out_dir) as tmp:
        yield tmp
        _umask_modes(tmp)


def _umask_modes(folder: Path) -> None:
    """Give every file in ``folder`` the mode config.json got from the umask (0644 under the usual 022):
    safetensors writes its files 0600 whatever the umask, so an exported model would be private to its writer."""
    mode = (folder / "config.json").stat().st_mode & 0o777
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


def export_hf(checkpoint: str | Path, out_dir: str | Path) -> ExportResult:
    """Write a transformers folder (safetensors, config.json, tokenizer) for a run or checkpoint folder."""
    transformers = require_transformers()
    found = resolve_checkpoint(checkpoint)
    cfg = Config.from_dict(found.state["config"])
    model = Transformer(cfg.model, init=False)
    load_weights(model, found)
    tokenizer = run_tokenizer(cfg.data.tokenizer, cfg.model.vocab_size)
    architecture, reason = choose_architecture(cfg.model)
    config = hf_config(cfg.model, architecture, tokenizer.eos_id)
    config.architectures = [architecture]
    config.dtype = torch.float32
    tensors = hf_tensors(model.state_dict(), cfg.model, architecture)
    _check_against_class(tensors, config, architecture)

    out_dir = Path(out_dir)
    with _publishing(out_dir) as tmp:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        config.save_pretrained(tmp)
        transformers.GenerationConfig(
            bos_token_id=None, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id
        ).save_pretrained(tmp)
        hf_tokenizer(tokenizer, cfg.model.max_seq_len).save_pretrained(tmp)
        if architecture == REMOTE_CLASS:
            for fname in REMOTE_FILES:
                shutil.copyfile(REMOTE_DIR / fname, tmp / fname)
    return ExportResult(out_dir, architecture, architecture == REMOTE_CLASS, reason, found.step)


# -- init-hf ----------------------------------------------------------------------------------------------------


def read_hf_config(config_or_dir: str | Path):
    """A transformers config from a config.json file or a folder holding one (no network, no remote code)."""
    transformers = require_transformers()
    path = Path(config_or_dir)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} not found; pass a Hugging Face config.json or a folder that holds one")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{path} is not valid JSON; pass a Hugging Face config.json") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise ConfigError(f"{path} has no model_type; pass a Hugging Face config.json")
    model_type = raw.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError(
            f"{path}: model_type {model_type!r} is not known to transformers "
            f"{transformers.__version__}; upgrade transformers or use another config"
        )
    try:
        return transformers.AutoConfig.for_model(model_type, **raw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path} is not a valid {model_type} config: {str(e).splitlines()[0]}") from None


@dataclass
class InitHFResult:
    out_dir: Path
    architecture: str
    report: InitReport
    norms: list[str]  # norm modules whose ε was set
    offset_norms: list[str]  # weights of norms of the (1 + w) form, set to w = 0
    config_fields: list[str]  # config keys that now carry ε
    norm_eps: float | None = None  # None: the architecture's ε kept
    tokenizer: str = ""  # which tokenizer was saved, or why none was
    gate: GateReport | None = None  # the attention gate added, if one was asked for

    def __str__(self) -> str:
        eps = (
            (
                f"norm ε = {self.norm_eps:g} set on {len(self.norms)} modules and saved in config fields "
                f"{', '.join(self.config_fields) or '(none needed)'}"
            )
            if self.norm_eps is not None
            else "norm ε: the architecture's, kept"
        )
        lines = [str(self.report), eps]
        if self.offset_norms:
            lines.append(f"{len(self.offset_norms)} norms scale by (1 + w): their weights start at 0")
        if self.gate is not None:
            lines.append(str(self.gate))
        lines += [self.tokenizer, f"saved {self.architecture} to {self.out_dir}"]
        return "\n".join(lines)


def _eps_kept(transformers, config, model: torch.nn.Module, norms: list[str], norm_eps: float) -> None:
    """A model rebuilt from the config it is saved with must have ε on every norm: where the config has no
    field for it (OPT builds nn.LayerNorm with its default), the saved model would silently reload with
    another ε."""
    with torch.device("meta"):
        rebuilt = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    lost = []
    for name in norms:
        mod = rebuilt.get_submodule(name)
        eps = next((getattr(mod, a) for a in EPS_ATTRS if isinstance(getattr(mod, a, None), float)), None)
        if eps != norm_eps:
            lost.append((name, eps))
    if lost:
        name, eps = lost[0]
        more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
        raise ExportError(
            f"{type(model).__name__}'s config has no field for the ε of {name}{more}: saved, the model would reload "
            f"with ε = {eps:g}, not {norm_eps:g}; pass --keep-norm-eps to keep the architecture's ε"
        )


# smallinit's builtin tokenizers, largest first: the default a folder gets when it covers the model's vocabulary
BUILTIN_FOR_INIT = ("default", "bytes")


def init_tokenizer(tokenizer: str | Path | None, vocab_size: int, max_len: int) -> tuple[Any, str]:
    """(the transformers tokenizer init-hf saves, or None; the line that says which, or why none): the one given
    (a builtin name, a folder or a tokenizer.json), refused if it cannot be the model's, else the largest
    builtin one that covers the vocabulary (adapters.hf_folder.coverage_problem)."""
    if tokenizer is not None:
        builtin = str(tokenizer) in BUILTIN_FOR_INIT and not Path(tokenizer).exists()
        tok = hf_tokenizer(load_tokenizer(str(tokenizer)), max_len) if builtin else read_tokenizer(tokenizer)
        problem = coverage_problem(len(tok), vocab_size)
        if problem is not None:
            raise ConfigError(f"--tokenizer {tokenizer} {problem}; pass the tokenizer the model is meant for")
        return tok, f"tokenizer: {tokenizer} ({len(tok):,} tokens) saved with the model"
    for name in BUILTIN_FOR_INIT:
        builtin = load_tokenizer(name)
        if coverage_problem(builtin.vocab_size, vocab_size) is None:
            return hf_tokenizer(builtin, max_len), (
                f"tokenizer: smallinit's builtin {name!r} ({builtin.vocab_size:,} tokens, for the model's "
                f"{vocab_size:,} embeddings) saved with the model; pass --tokenizer for the model's own"
            )
    return None, (
        f"no tokenizer saved: none of smallinit's builtin ones covers a vocabulary of {vocab_size:,} "
        "(8,192 and 257 tokens); pass the model's with --tokenizer PATH_OR_FOLDER, or save it into the "
        "folder (tokenizer.save_pretrained), before analyze or compare"
    )


def init_hf(
    config_or_dir: str | Path,
    out_dir: str | Path,
    gamma: float = 1.0,
    norm_eps: float | None = 1e-12,
    seed: int = 0,
    tokenizer: str | Path | None = None,
    gate: str = "none",
    scales: list[str] | None = None,
) -> InitHFResult:
    """Build a causal LM from a Hugging Face config, γ-init it (``scales``: per-role overrides of the γ rule,
    ROLE=RULE as ``gamma_init_`` takes them), set every norm's ε (None: keep the
    architecture's), add the attention output gate (``gate``: elementwise, headwise or none; W_θ drawn from the
    same seeded generator), save it to ``out_dir`` with a tokenizer (``tokenizer``, else a builtin one that
    covers the vocabulary, else none, said in the result). ε that cannot be set or saved and a gate that cannot
    be added raise; nothing is written."""
    transformers = require_transformers()
    if gate not in ("none", *KINDS):
        raise ConfigError(f"model.gate must be one of none, {', '.join(KINDS)}, got {gate!r}")
    config = read_hf_config(config_or_dir)
    text_config = config.get_text_config()
    tok, tok_line = init_tokenizer(
        tokenizer, text_config.vocab_size, getattr(text_config, "max_position_embeddings", None) or 1 << 30
    )
    if norm_eps is not None and not norm_eps > 0:
        raise ConfigError(f"model.norm_eps must be > 0 (the paper uses 1e-12), got {norm_eps}")
    fields = []
    if norm_eps is not None:
        for cfg in {id(c): c for c in (config, config.get_text_config())}.values():
            for key in EPS_FIELDS:
                if isinstance(getattr(cfg, key, None), float):
                    setattr(cfg, key, float(norm_eps))
                    fields.append(key)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except ValueError as e:
        raise ConfigError(
            f"{config_or_dir}: no causal-LM class for this config ({str(e).splitlines()[0]})"
        ) from None
    generator = torch.Generator().manual_seed(seed)
    report = gamma_init_(model, gamma, generator=generator, scales=scales)
    norms: list[str] = []
    if norm_eps is not None:
        try:
            norms = set_norm_eps_(model, norm_eps)
        except NormEpsError as e:
            raise ExportError(f"{e} (--keep-norm-eps)") from None
        _eps_kept(transformers, config, model, norms, norm_eps)
    gated = add_attention_gate_(model, gate, gamma, generator=generator) if gate != "none" else None

    out_dir = Path(out_dir)
    with _publishing(out_dir) as tmp:
        model.save_pretrained(tmp)
        if tok is not None:
            tok.save_pretrained(tmp)
    offset = [r.name for r in report.rows if r.kind == "norm" and r.rule == "zeros"]
    return InitHFResult(
        out_dir, type(model).__name__, report, norms, offset, sorted(set(fields)), norm_eps, tok_line, gated
    )
