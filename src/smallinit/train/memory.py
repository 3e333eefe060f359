"""How much memory one GPU needs to train a model: weights, gradients, optimizer state, activations.

An estimate from the shapes, per GPU, in bytes (P = parameters, N = ranks, a = bytes of an activation
element: 2 under bf16, 4 in fp32; per token of the micro-batch, per layer):

    DDP:    weights 4P + gradients 4P + optimizer state O, and under bf16 autocast a 2P copy of the weights;
            O = 8P under AdamW (two moments), 8·(P − P_muon) + 4·P_muon under train.optimizer = "muon" (Muon
            keeps one momentum buffer for the P_muon parameters of the hidden matrices it holds)
    FSDP:   (4P + 4P + O) / N, plus the gathered fp32 parameters in flight, 4·(P_root + 2·P_block) (the
            root stays gathered; one block computes while the next is fetched), plus one unsharded gradient
            in compute precision and in fp32 for the reduce-scatter, (a + 4)·max(P_root, P_block), and
            under bf16 autocast the same 2P of bf16 weight copies as DDP (each matmul keeps its cast weight
            for backward: the price of computing what one process computes, docs/distributed.md)
    saved activations, per token and layer:  24·d + a·(3d + 2·d_kv + [2·g + d] + 4·f)
        24·d: the fp32 input, normalised input and output of the two RMSNorms (4 bytes × 6d);
        3d + 2·d_kv: q, k, v after RoPE, the attention output and the output projection's input;
        2·g + d with a gate: its logits and sigmoid (g = d elementwise, n_heads headwise) and the gated
        output; 4·f: SwiGLU's gate, up, silu and product (MoE: k·(4·d_expert + 2·d) for the k routed
        experts, their gathered tokens and their outputs for the weighted sum, and under autocast k·d
        more, the gathered tokens cast once for gate and once for up;
        8·E + 4·k + 8 bytes for the router's fp32 scores, top-k weights and their sums, 24·k for the int64
        top-k indices and the sort order; plus a shared expert's 4·d_expert)
    with activation checkpointing only each block's input is kept (4·d per layer), and the block being
    recomputed in backward holds its activations again (one layer's worth, counted as in flight);
    the head, per token: 12·d (final norm) + a·V (the logits, which the loss keeps instead of fp32
    log-probabilities), and in backward the loss's fp32 V-sized gradient, plus its cast to bf16 under
    autocast (4·V or 6·V, in flight).

Checked against the tensors autograd really saves (CPU, fp32 and under bf16 autocast): within 6 %
(tests/train/test_memory.py).

It ignores the CUDA context and allocator fragmentation (budget ~1-2 GiB per GPU more) and fused
attention's per-row statistics. ``smallinit info --memory`` prints it for a config, and the trainer refuses,
before writing anything, a config whose estimate exceeds the device's whole memory (``check_fits``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from smallinit.config import PRESETS, Config, ModelConfig, TrainConfig
from smallinit.errors import ConfigError
from smallinit.model import Transformer
from smallinit.train.optim import MUON, optimizer_split

GIB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU; ``total`` is their sum."""

    params: int
    weights: float
    grads: float
    optimizer: float
    activations: float  # saved for backward
    in_flight: float  # gathered parameters, weight copies under autocast, gradient buffers of the head

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.in_flight


def _period(cfg: ModelConfig) -> int:
    """Layers after which the block layout repeats (MoE blocks come every moe.every_n_layers)."""
    return min(cfg.n_layers, cfg.moe.every_n_layers if cfg.moe else 1)


def _over_layers(cfg: ModelConfig, per_period: list[float]) -> float:
    """Sum of a per-layer quantity over all layers, from its values over one period."""
    whole, rest = divmod(cfg.n_layers, len(per_period))
    return whole * sum(per_period) + sum(per_period[:rest])


def _shapes(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """Total, largest-block and root (embedding, final norm, head) parameter counts, and the parameters Muon
    would hold (train.optimizer = "muon"), from a meta model of one period of layers, so that a deep config is as
    quick to estimate as a shallow one."""
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(cfg, n_layers=_period(cfg)), init=False)
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    root = model.num_params() - sum(blocks)
    split = optimizer_split(model, TrainConfig(optimizer=MUON))
    params = dict(model.named_parameters())
    held = [
        sum(params[n].numel() for n, how in split.items() if how == MUON and n.startswith(f"blocks.{i}."))
        for i in range(len(blocks))
    ]
    muon = sum(p.numel() for n, p in params.items() if split.get(n) == MUON) - sum(held)  # the root's
    return root + int(_over_layers(cfg, blocks)), max(blocks), root, muon + int(_over_layers(cfg, held))


def layer_bytes_per_token(cfg: ModelConfig, act_bytes: int) -> list[float]:
    """Bytes each layer of one period saves for backward per token of the micro-batch (without checkpointing)."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    g = {"none": 0, "headwise": cfg.n_heads, "elementwise": d}[cfg.gate]
    gated_out = d if cfg.gate != "none" else 0

    def mlp(layer: int) -> float:
        m = cfg.moe
        if m is None or layer % m.every_n_layers != m.every_n_layers - 1:
            return 4 * cfg.d_ff * act_bytes
        de, k = m.d_expert or cfg.d_ff, m.top_k
        shared = 4 * de * act_bytes if m.shared_expert else 0
        casts = d if act_bytes < 4 else 0  # under autocast gate and up each cast the gathered tokens
        routing = 8 * m.num_experts + 4 * k + 8 + 24 * k  # fp32 scores, top-k weights, sums; int64 indices
        return k * (4 * de + 2 * d + casts) * act_bytes + routing + shared

    return [24 * d + act_bytes * (3 * d + 2 * kv + 2 * g + gated_out) + mlp(i) for i in range(_period(cfg))]


def activation_bytes_per_token(
    cfg: ModelConfig, act_bytes: int, *, activation_checkpointing: bool = False
) -> float:
    """Bytes saved for backward per token of the micro-batch: all layers (or only their inputs) and the head."""
    head = 12 * cfg.d_model + act_bytes * cfg.vocab_size
    if activation_checkpointing:
        return 4 * cfg.d_model * cfg.n_layers + head
    return _over_layers(cfg, layer_bytes_per_token(cfg, act_bytes)) + head


def estimate_memory(
    cfg: ModelConfig,
    *,
    micro_batch: int,
    seq_len: int,
    world_size: int = 1,
    parallel: str = "ddp",
    precision: str = "bf16",
    activation_checkpointing: bool = False,
    optimizer: str = "adamw",
) -> MemoryEstimate:
    """Per-GPU training memory for micro-batches of ``micro_batch`` sequences of ``seq_len`` tokens, trained with
    ``optimizer`` (train.optimizer)."""
    if parallel not in ("none", "ddp", "fsdp"):
        raise ValueError(f"parallel must be none, ddp or fsdp, got {parallel!r}")
    a = 2 if precision == "bf16" else 4
    P, p_block, p_root, p_muon = _shapes(cfg)
    state = 8 * P - 4 * p_muon if optimizer == MUON else 8 * P
    tokens = micro_batch * seq_len
    acts = tokens * activation_bytes_per_token(cfg, a, activation_checkpointing=activation_checkpointing)
    flight = tokens * (6 if a == 2 else 4) * cfg.vocab_size  # the loss's fp32 gradient (+ its bf16 cast)
    if activation_checkpointing:  # the block being recomputed holds its activations again
        flight += tokens * max(layer_bytes_per_token(cfg, a))
    cast = 2 * P if a == 2 else 0
    if parallel == "fsdp" and world_size > 1:
        n = world_size
        gathered = 4 * (p_root + 2 * p_block) + (a + 4) * max(p_root, p_block)
        return MemoryEstimate(P, 4 * P / n, 4 * P / n, state / n, acts, gathered + cast + flight)
    return MemoryEstimate(P, 4 * P, 4 * P, state, acts, cast + flight)


def format_estimates(rows: list[tuple[str, MemoryEstimate]]) -> str:
    """A table in GiB: one row per (label, estimate)."""
    head = f"{'layout':<28} {'params':>8} {'weights':>8} {'grads':>8} {'optim.':>8} {'activ.':>8} {'flight':>8} {'total':>8}"
    lines = [head, "-" * len(head)]
    for label, e in rows:
        cells = (e.weights, e.grads, e.optimizer, e.activations, e.in_flight, e.total)
        lines.append(f"{label:<28} {e.params / 1e9:>7.3f}B " + " ".join(f"{c / GIB:>8.2f}" for c in cells))
    return "\n".join(lines)


def memory_table(*, micro_batch: int = 4, seq_len: int = 2048, gpus: int = 8) -> str:
    """Every preset on ``gpus`` GPUs in bf16 (the table in docs/distributed.md), in GiB per GPU."""
    head = f"{'preset':<16} {'params':>8} {'DDP':>8} {'FSDP':>8} {'FSDP+AC':>8} {'act/seq':>8} {'act/seq AC':>10}"
    lines = [
        f"per GPU, GiB: bf16, micro-batch {micro_batch} × {seq_len} tokens, FSDP over {gpus} GPUs",
        head,
        "-" * len(head),
    ]
    for name in PRESETS:
        cfg = ModelConfig.preset(name)
        seq = min(seq_len, cfg.max_seq_len)
        ddp = estimate_memory(cfg, micro_batch=micro_batch, seq_len=seq, parallel="ddp")
        fsdp = estimate_memory(cfg, micro_batch=micro_batch, seq_len=seq, world_size=gpus, parallel="fsdp")
        ac = estimate_memory(
            cfg,
            micro_batch=micro_batch,
            seq_len=seq,
            world_size=gpus,
            parallel="fsdp",
            activation_checkpointing=True,
        )
        per_seq, per_seq_ac = ddp.activations / micro_batch, ac.activations / micro_batch
        lines.append(
            f"{name:<16} {ddp.params / 1e9:>7.3f}B {ddp.total / GIB:>8.2f} {fsdp.total / GIB:>8.2f} "
            f"{ac.total / GIB:>8.2f} {per_seq / GIB:>8.2f} {per_seq_ac / GIB:>10.2f}"
        )
    return "\n".join(lines)


def describe_memory(cfg: Config, gpus: int = 1) -> str:
    """The estimate for a resolved config on ``gpus`` GPUs (``smallinit info --memory``), as a table."""
    tc = cfg.train
    if gpus < 1:
        raise ConfigError(f"--num-devices must be ≥ 1, got {gpus}")
    if tc.batch_size % (gpus * tc.grad_accum):
        raise ConfigError(
            f"train.batch_size={tc.batch_size} does not divide into {gpus} GPUs × "
            f"train.grad_accum={tc.grad_accum} micro-batches; change one of them"
        )
    micro = tc.batch_size // (gpus * tc.grad_accum)
    precision = "fp32" if tc.precision == "fp32" else "bf16"
    common = dict(
        micro_batch=micro,
        seq_len=cfg.data.seq_len,
        world_size=gpus,
        precision=precision,
        optimizer=tc.optimizer,
    )
    layouts = (
        [("ddp", tc.activation_checkpointing)]
        if gpus == 1
        else [("ddp", tc.activation_checkpointing), ("fsdp", tc.activation_checkpointing)]
    )
    if not tc.activation_checkpointing:
        layouts.append((layouts[-1][0], True))
    rows = []
    for parallel, ac in layouts:
        label = ("one GPU" if gpus == 1 else f"{parallel} × {gpus}") + (" + act. ckpt" if ac else "")
        rows.append(
            (label, estimate_memory(cfg.model, parallel=parallel, activation_checkpointing=ac, **common))
        )
    return (
        f"memory per GPU (GiB, estimate): {precision}, {tc.optimizer}, micro-batch {micro} × {cfg.data.seq_len} tokens "
        f"(train.batch_size {tc.batch_size} / {gpus} GPUs / grad_accum {tc.grad_accum})\n"
        + format_estimates(rows)
    )


def device_memory(device: torch.device) -> int:
    """Bytes of memory a process can use on ``device``: the GPU's total, or RAM within the cgroup's limit."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):  # a container's limit (cgroup v2); "max" means none
        total = min(total, int(Path("/sys/fs/cgroup/memory.max").read_text()))
    return total


def check_fits(cfg: Config, device: torch.device, world_size: int, amp_dtype: torch.dtype | None) -> None:
    """Refuse a config that cannot train here at all: its estimate exceeds the device's whole memory.

    Only the impossible is refused (an estimate under the total may still not fit next to other processes).
    """
    tc = cfg.train
    micro = tc.batch_size // (world_size * tc.grad_accum)
    est = estimate_memory(
        cfg.model,
        micro_batch=micro,
        seq_len=cfg.data.seq_len,
        world_size=world_size,
        parallel=tc.parallel,
        precision="bf16" if amp_dtype is not None else "fp32",
        activation_checkpointing=tc.activation_checkpointing,
        optimizer=tc.optimizer,
    )
    have = device_memory(device)
    if est.total <= have:
        return
    where = "GPU" if device.type == "cuda" else "machine"
    state = est.weights + est.grads + est.optimizer
    if state > have:
        raise ConfigError(
            f"the model's weights, gradients and optimizer state alone need ≈ {state / GIB:,.1f} GiB per {where} "
            f"({est.params:,} parameters) but this {where} has {have / GIB:,.1f} GiB; choose a smaller model "
            "(or train.parallel=fsdp over more GPUs)"
        )
    raise ConfigError(
        f"training needs ≈ {est.total / GIB:,.1f} GiB per {where} (of which activations for {micro:,} × "
        f"{cfg.data.seq_len} tokens per micro-batch ≈ {(est.activations + est.in_flight) / GIB:,.1f} GiB) but this "
        f"{where} has {have / GIB:,.1f} GiB; lower train.batch_size or data.seq_len, raise train.grad_accum, or set "
        "train.activation_checkpointing=true (smallinit info --memory shows the estimate)"
    )
