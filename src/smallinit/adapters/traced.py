"""The adapter of a model smallinit does not know by name, found from the model's own forward, as γ-init
finds each matrix's d_in: nothing is declared, everything is read off one ordinary forward.

* The blocks: those the residual stream passes through, established from the forward (stream.py). Each
  block's input, in call order, is the residual stream; e is the first one's, h_L the input of the norm
  that takes the last block's output (the final norm), or where none does, that output (with a note).
* The norms: every module whose class says norm (smallinit.init.eps.norm_layers: RMSNorm, LayerNorm,
  (1 + w) forms, nn.RMSNorm, hand-written ones), each factor read off its own forward
  (protocol.realised_factor), so ε and the form are what the forward does, whatever the attributes say;
  and every rms_norm / layer_norm call or written-out x·rsqrt(mean(x²) + ε) that no norm layer makes
  (adapters.norm_calls), at the ε the call used.
* The attention: every softmax attention call, caught where it is computed: ``F.scaled_dot_product_attention``
  (its queries and keys after position encoding, mask, causal flag and scale), ``flex_attention`` (its
  ``block_mask`` and ``score_mod`` evaluated on the positions),
  and an eager softmax over the last axis of a (batch, heads, T, S ≥ T) tensor of scores, whose
  probabilities are kept as they are. ``torch.compile``d modules run eagerly while observed (said in a note),
  and a compiled ``flex_attention`` (torchtitan's) by smallinit's math path of the same attention.

What is not found is named in ``Observed.missing`` in one line (the measurement is then not measured); a
forward that cannot be run on token ids is one line saying what to pass (``call=``).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from smallinit.adapters.eager import attention_scores, visible
from smallinit.adapters.hf import is_hf_causal_lm
from smallinit.adapters.hooks import observe_by_hooks
from smallinit.adapters.norm_calls import NormCalls, record_norm_calls
from smallinit.adapters.protocol import (
    AttentionInputs,
    NormForm,
    Observed,
    check_kinds,
    flex_indices,
    readable_norm_forms,
    score_modded,
)
from smallinit.adapters.sources import Sources, run_eagerly
from smallinit.adapters.stream import residual_blocks
from smallinit.errors import ModelError
from smallinit.model.loss import cross_entropy

WHAT_TO_PASS = (
    "pass call=lambda model, tokens: <the logits (batch, T, vocabulary)> (smallinit.adapters.TracedAdapter), "
    "or an adapter of your own (docs/analysis.md, 'Your own model')"
)


class TracedAdapter:
    """``TracedAdapter(model, call=None)``: ``call(model, tokens)`` returns the logits where ``model(tokens)``
    (``model(input_ids=tokens)`` for a Hugging Face model) does not."""

    def __init__(self, model: nn.Module, call: Callable[[nn.Module, torch.Tensor], Any] | None = None):
        if not isinstance(model, nn.Module):
            raise ModelError(f"smallinit cannot observe a {type(model).__name__}: pass an nn.Module")
        self.module, self.call = model, call
        # the blocks the residual stream passes through, established on the first forward observed
        self.blocks: list[tuple[str, nn.Module]] | None = None
        self.no_blocks: str | None = None
        embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
        self._vocab = max((m.num_embeddings for m in embeddings), default=None)
        # per fused matrix (by parameter name), the rows (out × in) that make each part: q, k, v; followed
        # on the first forward that observes attention only: following keeps every product of the forward
        # alive, which costs more memory than the forward itself, and the parts are the architecture's
        self.parts: dict[str, dict[str, torch.Tensor]] | None = None
        self.unsplit: set[str] = set()  # fused matrices whose parts could not be told apart

    @property
    def vocab_size(self) -> int:
        if self._vocab is None:  # no embedding table: the width of the logits
            self._vocab = int(
                self._logits(torch.zeros(1, 2, dtype=torch.long, device=_device(self.module))).shape[-1]
            )
        return self._vocab

    def norms(self) -> dict[str, NormForm]:
        """The form of each norm whose ε and form can be read (observe() names the others when asked)."""
        return readable_norm_forms(self.module)[0]

    def example_inputs(self, tokens: torch.Tensor) -> tuple | dict:
        """What one forward is called with, for tracing the parameters' roles (smallinit.init.param_roles)."""
        return {"input_ids": tokens, "use_cache": False} if is_hf_causal_lm(self.module) else (tokens,)

    def observe(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, kinds: Collection[str] = ()
    ) -> Observed:
        kinds = check_kinds(kinds)
        T = tokens.shape[-1]

        sources, notes = Sources(self.module, following=self.parts is None and "attention" in kinds), []
        if _compiled(self.module):
            notes.append("torch.compile'd modules run eagerly while measuring")

        def recording(attention: list[AttentionInputs], problems: list[str]):
            return recording_attention_calls(self.module, T, attention, problems, sources, notes)

        # the blocks are found on the first forward observed, whatever it asks for (the Monitor's at its start)
        if self.blocks is None:
            self.blocks, self.no_blocks = residual_blocks(self.module, lambda: self._logits(tokens))
        calls = NormCalls(self.module) if "norms" in kinds else contextlib.nullcontext()

        def forward() -> torch.Tensor:
            with calls:
                return self._logits(tokens)

        out, problems = observe_by_hooks(
            self.module, self.blocks or [], self.no_blocks, kinds, forward, recording
        )
        if isinstance(calls, NormCalls):
            record_norm_calls(calls, out)
        if targets is not None:
            out.loss = cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())
        if "attention" in kinds:
            if sources.following and not problems:
                self.parts = sources.parts
                self.unsplit = sources.unsplit - set(sources.parts)
            name = type(self.module).__name__
            if problems:  # one call that cannot be rebuilt would make every layer's mean wrong
                out.attention, out.missing["attention"] = [], problems[0]
            elif not out.attention:
                out.missing["attention"] = (
                    f"no softmax attention: {name} made no scaled_dot_product_attention or flex_attention "
                    "call and no softmax over (batch, heads, T, S) scores in its forward"
                )
            elif notes:
                out.notes["attention"] = "; ".join(dict.fromkeys(notes))
        return out

    def _forward(self, tokens: torch.Tensor) -> Any:
        if self.call is not None:
            return self.call(self.module, tokens)
        if is_hf_causal_lm(self.module):
            return self.module(input_ids=tokens, use_cache=False)
        masks = _own_masks(self.module, tokens)
        return self.module(tokens) if masks is None else self.module(tokens, attention_masks=masks)

    def _logits(self, tokens: torch.Tensor) -> torch.Tensor:
        name = type(self.module).__name__
        try:
            # torch.compile'd regions run as written: a compiled kernel hides its calls from the recording
            with run_eagerly():
                out = self._forward(tokens)
        except (
            TypeError,
            ValueError,
            RuntimeError,
            IndexError,
            KeyError,
            AttributeError,
            AssertionError,
        ) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            how = "call(model, tokens)" if self.call is not None else f"{name}(tokens)"
            raise ModelError(
                f"cannot run {how} on token ids ({type(e).__name__}: {first}); {WHAT_TO_PASS}"
            ) from None
        logits = _as_logits(out, tuple(tokens.shape), self._vocab)
        if logits is None or logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(tokens.shape):
            got = (
                tuple(logits.shape)
                if logits is not None
                else [tuple(t.shape) for t in out if isinstance(t, torch.Tensor)]
                if isinstance(out, (tuple, list))
                else type(out).__name__
            )
            raise ModelError(
                f"{name}'s forward on token ids of shape {tuple(tokens.shape)} gave {got}, not logits of shape "
                f"(batch, T, vocabulary); {WHAT_TO_PASS}"
            )
        return logits


def _own_masks(model: nn.Module, tokens: torch.Tensor) -> Any:
    """The attention masks a model builds for itself where its forward takes them from its caller (torchtitan's
    flex and varlen attention: ``get_attention_masks(positions)``, called as its trainer calls it), for rows
    that are one document each; None for a model that builds none there."""
    build = getattr(model, "get_attention_masks", None)
    if not callable(build) or "attention_masks" not in inspect.signature(model.forward).parameters:
        return None
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    try:
        return build(positions)
    except TypeError:  # an attention that takes no masks (torchtitan's SDPA): its forward is causal alone
        return None


@contextlib.contextmanager
def recording_attention_calls(
    model: nn.Module,
    T: int,
    records: list[AttentionInputs],
    problems: list[str],
    sources: Sources,
    notes: list[str],
) -> Iterator[None]:
    """While inside, every softmax attention call the forward makes is recorded in ``records`` (named by the
    module that made it) and then computed unchanged (a compiled flex_attention by its eager path, said in
    ``notes``); a call that cannot be rebuilt goes to ``problems``."""
    names = {id(m): n for n, m in model.named_modules()}
    calls: list[str] = []  # the modules running, innermost last, for naming a call

    def enter(module: nn.Module, _args) -> None:
        calls.append(names.get(id(module), "?"))

    def leave(_module: nn.Module, _args, _output) -> None:
        if calls:
            calls.pop()

    hooks = [
        h
        for m in model.modules()
        for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))
    ]

    def where() -> str:
        return calls[-1] if calls else type(model).__name__

    mode = _AttentionMode(T, records, problems, where, sources, notes)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_flex_recorded(model, mode))
            stack.enter_context(mode)
            yield
    finally:
        for h in hooks:
            h.remove()


class _AttentionMode(TorchFunctionMode):
    def __init__(
        self,
        T: int,
        records: list[AttentionInputs],
        problems: list[str],
        where: Callable[[], str],
        sources: Sources,
        notes: list[str],
    ):
        super().__init__()
        self.T, self.records, self.problems, self.where, self.sources = T, records, problems, where, sources
        self.notes = notes  # how calls were measured where not as the model runs them

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            self.sdpa(*args, **kwargs)
        elif func is F.multi_head_attention_forward:
            self.multi_head(**_MHA.bind(*args, **kwargs).arguments)
        elif (scores := attention_scores(func, args, kwargs, self.T)) is not None:
            self.softmax(scores, out)
        self.sources.products(func, args, kwargs)
        self.sources.follow(func, args, kwargs, out)
        return out

    def sdpa(self, q, k, v=None, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
        if q.dim() != 4 or k.dim() != 4:  # (batch·heads, T, hd) or (T, hd): no head axis to read
            self.problems.append(
                f"{self.where()}: scaled_dot_product_attention on {q.dim()}-d queries, not (batch, heads, T, "
                "head_dim), so its heads cannot be told apart"
            )
            return
        self.sources.attention_inputs(q, k, v)
        mask = attn_mask
        if mask is None and not is_causal:  # every query sees every key
            mask = torch.ones(1, 1, q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
        elif mask is not None and is_causal:
            causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(
                k.shape[-2] - q.shape[-2]
            )
            mask = causal & (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2)
        self.records.append(
            AttentionInputs(
                name=self.where(),
                q=q.detach(),
                k=k.detach(),
                mask=None if mask is None else mask.detach(),
                scale=scale,
            )
        )

    def multi_head(self, query, key, value, num_heads, in_proj_weight, in_proj_bias, **kw) -> None:
        """nn.MultiheadAttention's call: it reaches this mode as one function, so the projections, SDPA or
        softmax inside it are never seen; its queries and keys are rebuilt from its arguments by torch's own
        in-projection, the keys a query may see from its masks."""
        if kw.get("bias_k") is not None or kw.get("add_zero_attn") or kw.get("static_k") is not None:
            self.problems.append(
                f"{self.where()}: nn.MultiheadAttention with bias_k, add_zero_attn or static_k attends to keys "
                "that are no token, so which token is first cannot be read"
            )
            return
        if query.dim() == 2:  # unbatched (T, E)
            query, key, value = query[:, None], key[:, None], value[:, None]
        (T, B, E), S, hd = query.shape, key.shape[0], query.shape[-1] // num_heads
        if kw.get("use_separate_proj_weight"):
            b = (None,) * 3 if in_proj_bias is None else in_proj_bias.chunk(3)
            q, k, _ = F._in_projection(
                query, key, value, kw["q_proj_weight"], kw["k_proj_weight"], kw["v_proj_weight"], *b
            )
        else:  # in_proj_weight holds [W_q | W_k | W_v]
            q, k, _ = F._in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
            self.sources.known(in_proj_weight, torch.arange(3 * E).view(3, E))
        q = q.reshape(T, B, num_heads, hd).permute(1, 2, 0, 3)
        k = k.reshape(S, B, num_heads, hd).permute(1, 2, 0, 3)
        # its masks as it reads them (its is_causal is a hint that comes with a causal attn_mask)
        mask = torch.zeros(B, num_heads, T, S, device=q.device)
        if (given := kw.get("attn_mask")) is not None:  # (T, S) or (B·heads, T, S)
            mask = mask + (
                _additive(given).view(B, num_heads, T, S) if given.dim() == 3 else _additive(given)
            )
        if (given := kw.get("key_padding_mask")) is not None:  # (B, S)
            mask = mask + _additive(given).view(B, 1, 1, S)
        self.records.append(AttentionInputs(name=self.where(), q=q.detach(), k=k.detach(), mask=mask))

    def softmax(self, scores: torch.Tensor, out: torch.Tensor) -> None:
        self.records.append(AttentionInputs(name=self.where(), probs=out.detach(), mask=visible(scores)))


@contextlib.contextmanager
def _flex_recorded(model: nn.Module, mode: _AttentionMode) -> Iterator[None]:
    """``flex_attention`` bound as a name in the modules that define the model's classes (or as a class
    attribute) is swapped, while inside, for one that records the call first."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:  # a torch without flex attention: nothing to catch
        yield
        return

    def recorded(query, key, value, score_mod=None, block_mask=None, scale=None, *args, **kwargs):
        with torch._C.DisableTorchFunction():  # flex compiles its kernel: no mode of ours inside it
            _record_flex(mode, query, key, score_mod, block_mask, scale)
            mode.sources.attention_inputs(query, key, value)
            return flex_attention(query, key, value, score_mod, block_mask, scale, *args, **kwargs)

    def by_math(
        query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, *args, **kw
    ):
        with torch._C.DisableTorchFunction():
            mask = _record_flex(mode, query, key, score_mod, block_mask, scale)
            mode.sources.attention_inputs(query, key, value)
            if mask is None:  # not rebuildable (said in problems): the model's own call, for the forward
                return flex_attention(
                    query, key, value, score_mod, block_mask, scale, enable_gqa, *args, **kw
                )
            mode.notes.append(
                "compiled flex_attention computed by smallinit's math path (softmax(score_mod(q·kᵀ·scale)) "
                "over the block_mask's mask) while measuring"
            )
            return _flex_math(query, key, value, score_mod, mask, scale, *args, **kw)

    swapped: list[tuple[Any, str, Any, Callable]] = []
    for cls in {type(m) for m in model.modules()}:
        for owner in (sys.modules.get(cls.__module__), cls):
            space = vars(owner) if owner is not None else {}
            for attr, value in list(space.items()):
                function = value.__func__ if isinstance(value, staticmethod) else value
                if function is flex_attention:
                    swapped.append((owner, attr, value, recorded))
                elif getattr(function, "_torchdynamo_orig_callable", None) is flex_attention:
                    # compiled (torchtitan's): the same attention computed from q, k, v and the mask the
                    # block_mask gives, since the compiled kernel cannot be recorded nor on a CPU always built
                    swapped.append((owner, attr, value, by_math))
    try:
        for owner, attr, _, swap in swapped:
            setattr(owner, attr, staticmethod(swap) if isinstance(owner, type) else swap)
        yield
    finally:
        for owner, attr, value, _ in swapped:
            setattr(owner, attr, value)


def _flex_math(q, k, v, score_mod, mask, scale, return_lse=False, kernel_options=None, *, return_aux=None):  # noqa: ARG001
    """flex_attention as plain math, its score_mod on the scaled scores, over ``mask`` (B, H, T, S) bool: its
    output, with the log-sum-exp where asked, in flex_attention's return conventions. Keys with fewer heads
    are shared."""
    from torch.nn.attention.flex_attention import AuxOutput

    rep = q.shape[1] // k.shape[1]
    k, v = (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)) if rep > 1 else (k, v)
    s = (q.float() @ k.float().transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    s = score_modded(score_mod, s).masked_fill(~mask, float("-inf"))
    out = (s.softmax(-1) @ v.float()).to(q.dtype)
    lse = torch.logsumexp(s, dim=-1)
    if return_aux is not None:
        return out, AuxOutput(lse=lse if return_aux.lse else None)
    return (out, lse) if return_lse else out


_MHA = inspect.signature(F.multi_head_attention_forward)


def _additive(mask: torch.Tensor) -> torch.Tensor:
    """A mask of torch's attention modules as scores to add: True (bool) blocks, as −inf; a float one is added."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, device=mask.device).masked_fill(mask, -torch.inf)
    return mask.float()


def _record_flex(mode: _AttentionMode, q, k, score_mod, block_mask, scale) -> torch.Tensor | None:
    """Record one flex_attention call, and return the mask its block_mask gives (None: not rebuildable). Its
    mask_mod and score_mod are evaluated on index tensors that broadcast over the scores; one that cannot be
    (Python control flow on the indices' values) is named in problems."""
    name = mode.where()
    B, H, T, S = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
    mask = torch.ones(1, 1, T, S, dtype=torch.bool, device=q.device)
    shape = torch.Size((B, H, T, S))
    first = torch.zeros(B, H, 1, S, dtype=torch.float32, device=q.device)  # the first query's scores
    try:
        which = "block_mask's mask_mod"
        if block_mask is not None:
            mask = block_mask.mask_mod(*flex_indices(shape, 0, q.device)).expand(shape).bool()
        which = "score_mod"
        if score_mod is not None and score_modded(score_mod, first).shape != first.shape:
            raise ValueError("it does not keep the scores' shape")
    except (RuntimeError, TypeError, IndexError, ValueError) as e:
        mode.problems.append(
            f"{name}: the flex_attention {which} cannot be evaluated on broadcast index tensors ({e})"
        )
        return None
    mode.records.append(
        AttentionInputs(name=name, q=q.detach(), k=k.detach(), mask=mask, scale=scale, score_mod=score_mod)
    )
    return mask


def _as_logits(out: Any, shape: tuple[int, ...], vocab: int | None) -> torch.Tensor | None:
    """The logits in what the forward returned: the tensor itself, a ``logits`` attribute or key, or in a tuple
    the one tensor of shape (batch, T, vocabulary) (any width where the vocabulary is unknown), whatever its
    position: a model may return (hidden, logits)."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, Mapping):
        logits = out.get("logits")
    if logits is None and isinstance(out, (tuple, list)):
        fits = [
            t
            for t in out
            if isinstance(t, torch.Tensor)
            and t.dim() == 3
            and tuple(t.shape[:2]) == shape
            and (vocab is None or t.shape[-1] == vocab)
        ]
        logits = fits[0] if len(fits) == 1 else None
    return logits if isinstance(logits, torch.Tensor) else None


def _compiled(model: nn.Module) -> bool:
    """Whether ``model`` holds torch.compile'd modules (none before torch.compile imports its module)."""
    frames = sys.modules.get("torch._dynamo.eval_frame")
    return frames is not None and any(isinstance(m, frames.OptimizedModule) for m in model.modules())


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
