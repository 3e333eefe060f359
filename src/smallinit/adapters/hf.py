"""The adapter for Hugging Face causal LMs, whatever attention backend the model was loaded with.

Everything is observed from outside the ordinary forward, and nothing of it stays afterwards; what a model
does not have is named in ``Observed.missing`` (one line each), so the rest is still measured:

* the residual stream from forward pre-hooks: each decoder layer's input (the classes the architecture
  declares in ``_no_split_modules``), and h_L: the final norm's input (the norm that takes the last layer's
  output; Hugging Face's last hidden state is that norm's *output*), or where no norm takes it (OpenAI-GPT,
  post-norm BERTs), the last layer's output, with a note;
* every norm's input from a pre-hook, and its factor from a forward hook that re-runs the norm on the
  same call (protocol.realised_factor), so an ε the module does not expose, a 2-D per-head weight or a
  gated norm's gate are what the forward makes of them;
* every softmax attention call through transformers' attention interface: while observing,
  ``AttentionInterface.get_interface`` hands out the model's own backend (eager, sdpa, flash, ...) wrapped
  in a recorder that keeps the query and key (after position encoding), the mask, scale, sliding window,
  logit soft-cap and learned sinks it is called with, then calls the backend unchanged. Attention outside
  the interface (Falcon, RoFormer, Bloom …) or with a position bias is read instead from the probabilities
  the eager path returns (output_attentions, a second forward); a model that has neither (state-space,
  linear attention) has no sink score;
* the parts of a fused q/k/v matrix (sources.py), followed from its product to the attention on the first
  observation of attention, so the Monitor records each part as the modeling source splits it.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Collection, Iterator
from typing import Any

import torch
from torch import nn

from smallinit.adapters.eager import EagerMasks
from smallinit.adapters.hooks import observe_by_hooks
from smallinit.adapters.protocol import AttentionInputs, NormForm, Observed, check_kinds, readable_norm_forms
from smallinit.adapters.sources import Following, Sources, run_eagerly
from smallinit.errors import ModelError
from smallinit.model.loss import cross_entropy

# the oldest transformers smallinit reads: the whole suite passes on 5.23.0 (.ci/run runs the Hugging Face tests on
# it); 5.0.0 fails 61 tests (its AttentionInterface has no get_interface), 5.10.1 9, 5.20.0 4
OLDEST_TRANSFORMERS = (5, 23)


def transformers_too_old(version: str) -> str | None:
    """One line saying what to do when transformers ``version`` is older than OLDEST_TRANSFORMERS, else None."""
    if tuple(int(n) for n in re.findall(r"\d+", version)[:2]) >= OLDEST_TRANSFORMERS:
        return None
    oldest = ".".join(map(str, OLDEST_TRANSFORMERS))
    return (
        f"transformers {version} is older than {oldest}, the oldest smallinit reads; "
        f"pip install 'transformers>={oldest}'"
    )


def is_hf_causal_lm(model: Any) -> bool:
    """A transformers PreTrainedModel (without importing transformers when it is not loaded)."""
    return any(
        c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
        for c in type(model).__mro__
    )


class HFAdapter:
    def __init__(self, model: nn.Module):
        version = getattr(sys.modules.get("transformers"), "__version__", None)
        if version is not None and (why := transformers_too_old(version)):
            raise ModelError(why)
        self.module = model
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size = int(config.vocab_size)
        try:
            self.blocks, self.no_blocks = decoder_layers(model, _layer_count(config)), None
        except ModelError as e:  # the residual stream cannot be observed; everything else still can
            self.blocks, self.no_blocks = [], str(e)
        self.no_attention: str | None = None  # once a model returned no probabilities, it is not asked again
        # the rows of each fused q/k/v matrix that make each part, learnt on the first observation of attention
        # (following them keeps the forward's products alive)
        self.parts: dict[str, dict[str, torch.Tensor]] | None = None
        self.unsplit: set[str] = set()  # fused matrices whose parts could not be told apart

    def norms(self) -> dict[str, NormForm]:
        """The form of each norm whose ε and form can be read (observe() names the others when asked)."""
        return readable_norm_forms(self.module)[0]

    def observe(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, kinds: Collection[str] = ()
    ) -> Observed:
        kinds = check_kinds(kinds)
        sources = Sources(self.module, following=self.parts is None and "attention" in kinds)

        @contextlib.contextmanager
        def recording(attention: list[AttentionInputs], problems: list[str]) -> Iterator[None]:
            with contextlib.ExitStack() as stack:
                stack.enter_context(recording_attention(self.module, attention, problems, sources))
                if sources.following:  # compiled regions run as written: a kernel hides its products
                    stack.enter_context(run_eagerly())
                    stack.enter_context(Following(sources))
                yield

        out, problems = observe_by_hooks(
            self.module,
            self.blocks,
            self.no_blocks,
            kinds,
            lambda: self.module(input_ids=tokens, use_cache=False).logits,
            recording,
        )
        if sources.following:
            self.parts = sources.parts
            self.unsplit = sources.unsplit - set(sources.parts)
        if targets is not None:
            out.loss = cross_entropy(out.logits.flatten(0, 1), targets.flatten())
        if "attention" in kinds and (problems or not out.attention):
            # attention outside the interface, or not rebuildable: its probabilities
            attention, why = (
                ([], self.no_attention) if self.no_attention else self._eager_probabilities(tokens, problems)
            )
            if why:
                out.missing["attention"] = why
            else:
                out.notes["attention"] = "read from eager attention probabilities (output_attentions): " + (
                    problems[0]
                    if problems
                    else f"{type(self.module).__name__} makes no call to transformers' attention interface"
                )
            out.attention = attention
        return out

    def _eager_probabilities(
        self, tokens: torch.Tensor, problems: list[str]
    ) -> tuple[list[AttentionInputs], str]:
        """The attention probabilities the model returns with output_attentions on its eager path, one record
        per softmax layer with the keys each query may see read off the scores it was taken over, or why there are
        none."""
        model, config = type(self.module).__name__, self.module.config
        why = problems[0] if problems else f"{model} makes no call to transformers' attention interface"
        backend = getattr(config, "_attn_implementation", None)
        try:
            config._attn_implementation = "eager"
            with EagerMasks(tokens.shape[-1]) as seen:
                probs = getattr(
                    self.module(input_ids=tokens, use_cache=False, output_attentions=True), "attentions", None
                )
        except (TypeError, ValueError, RuntimeError, AttributeError, NotImplementedError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return (
                [],
                f"no softmax attention observed: {why}, and its eager path failed ({type(e).__name__}: {first})",
            )
        finally:
            config._attn_implementation = backend
        names = [name for name, _ in self.blocks]
        named = [
            (names[i] if len(probs or ()) == len(names) else f"attentions[{i}]", p)
            for i, p in enumerate(probs or ())
            if isinstance(p, torch.Tensor) and p.dim() == 4
        ]
        if not named:
            self.no_attention = (
                f"no softmax attention: {why}, and returns no attention probabilities "
                "(state-space or linear-attention layers have none)"
            )
            return [], self.no_attention
        masks = seen.masks
        if len(masks) != len(named) or any(m.shape[:-1] != p.shape[:-1] for m, (_, p) in zip(masks, named)):
            # which keys a query may see is read off its scores, never its weights
            return [], (
                f"no softmax attention observed: {why}, and its eager path's {len(named)} attention "
                f"probabilities came from {len(masks)} softmaxes over (batch, heads, T, S) scores, so which "
                "keys each query may see cannot be read"
            )
        return [
            AttentionInputs(name=n, probs=p.detach(), mask=m[..., : p.shape[-1]])
            for (n, p), m in zip(named, masks)
        ], ""


def decoder_layers(model: nn.Module, n_layers: int | None) -> list[tuple[str, nn.Module]]:
    """The decoder layers, by name: the modules of the classes the model declares unsplittable
    (``_no_split_modules``), else the children of the ModuleList with one entry per layer."""
    declared = set(getattr(model, "_no_split_modules", None) or ())
    layers = [(n, m) for n, m in model.named_modules() if type(m).__name__ in declared]
    if layers and (n_layers is None or len(layers) == n_layers):
        return layers
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) == n_layers:
            return [(f"{name}.{i}", block) for i, block in enumerate(m)]
    raise ModelError(
        f"cannot find the {n_layers} decoder layers of {type(model).__name__}, so the residual stream "
        "cannot be observed; adapt the model yourself (docs/analysis.md, 'Your own model')"
    )


def _layer_count(config) -> int | None:
    """The number of decoder layers: ``decoder_layers`` where the config has it (an encoder–decoder family's
    decoder-only model, whose ``num_hidden_layers`` counts the encoder's), else ``num_hidden_layers``."""
    for key in ("decoder_layers", "num_hidden_layers"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


@contextlib.contextmanager
def recording_attention(
    model: nn.Module,
    records: list[AttentionInputs],
    problems: list[str] | None = None,
    sources: Sources | None = None,
) -> Iterator[None]:
    """While inside, every attention call of ``model``'s modules is recorded in ``records`` on its way to
    the backend the model was loaded with; other models' calls pass untouched. A call that cannot be
    rebuilt from q and k (a position bias, a flex-attention mask) raises, or with ``problems`` is said there
    and the forward goes on. With ``sources``, each call's q, k and v are handed to it here, where they are
    whatever kernel runs next (flash, flex or a registered one hides them from a torch function mode)."""
    from transformers import AttentionInterface

    names = {id(m): n for n, m in model.named_modules()}
    original = AttentionInterface.__dict__["get_interface"]

    def get_interface(self, implementation, default):
        backend = original(self, implementation, default)

        def recorded(module, query, key, value, *args, **kwargs):
            if id(module) in names:
                if sources is not None:
                    sources.attention_inputs(query, key, value)
                try:
                    records.append(_attention_inputs(names[id(module)], module, query, key, args, kwargs))
                except ModelError as e:
                    if problems is None:
                        raise
                    problems.append(str(e))
            return backend(module, query, key, value, *args, **kwargs)

        return recorded

    AttentionInterface.get_interface = get_interface
    try:
        yield
    finally:
        AttentionInterface.get_interface = original


def _attention_inputs(
    name: str, module: nn.Module, q: torch.Tensor, k: torch.Tensor, args: tuple, kwargs: dict
) -> AttentionInputs:
    mask = args[0] if args else kwargs.get("attention_mask")
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise ModelError(
            f"{name}: attention masks of type {type(mask).__name__} (flex attention) cannot be read; "
            "load the model with attn_implementation='sdpa' or 'eager' to measure it"
        )
    if kwargs.get("position_bias") is not None:
        raise ModelError(f"{name}: attention with a position bias cannot be rebuilt from q and k")
    window = kwargs.get("sliding_window")
    T, S = q.shape[-2], k.shape[-2]
    if mask is not None and mask.dim() == 2:  # flash attention's key padding mask (B, S): 1 = a real token
        keys = torch.arange(S, device=q.device)
        queries = torch.arange(S - T, S, device=q.device)[:, None]
        allowed = keys <= queries
        if window is not None:
            allowed = allowed & (queries - keys < window)
        mask, window = allowed & mask.bool()[:, None, None, :], None
    elif mask is not None:
        window = None  # a 4-d mask already holds the window
    elif not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        mask = torch.ones(1, 1, T, S, dtype=torch.bool, device=q.device)
    sinks = kwargs.get("s_aux")
    return AttentionInputs(
        name=name,
        q=q.detach(),
        k=k.detach(),
        mask=None if mask is None else mask.detach(),
        window=window,
        scale=kwargs.get("scaling"),
        softcap=kwargs.get("softcap"),
        sink_logits=None if sinks is None else sinks.detach(),
    )
