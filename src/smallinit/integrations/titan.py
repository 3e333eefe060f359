"""torchtitan's models γ-initialised by torchtitan's own init, and measured along its training.

    from smallinit.integrations.titan import gamma_param_init

    model_config = llama3_configs["debugmodel"]()
    gamma_param_init(model_config, gamma=1.0, seed=0)     # before build(): init_states now draws by γ
    with torch.device("meta"):
        model = model_config.build()
    ...                                                   # fully_shard, to_empty
    model.init_weights()                                  # torchtitan's init: every matrix by the γ rule

torchtitan initialises through its config tree: every module's ``param_init`` maps a parameter name to a
function of the parameter, which ``Module.init_states`` (``init_weights``) calls after ``to_empty``.
``gamma_param_init`` wraps each of those functions: a matrix (≥ 2 dimensions) is drawn from
N(0, d_in^(−2γ)) with d_in its last dimension (what a ``Linear`` contracts with its input, an embedding's
width), norm weights and biases keep torchtitan's own init (1 and 0, as the γ rule sets them). The draws
come from one seeded generator in the order ``init_states`` visits the parameters; each is the full tensor,
of which a sharded (DTensor) parameter keeps its shard, so every parallel layout gets the same weights; a
weight torchtitan skips (tied to another) stays skipped.

``gamma_init_(model, …)`` after ``init_weights()`` is the other way (roles traced from the forward); the
Monitor is called with the step in the training loop on every rank (docs/integrations.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from smallinit.init import gamma_normal_
from smallinit.integrations._engine import engine

_module = engine("torchtitan.protocols.module", "titan", "smallinit.integrations.titan")
_param_init = engine("torchtitan.models.common.param_init", "titan", "smallinit.integrations.titan")


def gamma_param_init(model_config: Any, gamma: float = 1.0, *, seed: int = 0) -> Any:
    """Make torchtitan's own init draw every matrix of ``model_config``'s model by the γ rule (in place;
    returns the config). Call before ``build()``; ``init_weights()`` / ``init_states()`` then draw."""
    generator = torch.Generator().manual_seed(seed)
    for _, config, _, _ in model_config.traverse(_module.Module.Config, recurse=True):
        if config.param_init:
            config.param_init = {
                name: _gamma_or(own, gamma, generator) for name, own in config.param_init.items()
            }
    return model_config


def _gamma_or(own: Callable, gamma: float, generator: torch.Generator) -> Callable:
    if own is _param_init.skip_param_init:  # a tied weight: its other module draws it
        return own

    def init(param: torch.Tensor) -> None:
        if param.dim() >= 2:
            gamma_normal_(param, gamma, generator=generator)
        else:
            own(param)

    return init
