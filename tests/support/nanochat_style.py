"""A decoder of no library written as nanochat and modded-nanogpt write theirs: RMSNorm as a bare
``F.rms_norm(x, (x.size(-1),))`` (no weight, no ε: the dtype's default), QK-norm the same way, ReLU² MLPs,
output projections initialised to zero, an untied head. ``norm="hand"`` writes the norm out as
x·rsqrt(mean(x²) + 1e-6) instead; ``norm_eps`` passes an ε to F.rms_norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Config:
    def __init__(self, vocab=64, d=32, heads=4, layers=2, norm="functional", norm_eps=None):
        self.vocab, self.d, self.heads, self.layers = vocab, d, heads, layers
        self.norm, self.norm_eps = norm, norm_eps


def _norm(x: torch.Tensor, cfg: Config) -> torch.Tensor:
    if cfg.norm == "hand":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return F.rms_norm(x, (x.size(-1),), eps=cfg.norm_eps)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.c_q = nn.Linear(cfg.d, cfg.d, bias=False)
        self.c_k = nn.Linear(cfg.d, cfg.d, bias=False)
        self.c_v = nn.Linear(cfg.d, cfg.d, bias=False)
        self.c_proj = nn.Linear(cfg.d, cfg.d, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        H = self.cfg.heads
        q, k, v = (w(x).view(B, T, H, -1).transpose(1, 2) for w in (self.c_q, self.c_k, self.c_v))
        q, k = _norm(q, self.cfg), _norm(k, self.cfg)  # QK-norm
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d, 4 * cfg.d, bias=False)
        self.c_proj = nn.Linear(4 * cfg.d, cfg.d, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(self, x):
        x = x + self.attn(_norm(x, self.cfg))
        return x + self.mlp(_norm(x, self.cfg))


class GPT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.lm_head = nn.Linear(cfg.d, cfg.vocab, bias=False)
        self.init_weights()

    def init_weights(self):
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.zeros_(p)  # zero-init output projections
            elif name == "lm_head.weight":
                nn.init.normal_(p, std=0.001)
            else:
                nn.init.normal_(p, std=self.cfg.d**-0.5)

    def forward(self, idx):
        x = _norm(self.wte(idx), self.cfg)
        for block in self.h:
            x = block(x)
        return self.lm_head(_norm(x, self.cfg))
