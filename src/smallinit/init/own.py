"""Parameters with an initialisation of their own, on a model whose architecture has not initialised them.

γ-init keeps what an architecture initialises in its own way (Mamba's A_log and D, attention-sink logits).
A Hugging Face model built on the meta device skips its initialisation (transformers marks each module it
has initialised with ``_is_hf_initialized``; ``from_config`` and ``from_pretrained`` mark all of them), so
after ``to_empty`` those parameters, and the buffers (rotary tables), hold whatever memory held. They get
the architecture's own initialisation, as transformers runs it (``initialize_weights``: ``_init_weights``
on every module not yet initialised); the γ rule is applied after it, so the parameters it sets do not
depend on this step.
"""

from __future__ import annotations

import torch
from torch import nn

from smallinit.errors import ConfigError


class OwnInitError(ConfigError):
    """A parameter with an initialisation of its own holds no values, and its architecture's init cannot give
    them."""


def uninitialised(model: nn.Module) -> set[str]:
    """The parameters of modules a Hugging Face model's own initialisation has not run on (all of them
    after building on the meta device); none for other models, where nothing says whether values were set."""
    if not callable(getattr(model, "initialize_weights", None)) or not hasattr(model, "_init_weights"):
        return set()
    return {
        f"{m}.{p}" if m else p
        for m, mod in model.named_modules()
        if not getattr(mod, "_is_hf_initialized", False)
        for p, _ in mod.named_parameters(recurse=False, remove_duplicate=False)
    }


@torch.no_grad()
def own_buffers_(model: nn.Module) -> list[str]:
    """On a sharded model, where the architecture's init cannot run on the parameters: the modules not yet
    initialised that hold buffers and no parameters (rotary tables; buffers are never sharded) get it. Their
    names."""
    done = []
    for name, m in model.named_modules():
        if (
            not getattr(m, "_is_hf_initialized", False)
            and next(m.buffers(recurse=False), None) is not None
            and next(m.parameters(recurse=False), None) is None
        ):
            model._init_weights(m)
            done.append(name)
    return done


@torch.no_grad()
def own_init_(model: nn.Module, names: list[str], generator: torch.Generator | None = None) -> None:
    """Run the architecture's own initialisation on the modules not yet initialised (their buffers too, such
    as rotary tables), for ``names`` (parameters γ-init keeps); refuse, in one line, those it does not set
    or cannot set (a sharded parameter)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    sharded = [n for n in names if type(params[n]).__name__ == "DTensor"]
    if sharded:
        raise OwnInitError(
            f"{len(sharded)} parameters with an initialisation of their own (first: {sharded[0]}) hold no values "
            "and are sharded, where the architecture's init cannot run: shard after gamma_init_, or build them "
            "on the CPU"
        )
    floats = [n for n in names if params[n].is_floating_point()]
    for n in floats:  # NaN marks what the architecture's init leaves unset
        params[n].fill_(float("nan"))
    try:
        with torch.random.fork_rng(devices=[]):  # its random draws (Mamba's dt bias) follow the caller's seed
            if generator is not None:
                torch.manual_seed(generator.initial_seed())
            model.initialize_weights()
    except Exception as e:
        what = (
            f"{len(names)} parameters with an initialisation of their own (first: {names[0]})"
            if names
            else "the buffers"
        )
        raise OwnInitError(
            f"built on the meta device, {what} hold no values, and the architecture's init failed "
            f"({type(e).__name__}: {str(e).splitlines()[0][:100]})"
        ) from None
    unset = [n for n in floats if params[n].isnan().any()]
    if unset:
        raise OwnInitError(
            f"{len(unset)} parameters with an initialisation of their own (first: {unset[0]}) hold no values and "
            f"{type(model).__name__}._init_weights does not set them: build the model on the CPU, or set them "
            "yourself and mark their modules initialised (module._is_hf_initialized = True)"
        )
