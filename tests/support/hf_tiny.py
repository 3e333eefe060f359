"""Tiny Hugging Face causal LMs of every architecture the installed transformers can build offline, and
what γ-init must give each of their parameters, measured independently of smallinit's own code.

The expectation is computed from each parameter's own module, run on its own: a module that owns one
weight matrix and is linear in its input has an output variance per unit input variance of d_in·σ², so a
γ = 1 draw (σ = 1/d_in) has gain = σ whatever way the matrix is stored; a module that normalises (its
output does not change when the input is scaled ×10) must have output scale 1; an embedding lookup's rows
must have σ = d^(−γ) with d its output width; a bias must give 0 at zero input. The few parameters no
module measurement reaches (fused experts, parameters with their own initialisation) are read from each
architecture's modeling source into ``SOURCE_TABLE``.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field

import torch

transformers = __import__("pytest").importorskip("transformers")
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore", module="transformers")

SIZES = dict(
    hidden_size=64,
    d_model=64,
    n_embd=64,
    n_embed=64,
    intermediate_size=128,
    ffn_dim=128,
    n_inner=128,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    expert_intermediate_size=32,
    num_hidden_layers=2,
    n_layer=2,
    n_layers=2,
    num_layers=2,
    decoder_layers=2,
    num_attention_heads=4,
    n_head=4,
    n_heads=4,
    decoder_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=128,
    n_positions=128,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    moe_num_experts=4,
    num_experts_per_tok=2,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    state_size=8,
    time_step_rank=8,
    conv_kernel=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)
EXTRA = {"cohere": {"use_qk_norm": True}}


def tiny_config(model_type: str):
    """The architecture's default config with every size small (2 layers, width 64, vocabulary 256)."""
    cfg = transformers.CONFIG_MAPPING[model_type]()
    text = cfg.get_text_config()
    for key, value in {**SIZES, **EXTRA.get(model_type, {})}.items():
        old = getattr(text, key, None) if key in dir(type(text)) or key in vars(text) else None
        if old is None or isinstance(old, bool) != isinstance(value, bool) or not isinstance(old, int):
            continue
        try:
            setattr(text, key, value)
        except (AttributeError, ValueError):
            pass
    for key in ("layer_types", "layers_block_type", "mlp_layer_types"):
        kinds = vars(text).get(key)
        if isinstance(kinds, list) and len(kinds) > text.num_hidden_layers:
            # keep one layer of each kind when the default interleaves several
            kept = list(dict.fromkeys(kinds))[: text.num_hidden_layers]
            try:
                setattr(text, key, kept + kinds[: text.num_hidden_layers - len(kept)])
            except (AttributeError, ValueError):
                pass
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        tok = getattr(text, key, None)
        if isinstance(tok, int) and tok >= text.vocab_size:
            setattr(text, key, 0)
    return cfg


def build(model_type: str, device: str = "cpu"):
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(tiny_config(model_type), dtype=torch.float32)


def tokens(model, T: int = 32) -> torch.Tensor:
    return torch.randint(
        0, model.config.get_text_config().vocab_size, (2, T), generator=torch.Generator().manual_seed(0)
    )


# Parameters a module measurement cannot reach, read from the modeling files: "in:<axes>" the axes
# contracted with the input (d_in = the product of their sizes), "own" an initialisation of its own that
# must not change, "value:<v>" the scale-1 value of a norm whose forward needs other inputs.
SOURCE_TABLE: dict[str, str] = {
    # fused experts: (E, out, in) applied with F.linear in most MoE files ...
    r"experts\.(gate_up_proj|gate_proj|up_proj|down_proj)$": "in:2",
    # state-space and linear-attention layers (Mamba, Mamba-2, gated delta nets): their own starts
    r"\.A_log$": "own",
    r"\.D$": "own",
    r"dt_bias$": "own",
    r"dt_proj\.bias$": "own",
    r"dt_proj\.weight$": "in:1",  # nn.Linear(time_step_rank, d_inner), called through its weight
    r"(mixer|mamba|linear_attn|conv)\.conv1d\.weight$|conv\.conv\.weight$": "in:1,2",  # depthwise: 1 × kernel
    r"\.sinks$": "own",  # learned attention-sink logits
    r"lambda_(q|k)[12]$": "own",  # DiffLlama's λ re-parametrisation
    r"self_attn\.A$": "own",  # Doge's dynamic-mask A
    r"act_fn\.alpha_(p|n)$": "own",  # xIELU's learned slopes (Apertus)
    r"z_L_init$|z_H_init$": "own",  # HRM's recurrent initial states
    r"lambda_[12]$": "own",  # Dory's residual mixing scalars
    r"linear_attn\.(o_)?norm\.weight$|mixer\.norm\.weight$": "value:1",  # gated RMSNorm: w·x̂·act(gate)
    r"residual_scale\.|input_hidden_states_(scale|bias)$|router_states_scale$|qk_norm\.temp$": "own",  # ZAYA's learned scales
    r"(input|post_attention)_residual$": "own",  # Doge's residual weights
    r"encoder_attn\.(q_proj|k_proj|v_proj|out_proj)\.weight$": "in:1",  # cross-attention, unused without an encoder
    r"encoder_attn_layer_norm\.weight$": "value:1",
    r"vision_embed_tokens\.weight$": "in:1",  # Fuyu's patch projection, unused on text
    r"decoder\.embed_positions\.weight$|biogpt\.embed_positions\.weight$": "in:1",  # learned positions (OPT, BioGPT)
}
# ... but (E, in, out) applied as x @ w[e] here (gpt_oss, llama4 and aria's expert classes)
ARCH_TABLE: dict[str, dict[str, str]] = {
    arch: {r"experts\.(gate_up_proj|down_proj)$": "in:1", r"feed_forward\.router\.weight$": "in:1"}
    for arch in ("gpt_oss", "llama4", "llama4_text", "aria_text")
}
ARCH_TABLE["pegasus"] = {r"embed_positions\.weight$": "own"}  # sinusoidal, computed and frozen


@dataclass
class Verdict:
    arch: str
    drawn: int = 0
    kept: int = 0
    wrong: list[str] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return getattr(out, "last_hidden_state", None)


def _call(mod, args, kwargs, x):
    return _first_tensor(mod(x, *args[1:], **kwargs))


def capture_inputs(model, ids) -> dict[str, tuple]:
    """The (args, kwargs) of the first call of every module that owns parameters, from one forward."""
    seen: dict[str, tuple] = {}
    hooks = []
    for name, mod in model.named_modules():
        if any(True for _ in mod.parameters(recurse=False)):

            def hook(m, args, kwargs, name=name):
                seen.setdefault(name, (args, kwargs))

            hooks.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _matches(table: dict[str, str], name: str) -> str | None:
    for pattern, want in table.items():
        if re.search(pattern, name):
            return want
    return None


@torch.no_grad()
def judge(arch: str, model, before: dict[str, torch.Tensor], report, gamma: float = 1.0) -> Verdict:
    """Each parameter against its measured expectation; ``wrong`` lists those that miss it."""
    verdict = Verdict(arch)
    rows = report.by_name()
    table = {**ARCH_TABLE.get(arch, {}), **SOURCE_TABLE}
    inputs = capture_inputs(model, tokens(model))
    g = torch.Generator().manual_seed(1)
    for mname, mod in model.named_modules():
        own = dict(mod.named_parameters(recurse=False))
        own = {n: p for n, p in own.items() if f"{mname}.{n}".lstrip(".") in rows}
        if not own:
            continue
        for n in own:
            row = rows[f"{mname}.{n}".lstrip(".")]
            verdict.drawn += row.rule == "normal"
            verdict.kept += row.rule == "kept"
        judged = set()

        def bad(n, why, mname=mname, judged=judged):
            verdict.wrong.append(f"{mname}.{n}: {why}")
            judged.add(n)

        for n, p in own.items():  # the architecture's own initialisations and fused experts
            full = f"{mname}.{n}"
            want = _matches(table, full)
            if want == "own":
                judged.add(n)
                if not torch.equal(p, before[full]):
                    bad(n, "has an initialisation of its own, changed")
            elif want is not None and want.startswith("value:"):
                judged.add(n)
                if not torch.all(p == float(want[6:])):
                    bad(n, f"want every entry {want[6:]} (scale 1 in its form, from the source)")
            elif want is not None and want.startswith("in:"):
                judged.add(n)
                d = math.prod(p.shape[int(a)] for a in want[3:].split(","))
                # a sample std of n draws is off by ~1/sqrt(2n): allow 4 of those, at least 10 %
                if abs(math.log(p.std().item() * d**gamma)) > max(
                    math.log(1.1), 4 / math.sqrt(2 * p.numel())
                ):
                    bad(n, f"std {p.std().item():.4g}, want {d**-gamma:.4g} (d_in {d} from the source)")
        for n, p in own.items():
            if n in judged or "bias" not in n:
                continue
            judged.add(n)
            if p.abs().max() > 0:
                bad(n, "bias not 0")
        if all(n in judged for n in own):
            continue
        if any(True for c in mod.children() for _ in c.parameters()):
            verdict.unmeasured += [f"{mname}.{n} (not a leaf module)" for n in own if n not in judged]
            continue
        if mname not in inputs:
            verdict.unmeasured += [f"{mname}.{n} (module not called)" for n in own if n not in judged]
            continue
        args, kwargs = inputs[mname]
        x0 = args[0] if args else None
        if not isinstance(x0, torch.Tensor):
            verdict.unmeasured += [f"{mname}.{n} (no tensor input)" for n in own if n not in judged]
            continue
        mats = [n for n, p in own.items() if n not in judged and p.dim() >= 2]
        rest = [n for n in own if n not in judged and n not in mats]
        if not x0.is_floating_point():  # a lookup table: rows of width d drawn with σ = d^(−γ)
            out = _call(mod, args, kwargs, x0)
            for n in mats:
                d = out.shape[-1]
                std = own[n].std().item()
                if abs(math.log(std * d**gamma)) > math.log(1.1):
                    bad(n, f"embedding std {std:.4g}, want {d**-gamma:.4g}")
                judged.add(n)
            verdict.unmeasured += [f"{mname}.{n}" for n in rest]
            continue
        alone = len(args) == 1 and not kwargs and x0.dim() >= 2
        batch = max(x0.shape[0], -(-65536 // max(1, x0[0].numel()))) if alone else x0.shape[0]
        x = torch.randn((batch, *x0.shape[1:]), generator=g)
        try:
            y1, y10 = _call(mod, args, kwargs, x), _call(mod, args, kwargs, 10 * x)
            y2, yneg = _call(mod, args, kwargs, 2 * x), _call(mod, args, kwargs, -x)
        except Exception as e:  # noqa: BLE001 - a module that cannot run alone is reported unmeasured
            verdict.unmeasured += [f"{mname}.{n} ({type(e).__name__})" for n in own if n not in judged]
            continue
        if y1 is None:
            verdict.unmeasured += [f"{mname}.{n} (no tensor output)" for n in own if n not in judged]
            continue
        scale = y1.pow(2).mean().sqrt()
        odd = yneg.shape == y1.shape and (yneg + y1).abs().max() <= 1e-3 * scale
        if odd and y10.shape == y1.shape and (y10 - y1).abs().max() <= 1e-3 * scale:
            # normalises: the norm must start at scale 1 (x̂ itself, for x ~ N(0, 1) mean square 1)
            ms = y1.pow(2).mean().item()
            if abs(math.log(ms)) > math.log(1.2):
                bad(",".join(rest + mats), f"norm output mean square {ms:.3g} at unit input, want 1")
            judged.update(rest + mats)
            continue
        linear = y2.shape == y1.shape and (y2 - 2 * y1).abs().max() <= 1e-4 * (scale + 1e-30)
        if len(mats) == 1 and linear:
            n = mats[0]
            gain = (y1.pow(2).mean() / x.pow(2).mean()).item()  # = d_in·σ²
            std = own[n].std().item()
            d_in = gain / std**2
            if abs(math.log(std * d_in**gamma)) > math.log(1.25):
                bad(
                    n,
                    f"std {std:.4g}, but its module's gain says d_in = {d_in:.1f} (want std {d_in**-gamma:.4g})",
                )
            judged.add(n)
            zero = _call(mod, args, kwargs, torch.zeros_like(x))
            if zero.abs().max() > 0:
                bad(",".join(rest) or n, "output at zero input is not 0 (a bias not zeroed)")
            judged.update(rest)
        verdict.unmeasured += [f"{mname}.{n}" for n in own if n not in judged]
    return verdict
