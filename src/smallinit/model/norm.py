"""RMSNorm with an explicit ε, statistics in fp32.

y = x · rsqrt(mean(x²) + ε) · w. With small init, mean(x²) ≈ d^(−2γ) can sit far below ε = 1e-5, and then
the factor saturates at ε^(−1/2) and stops seeing the input scale; the paper's fix is ε = 1e-12.
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)
