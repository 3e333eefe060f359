"""Mean next-token cross-entropy over the vocabulary, with one vocabulary-sized buffer in backward.

For logits z (N × V) and targets t:  loss = mean_i (logsumexp(z_i) − z_i[t_i]),
∂loss/∂z_i = (softmax(z_i) − onehot(t_i)) / N.

``F.cross_entropy`` keeps the fp32 log-probabilities (N × V) alive from forward to backward, and its backward
fills two more N × V buffers (the gradient of the log-probabilities, zero but for the targets, then the
result). Here backward recomputes softmax from the logits, which the caller holds anyway, straight into the
gradient it returns. The statistics are fp32 whatever the logits' dtype, as in ``F.cross_entropy(z.float())``,
but under bf16 no fp32 copy of the logits outlives the forward pass.
"""

from __future__ import annotations

import torch


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(logits.device.type, enabled=False):  # the dtype argument decides, not autocast
            logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        ctx.save_for_backward(logits, targets)
        return -logp.gather(-1, targets.unsqueeze(-1)).mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, targets = ctx.saved_tensors
        scale = grad / logits.shape[0]
        g = torch.softmax(logits, dim=-1, dtype=torch.float32).mul_(scale)
        g[torch.arange(len(targets), device=g.device), targets] -= scale
        return g.to(logits.dtype), None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (N, V) against integer ``targets`` (N,), as a 0-dim fp32 tensor."""
    return _CrossEntropy.apply(logits, targets)
