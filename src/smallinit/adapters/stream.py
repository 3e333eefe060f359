"""The blocks the residual stream passes through, established from one forward of the model rather than
from its structure: a stack (ModuleList, ModuleDict or Sequential, of modules of any classes: an
attention/state-space hybrid's layers differ) whose modules each run once, in order, each taking the output of
the one before, of one shape. Among such chains the stream's is the one whose last output a norm outside it
takes (the final norm), and of those (or, where no norm takes any, of all) the one with the most parameters:
a stack of adapters after the final norm chains too but feeds the readout, and MoE experts never chain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from smallinit.adapters.hooks import first_tensor
from smallinit.adapters.protocol import norm_modules


@dataclass
class _Chain:
    """One stack followed through the forward: the next module expected, the last output, whether it broke."""

    name: str
    children: list[tuple[str, nn.Module]]
    next: int = 0
    last: torch.Tensor | None = None
    broken: bool = False
    final_norm: bool = False

    def enter(self, i: int, h: torch.Tensor | None) -> None:
        if i != self.next or h is None or (i > 0 and not _same(h, self.last)):
            self.broken = True

    def leave(self, i: int, out: Any) -> None:
        h = first_tensor(out if isinstance(out, (tuple, list)) else (out,), {})
        if self.broken or h is None or (self.last is not None and h.shape != self.last.shape):
            self.broken = True
            return
        self.next, self.last = i + 1, h.detach()

    @property
    def complete(self) -> bool:
        return not self.broken and self.next == len(self.children)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


def stacks(model: nn.Module) -> dict[str, list[tuple[str, nn.Module]]]:
    """Every non-empty ModuleList, ModuleDict and Sequential of ``model``, by name, with its children by name."""
    return {
        name: [(f"{name}.{n}" if name else n, c) for n, c in m.named_children()]
        for name, m in model.named_modules()
        if isinstance(m, (nn.ModuleList, nn.ModuleDict, nn.Sequential)) and len(m) > 0
    }


@torch.no_grad()
def residual_blocks(
    model: nn.Module, forward: Callable[[], Any]
) -> tuple[list[tuple[str, nn.Module]], str | None]:
    """The blocks the residual stream passes through in ``forward()`` (one forward of ``model``), by name;
    or none, and why, in one line."""
    chains = [_Chain(name, children) for name, children in stacks(model).items()]
    hooks = []
    for chain in chains:
        for i, (_, child) in enumerate(chain.children):
            hooks.append(
                child.register_forward_pre_hook(
                    lambda _m, a, kw, c=chain, i=i: c.enter(i, first_tensor(a, kw)), with_kwargs=True
                )
            )
            hooks.append(child.register_forward_hook(lambda _m, _a, out, c=chain, i=i: c.leave(i, out)))

    def norm_called(name: str, args: tuple, kwargs: dict) -> None:
        h = first_tensor(args, kwargs)
        for chain in chains:
            if chain.complete and not name.startswith(f"{chain.name}.") and _same(h, chain.last):
                chain.final_norm = True

    for name, norm in norm_modules(model).items():
        hooks.append(
            norm.register_forward_pre_hook(lambda _m, a, kw, n=name: norm_called(n, a, kw), with_kwargs=True)
        )
    try:
        forward()
    finally:
        for h in hooks:
            h.remove()
    complete = [c for c in chains if c.complete]
    if not complete:
        return [], (
            f"no stack of blocks in {type(model).__name__} through which the residual stream passes (a "
            "ModuleList, ModuleDict or Sequential whose modules each run once, in order, each on the output of "
            "the one before), so the residual stream cannot be observed"
        )
    best = max(
        complete, key=lambda c: (c.final_norm, sum(p.numel() for _, m in c.children for p in m.parameters()))
    )
    return best.children, None
