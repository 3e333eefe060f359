"""AdamW with decoupled weight decay, and the learning-rate schedules."""

from __future__ import annotations

import math

import torch
from torch import nn

from smallinit.config import TrainConfig
from smallinit.init import is_norm


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


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # The fused kernel (one pass per tensor) exists for CPU and CUDA; on the CPU it is several times faster than
    # the foreach path (benchmarks/README.md) and agrees with it to float rounding.
    fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(
        param_groups(model, cfg),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.adam_eps,
        fused=fused or None,
        foreach=None if fused else True,
    )


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


def wsd_decay_start(cfg: TrainConfig) -> int:
    """The first step of a WSD schedule's decay; every step after warmup and before it is at the peak."""
    return cfg.steps - max(1, round(cfg.decay_frac * cfg.steps))
