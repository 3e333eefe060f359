"""Parameters an architecture initialises in a way of its own, read from the architecture itself.

A Hugging Face model says how each of its parameters starts in ``_init_weights``. Run with every
initialiser replaced by a recorder (and every in-place write to a parameter blocked), it tells which
parameters get something other than a random draw or 0 — a copy of computed values (Mamba's A_log and
dt bias), ones, a constant, an identity. For a bias or a lookup table that is a start of its own, kept
under γ-init (a norm weight at 1 or a matrix's own scheme is not).
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

DRAWS = {
    "normal_",
    "trunc_normal_",
    "uniform_",
    "kaiming_normal_",
    "kaiming_uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "lecun_normal_",
    "default_flax_embed_init_",
    "orthogonal_",
    "sparse_",
}


class _BlockWrites(TorchDispatchMode):
    """In-place writes to the watched storages are recorded and skipped."""

    def __init__(self, storages: dict[int, str], seen: dict[str, str]):
        super().__init__()
        self.storages, self.seen = storages, seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable and func.__name__.split(".")[0] not in DRAWS:  # a draw is not a start
            for arg, a in zip(func._schema.arguments, args):
                if (
                    arg.alias_info is not None
                    and arg.alias_info.is_write
                    and isinstance(a, torch.Tensor)
                    and a.untyped_storage()._cdata in self.storages
                ):
                    self.seen.setdefault(
                        self.storages[a.untyped_storage()._cdata], f"in-place {func.__name__}"
                    )
                    return a
        return func(*args, **kwargs)


def architecture_inits(model: nn.Module) -> dict[str, str]:
    """Name → how the architecture initialises it, for the parameters whose start is its own (empty for
    models that do not declare their initialisation). Runs on meta stand-ins of the parameters: no value
    is read or written, so a model on the CPU, on meta or sharded gives the same answer."""
    init_weights = getattr(model, "_init_weights", None)
    hf_init = sys.modules.get("transformers.initialization")
    # only a Hugging Face model's _init_weights declares starts this way (litgpt's, say, is a plain draw)
    transformers = sys.modules.get("transformers")
    if not callable(init_weights) or hf_init is None or not isinstance(model, transformers.PreTrainedModel):
        return {}
    stand_ins: dict[int, nn.Parameter] = {}
    names: dict[int, str] = {}  # id of a stand-in → the parameter's name (ties: the first)
    swapped = []
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in stand_ins:
                stand_ins[id(p)] = nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=p.requires_grad
                )
            names.setdefault(id(stand_ins[id(p)]), f"{mname}.{pname}" if mname else pname)
            swapped.append((mod, pname, p))
            mod._parameters[pname] = stand_ins[id(p)]
    storages = {p.untyped_storage()._cdata: names[id(p)] for p in stand_ins.values()}
    seen: dict[str, str] = {}

    def recorder(fname):
        def record(tensor, *args, **kwargs):
            name = names.get(id(tensor))
            if name is None:
                return tensor
            value = args[0] if args else kwargs.get("val")
            if fname in DRAWS or fname == "zeros_" or (fname == "constant_" and value == 0):
                return tensor
            seen.setdefault(
                name,
                f"constant_({value:g})"
                if fname == "constant_" and isinstance(value, (int, float))
                else fname,
            )
            return tensor

        return record

    patched = {
        f: getattr(hf_init, f)
        for f in dir(hf_init)
        if f.endswith("_") and not f.startswith("_") and callable(getattr(hf_init, f))
    }
    try:
        for f in patched:
            setattr(hf_init, f, recorder(f))
        with torch.no_grad(), _BlockWrites(storages, seen):
            for mod in model.modules():
                try:
                    init_weights(mod)
                except Exception:  # an init that needs what this build lacks: nothing declared for it
                    continue
    finally:
        for f, fn in patched.items():
            setattr(hf_init, f, fn)
        for mod, pname, p in swapped:
            mod._parameters[pname] = p
    return seen
