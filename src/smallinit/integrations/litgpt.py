"""litgpt's models γ-initialised through litgpt's own initialisation hook.

    from smallinit.integrations.litgpt import initialize_weights

    with fabric.init_module(empty_init=...):
        model = GPT(config)
    initialize_weights(fabric, model, gamma=1.0)      # in place of litgpt.pretrain.initialize_weights

litgpt's pretraining initialises by giving every ``nn.Linear`` and ``nn.Embedding`` a ``reset_parameters``
and calling them (or, under Fabric's FSDP, letting Fabric call them as it materialises each module). Here
each is drawn by the γ rule instead, with d_in traced from the model's forward (``init_plan``); the draws
come from one seeded generator in ``model.modules()`` order, so the weights are those of
``gamma_init_(model, gamma, generator=torch.Generator().manual_seed(seed))``. The Monitor is called with the
step in the Fabric loop (docs/integrations.md).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from smallinit.errors import ModelError
from smallinit.init import InitReport, gamma_normal_, init_plan
from smallinit.integrations._engine import engine

_utils = engine("litgpt.utils", "litgpt", "smallinit.integrations.litgpt")
_strategies = engine("lightning.fabric.strategies", "litgpt", "smallinit.integrations.litgpt")


def initialize_weights(fabric: Any, model: nn.Module, gamma: float = 1.0, *, seed: int = 0) -> InitReport:
    """litgpt's ``initialize_weights(fabric, model, …)`` by the γ rule: every matrix ~ N(0, d_in^(−2γ)),
    biases 0; norms keep their own reset (scale 1). Returns what is drawn (works on the meta device)."""
    report = hook_reset_parameters(model, gamma, seed=seed)
    if not isinstance(fabric.strategy, _strategies.FSDPStrategy):  # FSDP calls them as it materialises
        _utils.reset_parameters(model)
    return report


def hook_reset_parameters(model: nn.Module, gamma: float = 1.0, *, seed: int = 0) -> InitReport:
    """Give every ``nn.Linear`` and ``nn.Embedding`` a ``reset_parameters`` that draws it by the γ rule, for
    whatever calls them: litgpt's ``reset_parameters(model)``, or FSDP (Fabric's, or torch's FSDP1) as it
    materialises a model built on meta."""
    report = init_plan(model, gamma)
    rows = report.by_name()
    generator = torch.Generator().manual_seed(seed)
    hooked = set()
    for name, module in model.named_modules():
        row = rows.get(f"{name}.weight" if name else "weight")
        if isinstance(module, (nn.Linear, nn.Embedding)) and row is not None and row.rule == "normal":
            module.reset_parameters = partial(_draw, module, gamma, row.fan_in, generator)
            hooked.add(row.name)
    missed = [r.name for r in report.rows if r.rule == "normal" and r.name not in hooked]
    if missed:
        raise ModelError(
            f"{len(missed)} matrices (first: {missed[0]}) are held by no nn.Linear or nn.Embedding, so "
            "litgpt's reset_parameters hook cannot draw them: call smallinit.gamma_init_(model, ...) after "
            "the model is materialised instead"
        )
    return report


@torch.no_grad()
def _draw(module: nn.Module, gamma: float, fan_in: int, generator: torch.Generator) -> None:
    gamma_normal_(module.weight, gamma, fan_in, generator=generator)
    if getattr(module, "bias", None) is not None:
        module.bias.zero_()
    if getattr(module, "undrawn", None) is not None:  # smallinit's gate, added on meta: drawn now
        module.undrawn = None
