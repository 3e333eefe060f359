"""One forward observed from outside through module hooks, for adapters that read a model they do not own
(hf.py, traced.py): each block's input and the last block's output (the residual stream), every norm's
input and its factor read off its own forward, and the attention calls a recorder catches. Nothing stays
on the model afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection

import torch
from torch import nn

from smallinit.adapters.protocol import AttentionInputs, Observed, norm_modules, realised_factor
from smallinit.errors import ModelError

# a recorder of attention calls: given the list to append to and the list of one-line problems, a context
Recorder = Callable[[list[AttentionInputs], list[str]], contextlib.AbstractContextManager]


def observe_by_hooks(
    module: nn.Module,
    blocks: list[tuple[str, nn.Module]],
    no_blocks: str | None,
    kinds: Collection[str],
    forward: Callable[[], torch.Tensor],
    recording: Recorder | None,
) -> tuple[Observed, list[str]]:
    """``forward()`` (returning the logits) run once with hooks for ``kinds``; the attention calls that
    ``recording`` catches, and the lines of those it could not rebuild from q and k."""
    seen: list[tuple[str, tuple, dict]] = []  # (module name, its args, its kwargs) in call order
    attention: list[AttentionInputs] = []
    problems: list[str] = []
    watched = dict(blocks) if "residual" in kinds else {}
    norms = norm_modules(module) if kinds & {"norms", "residual"} else {}
    last: dict[str, torch.Tensor] = {}  # the last block's output
    out = Observed(logits=torch.empty(0))
    with contextlib.ExitStack() as stack:
        for name, m in {**watched, **norms}.items():
            hook = m.register_forward_pre_hook(_keep_call(name, seen), with_kwargs=True)
            stack.callback(hook.remove)
        if watched:
            hook = blocks[-1][1].register_forward_hook(_keep_output(last))
            stack.callback(hook.remove)
        # each norm's factor, read inside the forward (a sharded model's weights are whole)
        if "norms" in kinds:
            for name, m in norms.items():
                hook = m.register_forward_hook(_read_factor(name, out), with_kwargs=True)
                stack.callback(hook.remove)
        if "attention" in kinds and recording is not None:
            stack.enter_context(recording(attention, problems))
        out.logits = forward()
    if "residual" in kinds:
        if no_blocks:
            out.missing["residual"] = no_blocks
        else:
            _residual(type(module).__name__, out, [n for n, _ in blocks], seen, set(norms), last.get("h"))
    if "norms" in kinds:
        for name, args, kwargs in seen:
            if name in norms:  # a norm called more than once contributes all its rows
                h = first_tensor(args, kwargs)
                prev = out.norm_inputs.get(name)
                out.norm_inputs[name] = (
                    h if prev is None else torch.cat([prev.flatten(0, -2), h.flatten(0, -2)])
                )
    out.attention = attention
    return out, problems


def _residual(
    model: str,
    out: Observed,
    names: list[str],
    seen: list[tuple[str, tuple, dict]],
    norms: set[str],
    last: torch.Tensor | None,
) -> None:
    """e = the first block's input, then each later block's input, then h_L: the final norm's input (the
    norm that takes the last block's output), or where the model has none, the last block's output."""
    inputs = [
        (i, name, first_tensor(args, kwargs)) for i, (name, args, kwargs) in enumerate(seen) if name in names
    ]
    if [name for _, name, _ in inputs] != names or last is None:
        out.missing["residual"] = (
            f"the decoder layers of {model} did not each run once in order (a recurrent "
            "or looped architecture), so there is no single h_L"
        )
        return
    after, inside = inputs[-1][0], tuple(f"{b}." for b in names)
    final = [
        first_tensor(args, kwargs)
        for i, (name, args, kwargs) in enumerate(seen)
        if i > after and name in norms and not name.startswith(inside)
    ]
    final = [h for h in final if h.shape == last.shape and torch.equal(h, last)]
    if not final:
        out.notes["residual"] = (
            f"h_L is the last layer's output: no norm module of {model} takes it after the last layer"
        )
    residual = [h for _, _, h in inputs] + [final[0] if final else last]
    if residual[0].shape != residual[-1].shape:
        out.missing["residual"] = (
            f"{model}'s first layer input {tuple(residual[0].shape)} and h_L "
            f"{tuple(residual[-1].shape)} differ in shape, so ‖h_L − e‖/‖e‖ is undefined"
        )
        return
    out.residual = residual


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The tensor a module is called on: its first argument, or the keyword a block or norm names it by."""
    if args:
        h = args[0]
    else:
        h = next((kwargs[k] for k in ("hidden_states", "x", "h", "input") if k in kwargs), None)
    return h if isinstance(h, torch.Tensor) else None


def _keep_call(name: str, seen: list[tuple[str, tuple, dict]]):
    def hook(_module, args, kwargs):
        if isinstance(first_tensor(args, kwargs), torch.Tensor):
            detach = lambda v: v.detach() if isinstance(v, torch.Tensor) else v  # noqa: E731
            seen.append((name, tuple(detach(a) for a in args), {k: detach(v) for k, v in kwargs.items()}))

    return hook


def _read_factor(name: str, out: Observed):
    def hook(module, args, kwargs, output):
        if f"norms:{name}" in out.missing or first_tensor(args, kwargs) is None:
            return
        try:
            f = realised_factor(module, args, kwargs, output)
        except (ModelError, RuntimeError, TypeError, ValueError) as e:  # that norm alone is not measured
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            out.missing[f"norms:{name}"] = first
            out.norm_factors.pop(name, None)
            return
        prev = out.norm_factors.get(name)
        out.norm_factors[name] = f if prev is None else torch.cat([prev, f])

    return hook


def _keep_output(last: dict[str, torch.Tensor]):
    def hook(_module, _args, output):
        h = (
            output
            if isinstance(output, torch.Tensor)
            else output[0]
            if isinstance(output, (tuple, list))
            else None
        )
        if isinstance(h, torch.Tensor):
            last["h"] = h.detach()

    return hook
