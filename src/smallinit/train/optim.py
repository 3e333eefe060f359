"""The optimizers (AdamW with decoupled weight decay, or Muon beside AdamW) and the learning-rate schedules.

``train.optimizer = "muon"`` splits the parameters as nanochat and modded-nanogpt do: torch's own
``torch.optim.Muon`` on the 2-d hidden matrices, AdamW on the embedding, the output head, norms, biases and the
attention gate W_θ (one logit per gated channel or head: a bank of gate vectors, not a map into the hidden
space). torch's Muon takes 2-d tensors only, so 3-d tensors (an MoE layer's fused experts) stay with AdamW;
the split says so for each.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from smallinit.config import TrainConfig
from smallinit.errors import ConfigError
from smallinit.init import is_norm
from smallinit.init.gate import GATE
from smallinit.init.roles import head_weights


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """Matrices decay; norms, biases and embeddings do not unless ``decay_norms_and_embeddings``."""
    decay, no_decay, seen = [], [], set()
    for _, mod in model.named_modules():
        for _, p in mod.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            exempt = p.dim() < 2 or is_norm(mod) or isinstance(mod, nn.Embedding)
            (no_decay if exempt and not cfg.decay_norms_and_embeddings else decay).append(p)
    return [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


MUON = "muon"
OPTIMIZER_FILE = "optimizer.json"  # in a run folder: optimizer_split, parameter name → "muon" | "adamw: why"


def optimizer_split(model: nn.Module, cfg: TrainConfig) -> dict[str, str]:
    """Which optimizer holds each trained parameter (tied ones once, under the first name): "muon", or
    "adamw: WHY" (with train.optimizer = "adamw", every parameter is "adamw")."""
    heads = head_weights(model)
    split: dict[str, str] = {}
    seen: set[int] = set()
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            name = f"{mname}.{pname}" if mname else pname
            split[name] = "adamw" if cfg.optimizer == "adamw" else _muon_or_why(mod, mname, p, heads)
    return split


def _muon_or_why(mod: nn.Module, mname: str, p: torch.Tensor, heads: set[int]) -> str:
    if isinstance(mod, nn.Embedding):
        return "adamw: embedding"
    if id(p) in heads:
        return "adamw: output head"
    if is_norm(mod):
        return "adamw: norm"
    if p.dim() < 2:
        return "adamw: bias" if p.dim() == 1 else "adamw: scalar"
    if mname.rpartition(".")[2] == GATE:
        return "adamw: attention gate"
    if p.dim() > 2:
        return f"adamw: {p.dim()}-d (torch.optim.Muon takes 2-d matrices only)"
    return MUON


def describe_split(split: dict[str, str]) -> str:
    """The split in one line: how many tensors Muon holds, and AdamW's by reason."""
    why: dict[str, int] = {}
    for v in split.values():
        if v != MUON:
            reason = v.partition(": ")[2]
            why[reason] = why.get(reason, 0) + 1
    rest = ", ".join(f"{n} {w}" for w, n in why.items())
    muon = len(split) - sum(why.values())
    return (
        f"optimizer: Muon on {muon} hidden matrices, AdamW on {sum(why.values())} ({rest}); {OPTIMIZER_FILE}"
    )


class MuonAdamW:
    """torch.optim.Muon on the hidden matrices and AdamW on the rest, stepped as one optimizer. Iterating it
    gives the two, which is how torch.distributed.checkpoint's state-dict helpers take several optimizers."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter((self.muon, self.adamw))

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self) -> dict:
        return {**self.muon.state, **self.adamw.state}

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)


def optimizers(optimizer) -> tuple[torch.optim.Optimizer, ...]:
    """The torch optimizers behind ``optimizer`` (an AdamW, or a MuonAdamW's two)."""
    return (optimizer,) if isinstance(optimizer, torch.optim.Optimizer) else tuple(optimizer)


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW | MuonAdamW:
    """AdamW over every parameter, or (train.optimizer = "muon") Muon and AdamW as ``optimizer_split`` says.
    A Muon group's ``lr_scale`` is muon_lr / lr, which ``set_lr`` keeps through the schedule."""
    if cfg.optimizer == "adamw":
        return _adamw(param_groups(model, cfg), cfg)
    split = optimizer_split(model, cfg)
    held = {id(p) for n, p in model.named_parameters() if split.get(n) == MUON}
    if not held:
        raise ConfigError(
            f"train.optimizer=muon: {type(model).__name__} has no 2-d hidden matrix for Muon to train; use adamw"
        )
    muon = torch.optim.Muon(
        [p for p in model.parameters() if id(p) in held],
        lr=cfg.muon_lr or cfg.lr,
        weight_decay=cfg.weight_decay,
        adjust_lr_fn=cfg.muon_adjust_lr,
    )
    muon.param_groups[0]["lr_scale"] = (cfg.muon_lr or cfg.lr) / cfg.lr
    rest = [{**g, "params": [p for p in g["params"] if id(p) not in held]} for g in param_groups(model, cfg)]
    return MuonAdamW(muon, _adamw(rest, cfg))


def _adamw(groups: list[dict], cfg: TrainConfig) -> torch.optim.AdamW:
    # The fused kernel (one pass per tensor) exists for CPU and CUDA; on the CPU it is several times faster than
    # the foreach path (benchmarks/README.md) and agrees with it to float rounding.
    fused = all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.adam_eps,
        fused=fused or None,
        foreach=None if fused else True,
    )


def steady_rms(model: nn.Module, optimizer, cfg: TrainConfig) -> dict[str, float]:
    """Parameter name → √(η/λ), its group's peak rate over its weight decay, for every parameter that decays:
    the RMS that decoupled weight decay drives a matrix's entries towards (up to a factor of the optimizer's
    update size), whatever the init. The Monitor records each matrix's RMS against it."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: math.sqrt(cfg.lr * group.get("lr_scale", 1.0) / group["weight_decay"])
        for opt in optimizers(optimizer)
        for group in opt.param_groups
        if group.get("weight_decay", 0.0) > 0
        for p in group["params"]
        if id(p) in names
    }


def equilibrium_step(cfg: TrainConfig, lr_scale: float = 1.0) -> int | None:
    """The first step by which the weight decay has multiplied the init's share of a matrix by 1/e: where
    Σ_s η_s·λ reaches 1, i.e. 1/(ηλ) steps at a constant rate η (the schedule's, times ``lr_scale``); None when
    training ends first (or λ = 0)."""
    total = 0.0
    for step in range(cfg.steps):
        total += lr_at(step, cfg) * lr_scale * cfg.weight_decay
        if total >= 1.0:
            return step + 1
    return None


def set_lr(optimizer, step: int, cfg: TrainConfig) -> float:
    """Set every group's learning rate for optimizer step ``step``; returns the schedule's (AdamW's) rate."""
    lr = lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return lr


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine / WSD / constant."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return peak
    if cfg.schedule == "cosine":
        span = max(1, cfg.steps - cfg.warmup_steps)
        t = min(1.0, (step - cfg.warmup_steps) / span)
        return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * t))
    # warmup-stable-decay: hold the peak, then decay linearly over the last decay_frac of steps
    decay_start = wsd_decay_start(cfg)
    if step < decay_start:
        return peak
    t = min(1.0, (step - decay_start + 1) / (cfg.steps - decay_start))
    return peak + (floor - peak) * t


def first_changed_lr(old: TrainConfig, new: TrainConfig, step: int) -> int | None:
    """The first of steps 0 … step − 1 that the two schedules give different learning rates (None: none)."""
    return next((s for s in range(step) if lr_at(s, old) != lr_at(s, new)), None)


def wsd_decay_start(cfg: TrainConfig) -> int:
    """The first step of a WSD schedule's decay; every step after warmup and before it is at the peak."""
    return cfg.steps - max(1, round(cfg.decay_frac * cfg.steps))
