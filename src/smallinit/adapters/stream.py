"""The blocks the residual stream passes through, established from one forward of the model rather than
from its structure: a run of consecutive modules of a stack (ModuleList, ModuleDict or Sequential, of modules of
any classes: an attention/state-space hybrid's layers differ) that each run once, in order, each taking the
output of the one before and giving one of the same shape. The run is the whole stack, or two or more of its
modules where others do not map the stream to itself: a pipeline-style Sequential's embedding, norm and readout
around its blocks (a norm, or a module with no parameters such as dropout, is never a block). Among such runs
the stream's is the one whose last output a norm outside its blocks takes (the final norm), and of those (or,
where no norm takes any, of all) the one with the most parameters: a stack of adapters after the final norm
chains too but feeds the readout, and MoE experts never chain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from smallinit.adapters.hooks import first_tensor
from smallinit.adapters.protocol import norm_modules


@dataclass
class _Run:
    """Consecutive children start … end − 1 of one stack, each on the output of the one before."""

    start: int
    end: int
    last: torch.Tensor
    final_norm: bool = False


@dataclass
class _Chain:
    """One stack followed through the forward: its runs so far (one of a single child is dropped when the next
    starts, so that MoE experts keep no outputs alive), per child entered its input's shape and whether it took
    the open run's last output, and whether a child ran twice (then none of its runs is the stream's)."""

    name: str
    children: list[tuple[str, nn.Module]]
    passive: set[int]  # the children that are norm layers or hold no parameters (dropout): never a block
    runs: list[_Run] = field(default_factory=list)
    entered: dict[int, tuple[torch.Size, bool] | None] = field(default_factory=dict)
    broken: bool = False

    def enter(self, i: int, h: torch.Tensor | None) -> None:
        if i in self.entered:
            self.broken = True
        run = self.runs[-1] if self.runs else None
        follows = run is not None and run.end == i and _same(h, run.last)
        self.entered[i] = None if h is None else (h.shape, follows)

    def leave(self, i: int, out: Any) -> None:
        h = first_tensor(out if isinstance(out, (tuple, list)) else (out,), {})
        seen = self.entered.get(i)
        if self.broken or h is None or seen is None or h.shape != seen[0] or i in self.passive:
            return
        if seen[1]:
            self.runs[-1].end, self.runs[-1].last = i + 1, h.detach()
            return
        if self.runs and self.runs[-1].end - self.runs[-1].start < 2:
            self.runs.pop()
        self.runs.append(_Run(i, i + 1, h.detach()))

    def blocks(self) -> list[tuple[_Run, list[tuple[str, nn.Module]]]]:
        """The runs that may be the stream's: the whole stack, or two or more of its children."""
        if self.broken:
            return []
        n = len(self.children)
        return [
            (r, self.children[r.start : r.end])
            for r in self.runs
            if r.end - r.start >= 2 or (r.start, r.end) == (0, n)
        ]


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
    norms = norm_modules(model)
    chains = [
        _Chain(
            name,
            children,
            {i for i, (n, c) in enumerate(children) if n in norms or next(c.parameters(), None) is None},
        )
        for name, children in stacks(model).items()
    ]
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
            for run in chain.runs:
                inside = any(name.startswith(f"{n}.") for n, _ in chain.children[run.start : run.end])
                if not inside and _same(h, run.last):
                    run.final_norm = True

    for name, norm in norms.items():
        hooks.append(
            norm.register_forward_pre_hook(lambda _m, a, kw, n=name: norm_called(n, a, kw), with_kwargs=True)
        )
    try:
        forward()
    finally:
        for h in hooks:
            h.remove()
    runs = [found for chain in chains for found in chain.blocks()]
    if not runs:
        return [], (
            f"no stack of blocks in {type(model).__name__} through which the residual stream passes (a "
            "ModuleList, ModuleDict or Sequential whose modules each run once, in order, each on the output of "
            "the one before), so the residual stream cannot be observed"
        )
    _, best = max(
        runs,
        key=lambda found: (found[0].final_norm, sum(p.numel() for _, m in found[1] for p in m.parameters())),
    )
    return best, None
