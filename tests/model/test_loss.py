"""The model's cross-entropy against torch.nn.functional.cross_entropy: value and gradient, fp32 and bf16."""

import pytest
import torch
import torch.nn.functional as F

from smallinit import ModelConfig, Transformer
from smallinit.model.loss import cross_entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_cross_entropy(dtype):
    gen = torch.Generator().manual_seed(0)
    z = (torch.randn(37, 101, generator=gen) * 4).to(dtype)
    t = torch.randint(0, 101, (37,), generator=gen)
    a, b = z.clone().requires_grad_(), z.clone().requires_grad_()
    ours, ref = cross_entropy(a, t), F.cross_entropy(b.float(), t)
    (ours * 3).backward()  # a non-unit upstream gradient
    (ref * 3).backward()
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)
    assert a.grad.dtype == dtype
    tol = 1e-7 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(a.grad, b.grad, atol=tol, rtol=0)


def test_under_cpu_autocast_and_in_the_model():
    cfg = ModelConfig.preset("cpu-1m", vocab_size=97, max_seq_len=32)
    model = Transformer(cfg, seed=0)
    x = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    out = model(x, y)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.flatten(0, 1), y.flatten()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, y)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.float().flatten(0, 1), y.flatten()))
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
