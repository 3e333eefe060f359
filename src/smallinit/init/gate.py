"""The paper's attention output gate added in place to an existing model (Qiu et al. 2025, position G1).

Each head's attention output Y is multiplied by σ(X W_θ) before the output projection, X being the input of
the query projection (the normed hidden state in pre-norm blocks): "elementwise" gives one gate per channel
(W_θ: d_model → heads · head_dim), "headwise" one per head (d_model → heads). The sigmoid is taken in fp32.
W_θ is a child module ``g_proj`` of the attention block, so it trains, shards and saves like any weight; two
forward pre-hooks apply it, one on the query projection (which keeps X) and one on the output projection
(which gates its input), so the architecture's own forward is not edited. W_θ is drawn with σ = d_model^(−γ).

An attention block is a module with a query projection and an output projection among its children (the names
Hugging Face's families, multi-head latent attention's q_a_proj and GPT-2's Conv1D use, torchtitan's
qkv_linear/wo, OLMo-core's w_q/w_out, litgpt's qkv/proj); one forward on example inputs checks that a softmax
runs between the two, so linear attention and state-space mixers are left ungated, said, and that no sigmoid
already gates it (Qwen3-Next's attention is kept as it is, said).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from smallinit.errors import ConfigError
from smallinit.init.draw import _check_gamma, gamma_normal_
from smallinit.init.roles import _example_inputs, _is_hf_conv1d

KINDS = ("elementwise", "headwise")
QUERY = (
    "q_proj",
    "q_a_proj",  # multi-head latent attention's low-rank query (DeepSeek-V2/V3, MiniCPM3, Kimi): X is its input
    "wq_a",  # the same in torchtitan's DeepSeek-V3 (q_lora_rank > 0, as its 236B and 671B flavors)
    "qkv_proj",
    "qkv",
    "c_attn",
    "query_key_value",
    "Wqkv",
    "wqkv",
    "qkv_linear",
    "wq",
    "w_q",
    "att_proj",
)
OUTPUT = ("o_proj", "c_proj", "out_proj", "dense", "wo", "w_out", "attn_out", "proj")
HEADS = ("num_heads", "num_attention_heads", "n_heads", "n_head")
SOFTMAX = ("softmax", "scaled_dot_product_attention", "flex_attention")
GATE = "g_proj"


class GateError(ConfigError):
    """The gate cannot be added: no softmax attention, an output projection not found, a gate already there."""


class AttentionGate(nn.Linear):
    """W_θ of one attention block, and the two hooks that apply it: X kept at the query projection, the
    output projection's input multiplied by σ(X W_θ) (per channel, or per head broadcast over its channels)."""

    def __init__(
        self, d_model: int, n_heads: int, head_dim: int, kind: str, gamma: float, *, device=None, dtype=None
    ):
        out = n_heads * (head_dim if kind == "elementwise" else 1)
        super().__init__(d_model, out, bias=False, device=device, dtype=dtype)
        self.kind, self.n_heads, self.head_dim, self.gamma = kind, n_heads, head_dim, gamma
        self._x: torch.Tensor | None = None
        # created on the meta device: drawn when its block's own init runs (_DeferredDraws), by its own
        # reset_parameters, by gamma_init_, or loaded; until then its memory is whatever to_empty left, and a
        # forward is refused
        self.undrawn: str | None = None
        self.deferred: _DeferredDraws | None = None
        self._register_load_state_dict_pre_hook(self._loaded)

    def reset_parameters(self) -> None:
        """W_θ ~ N(0, d_model^(−2γ)), not nn.Linear's default: materialising a meta model calls every module's
        reset_parameters (FSDP1's and Lightning Fabric's default), which must draw the gate by its rule. A gate
        added on meta draws from its add's generator, in block order, as an add on materialised weights does."""
        if not hasattr(self, "gamma"):  # nn.Linear.__init__ calls it before the gate's fields exist
            return super().reset_parameters()
        if self.deferred is not None and self.undrawn is not None:
            self.deferred.draw(self)
            return
        with torch.no_grad():
            gamma_normal_(self.weight, self.gamma, self.in_features)

    def _loaded(self, state_dict, prefix, *_args) -> None:
        if f"{prefix}weight" in state_dict:
            self.undrawn = None

    def keep_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.undrawn is not None:
            raise GateError(self.undrawn)
        self._x = args[0] if args else next(iter(kwargs.values()))

    def gate_input(self, module: nn.Module, args: tuple, kwargs: dict):
        y = args[0] if args else next(iter(kwargs.values()))
        x, self._x = self._x, None
        if x is None:
            raise RuntimeError(
                "the attention gate saw the output projection called before the query projection"
            )
        g = torch.sigmoid(F.linear(x, self.weight).float()).to(y.dtype)
        if self.kind == "headwise":
            g = g.repeat_interleave(self.head_dim, dim=-1)
        if args:
            return (y * g, *args[1:]), kwargs
        return args, {**kwargs, next(iter(kwargs)): y * g}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kind={self.kind}"


INITS = ("init_states", "init_weights", "reset_parameters")  # a block's own init (torchtitan's first)


class _DeferredDraws:
    """The gates created on the meta device, drawn in block order from one copy of the generator (the
    numbers an add on materialised weights draws) when each block's own init runs after ``to_empty``: its
    ``init_states`` (torchtitan's ``init_weights()`` calls each block's), ``init_weights`` or
    ``reset_parameters``, wrapped on the block. A block with none of them leaves its gate to gamma_init_."""

    def __init__(self, gamma: float, generator: torch.Generator | None):
        self.gamma, self.gates = gamma, []
        self.generator = torch.Generator()
        self.generator.set_state((generator or torch.default_generator).get_state())

    def add(self, name: str, block: nn.Module, gate: AttentionGate) -> None:
        self.gates.append(gate)
        gate.deferred = self
        init = next((m for m in INITS if callable(getattr(block, m, None))), None)
        how = f"{name}.{init}() runs" if init else f"{name}.{GATE}.reset_parameters() runs"
        gate.undrawn = (
            f"the attention gate {name}.{GATE} was added on the meta device and is not drawn yet (its memory is "
            f"what to_empty left): it is drawn when {how} after to_empty, or call gamma_init_ on the model"
        )
        if init is not None:
            setattr(block, init, _ThenDraw(getattr(type(block), init), block, self, gate))

    def draw(self, upto: AttentionGate) -> None:
        """Draw every gate up to ``upto`` not drawn yet, in order, so the numbers follow the blocks' order."""
        for gate in self.gates[: self.gates.index(upto) + 1]:
            if gate.undrawn is not None and not gate.weight.is_meta:
                with torch.no_grad():
                    gamma_normal_(gate.weight, self.gamma, gate.in_features, generator=self.generator)
                gate.undrawn = None


class _ThenDraw:
    """A block's own init method, followed by the draw of its gate (an object, so deepcopy keeps it bound)."""

    def __init__(self, method, block: nn.Module, draws: _DeferredDraws, gate: AttentionGate):
        self.method, self.block, self.draws, self.gate = method, block, draws, gate

    def __call__(self, *args, **kwargs):
        out = self.method(self.block, *args, **kwargs)
        self.draws.draw(self.gate)
        return out


@dataclass
class GateReport:
    """What add_attention_gate_ did: one line per attention block gated, kept as it was, or left ungated."""

    kind: str
    gamma: float
    gated: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # blocks with a gate of their own
    ungated: list[str] = field(default_factory=list)  # not softmax attention
    notes: list[str] = field(default_factory=list)
    params: int = 0  # parameters added
    blocks: list[str] = field(default_factory=list)  # the gated blocks' names

    def __str__(self) -> str:
        head = (
            f"attention gate ({self.kind}, W_θ σ = d_model^(−{self.gamma:g})): {len(self.gated)} blocks gated"
        )
        lines = [f"{head}, {self.params:,} parameters added"]
        lines += [f"  gated  {line}" for line in self.gated]
        lines += [f"  kept   {line}" for line in self.kept]
        lines += [f"  not gated  {line}" for line in self.ungated]
        return "\n".join(lines + self.notes)


def _size_in(module: nn.Module) -> int | None:
    """The input width of a projection: nn.Linear's in_features, GPT-2's Conv1D's rows."""
    if isinstance(module, nn.Linear):
        return module.in_features
    if _is_hf_conv1d(module):
        return int(module.weight.shape[0])
    # a container of projections that all read X (torchtitan's qkv_linear holding wqkv): their common width
    widths = {m.in_features for m in module.modules() if isinstance(m, nn.Linear)}
    return widths.pop() if len(widths) == 1 else None


def _child(module: nn.Module, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if isinstance(getattr(module, n, None), nn.Module)), None)


def _heads(attn: nn.Module, width: int) -> tuple[int, int] | None:
    """(heads, head_dim) of an attention block whose output projection reads ``width`` channels."""
    config = getattr(attn, "config", None)
    heads = next((getattr(attn, a) for a in HEADS if isinstance(getattr(attn, a, None), int)), None)
    if heads is None:
        heads = next((getattr(config, a) for a in HEADS if isinstance(getattr(config, a, None), int)), None)
    if not heads:
        return None
    head_dim = getattr(attn, "head_dim", None)
    head_dim = head_dim if isinstance(head_dim, int) else width // heads
    return (heads, head_dim) if heads * head_dim == width else None


class _Calls(TorchFunctionMode):
    """Records, in order, each softmax (or fused attention) and each sigmoid called."""

    def __init__(self, events: list):
        super().__init__()
        self.events = events

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SOFTMAX or name == "sigmoid":
            self.events.append("sigmoid" if name == "sigmoid" else "softmax")
        return func(*args, **(kwargs or {}))


NO_SOFTMAX, SOFTMAX_ONLY, GATED = 0, 1, 2  # what runs between a block's query and output projection


def _between(model: nn.Module, blocks: dict[str, tuple[str, str]], example_inputs) -> dict[str, int] | None:
    """For each block, what runs between its query and its output projection in one forward: no softmax, a
    softmax (or SDPA), or a softmax then a sigmoid (an output gate of the architecture's own, as Qwen3-Next's).
    None when no forward could be run (no example inputs, or weights on the meta device)."""
    if any(p.is_meta for p in model.parameters()):
        return None
    inputs = _example_inputs(model, example_inputs)
    if inputs is None:
        return None
    events: list = []
    hooks = []
    for name, (q, o) in blocks.items():
        attn = model.get_submodule(name)
        for proj, mark in ((q, "q"), (o, "o")):
            hooks.append(
                getattr(attn, proj).register_forward_pre_hook(
                    lambda m, a, name=name, mark=mark: events.append((mark, name))
                )
            )
    try:
        with torch.no_grad(), _Calls(events):
            model(*inputs[0], **inputs[1])
    except Exception:  # a forward that needs what the dummy inputs lack: the structure alone decides
        return None
    finally:
        for h in hooks:
            h.remove()
    seen = {name: NO_SOFTMAX for name in blocks}
    open_: dict[str, int] = {}  # blocks between their query and output projection → what ran so far
    for e in events:
        if e == "softmax":
            open_ = {n: max(v, SOFTMAX_ONLY) for n, v in open_.items()}
        elif e == "sigmoid":
            open_ = {n: GATED if v else v for n, v in open_.items()}
        elif e[0] == "q":
            open_[e[1]] = NO_SOFTMAX
        elif e[1] in open_:
            seen[e[1]] = max(seen[e[1]], open_.pop(e[1]))
    return seen


def gate_attention_(
    model: nn.Module,
    kind: str = "elementwise",
    gamma: float = 1.0,
    *,
    generator: torch.Generator | None = None,
    example_inputs=None,
    blocks: list[str] | None = None,
) -> GateReport:
    """Add the output gate σ(X W_θ) to every softmax-attention block of ``model``, in place; W_θ ~ N(0,
    d_model^(−2γ)) from ``generator``. Returns what was gated, kept (a gate of its own) and left ungated.

    Raises GateError, leaving the model unchanged, for an unknown kind, a model already gated, an attention
    block whose output projection or head layout cannot be found, and a model with no softmax attention.
    ``example_inputs`` (a Hugging Face model's dummy inputs when not given) run one forward that checks each
    block's softmax; ``blocks`` names the blocks to gate instead (a saved model's, rebuilt before its weights
    are loaded). On the meta device W_θ is created and not drawn."""
    if kind not in KINDS:
        raise GateError(f"attention gate kind must be one of {', '.join(KINDS)}, got {kind!r}")
    _check_gamma(gamma)
    report = GateReport(kind, gamma)
    found: dict[str, tuple[str, str]] = {}
    layout: dict[str, tuple[int, int, int]] = {}
    for name, mod in model.named_modules():
        q = _child(mod, QUERY)
        if isinstance(getattr(mod, GATE, None), AttentionGate):
            raise GateError(f"{name or 'the model'} already has smallinit's attention gate: add it once")
        own = getattr(mod, "gate", None)
        if q is not None and isinstance(own, str) and own in (*KINDS, "none"):  # smallinit's own attention
            if own == "none":
                raise GateError(
                    f"{name}: smallinit's model takes its gate from its config (saved with its checkpoints); "
                    f"build it with model.gate={kind}"
                )
            report.kept.append(f"{name}: smallinit's own {own} gate, nothing added")
            continue
        if q is None or "attention" not in type(mod).__name__.lower() and _child(mod, OUTPUT) is None:
            continue
        o = _child(mod, OUTPUT)
        d_model, width = _size_in(getattr(mod, q)), _size_in(getattr(mod, o)) if o else None
        if o is None or d_model is None or width is None:
            what = f"{q}" if d_model is None else f"{o or 'output projection'}"
            raise GateError(
                f"{name} ({type(mod).__name__}): its {what} is not an nn.Linear or Conv1D among "
                f"{', '.join(OUTPUT) if o is None else 'its children'}, so the gate has no place; "
                "the model is unchanged"
            )
        heads = _heads(mod, width)
        if heads is None:
            raise GateError(
                f"{name} ({type(mod).__name__}): its head count is not an attribute "
                f"({', '.join(HEADS)}) that divides the {width} channels its {o} reads; the model is unchanged"
            )
        found[name] = (q, o)
        layout[name] = (d_model, *heads)
    if blocks is not None:
        missing = sorted(set(blocks) - set(found))
        if missing:
            raise GateError(
                f"{missing[0]} is not an attention block of {type(model).__name__}: nothing gated"
            )
        found = {n: found[n] for n in blocks}
    between = _between(model, found, example_inputs) if blocks is None and found else None
    if between is not None:
        for name, what in between.items():
            if what == SOFTMAX_ONLY:
                continue
            q, o = found.pop(name)
            cls = type(model.get_submodule(name)).__name__
            if what == GATED:
                report.kept.append(f"{name} ({cls}): a sigmoid gates its attention before {o}, nothing added")
            else:
                report.ungated.append(
                    f"{name} ({cls}): no softmax between {q} and {o}, not softmax attention"
                )
    elif blocks is None and found:
        report.notes.append("softmax not checked: no forward could be run (pass example_inputs)")
    if not found and not report.kept:
        why = (
            report.ungated[0]
            if report.ungated
            # attention named otherwise (BERT's query, output.dense)
            else (
                f"no module holds both a query projection ({', '.join(QUERY[:3])}…) and an output projection "
                f"({', '.join(OUTPUT[:3])}…) among its children"
            )
        )
        raise GateError(
            f"{type(model).__name__} has no softmax attention to gate: {why}; the model is unchanged"
        )
    deferred = _DeferredDraws(gamma, generator)
    for name, (q, o) in found.items():
        attn = model.get_submodule(name)
        d_model, n_heads, head_dim = layout[name]
        ref = getattr(attn, o).weight
        gate = AttentionGate(d_model, n_heads, head_dim, kind, gamma, device=ref.device, dtype=ref.dtype)
        if not ref.is_meta:
            gamma_normal_(gate.weight, gamma, d_model, generator=generator)
        elif blocks is None:  # a saved model's blocks are rebuilt to be loaded; any other gate is drawn later
            deferred.add(name, attn, gate)
        attn.register_module(GATE, gate)
        getattr(attn, q).register_forward_pre_hook(gate.keep_input, with_kwargs=True)
        getattr(attn, o).register_forward_pre_hook(gate.gate_input, with_kwargs=True)
        report.params += gate.weight.numel()
        report.blocks.append(name)
        report.gated.append(
            f"{name}.{GATE}: {d_model} → {gate.out_features} ({n_heads} heads × {head_dim}), "
            f"X = input of {q}, gates the input of {o}"
        )
    return report
