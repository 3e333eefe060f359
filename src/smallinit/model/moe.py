"""Mixture-of-experts feed-forward: a top-k router over E SwiGLU experts, plus an optional shared expert.

For a token x (after the block's norm):

    s = softmax(x W_rᵀ)  or  sigmoid(x W_rᵀ)            router scores over E experts, in fp32
    K = top-k indices of s;  g_e = s_e / Σ_{j∈K} s_j     top-k weights renormalised to sum 1 (k > 1);
                                                          with k = 1 the raw score s_e is kept (Switch),
                                                          so the language-model loss still trains the router
    y = Σ_{e∈K} g_e · SwiGLU_e(x)  [+ SwiGLU_shared(x)]

Dropless: every token reaches its k experts whatever the batch holds, so a token's output does not depend
on the other tokens. Dispatch sorts the (token, slot) pairs by expert and runs each projection as one
grouped matrix multiply over the E contiguous groups (``torch.nn.functional.grouped_mm``, where it runs:
eager CPU, bf16 on Hopper GPUs), or as one matmul per expert (a Python loop over experts, never over
tokens). All give the same numbers; ``MoE.dispatch`` ("auto" | "grouped" | "loop") picks one. Dispatch and
combine move each (token, slot) pair to one place and back, never adding into a shared row, so the backward
sums a token's k gradients in a fixed order: bit-reproducible whatever the threads, eager and compiled. Under
torch.compile, "auto" hands each projection to one operator of ours, ``smallinit::expert_mm``, whose output
shape is the input's whatever the routing: Dynamo traces the layer as one graph with no break, no recompile
when the routing changes and no device→host sync in the graph (the group sizes are read inside the operator,
on the host only where the loop runs).

Expert weights are stored batched, (E, out, in) like PyTorch's Linear, so γ-init (fan_in = last dim,
leading dims are a batch) draws each expert from its own d_in: d_model for gate/up, d_expert for down.

Router losses, returned by ``forward`` as one weighted scalar:
- load balancing (Switch Transformer): E · Σ_e f_e · P_e, f_e = fraction of (token, slot) assignments sent
  to expert e, P_e = mean router probability of e (sigmoid scores normalised per token). It is 1 for uniform
  routing, and E·Σ f_e² ≥ 1 when routing is sharp (f = P);
- z-loss (ST-MoE): mean over tokens of logsumexp(router logits)², which keeps the logits small.

In training mode the layer also adds its routing counts and unweighted losses to two non-persistent buffers
that training callbacks read and reset through ``pop_stats``; the forward result never depends on them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from smallinit.config import MoEConfig
from smallinit.model.mlp import SwiGLU

EXPERT_PARAMS = ("gate_proj", "up_proj", "down_proj")
DISPATCHES = ("auto", "grouped", "loop")


@dataclass
class RouterStats:
    """Routing of one MoE layer, averaged over the training forwards since the last ``pop_stats``."""

    load: list[float]  # fraction of (token, slot) assignments per expert; sums to 1, uniform = 1/E
    balance_loss: float  # unweighted load-balancing loss (1 = balanced)
    z_loss: float  # unweighted router z-loss
    forwards: int


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Switch loss E · Σ_e f_e · P_e from per-token probabilities (N, E) and assignment counts (E,)."""
    E = probs.shape[-1]
    f = counts.to(probs.dtype) / counts.sum()
    return E * (f * probs.mean(0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of logsumexp(logits)²."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def matmul_dtype(x: torch.Tensor, w: torch.Tensor) -> torch.dtype | None:
    """The dtype a matmul of x and w computes in: autocast's if it is on, else theirs (None if they differ)."""
    if torch.amp.is_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype if x.dtype == w.dtype else None


def grouped_mm_runs(dtype: torch.dtype | None, device: torch.device, widths: tuple[int, ...]) -> bool:
    """Whether ``F.grouped_mm`` runs eagerly here: on the CPU in fp32 and bf16 when every matrix width is a
    whole multiple of 16 bytes; on CUDA in bf16 on Hopper or newer (what PyTorch documents)."""
    if not hasattr(F, "grouped_mm") or dtype not in (torch.float32, torch.bfloat16):
        return False
    if device.type == "cuda" and (
        dtype != torch.bfloat16 or torch.cuda.get_device_capability(device) < (9, 0)
    ):
        return False
    return device.type in ("cpu", "cuda") and all(n * dtype.itemsize % 16 == 0 for n in widths)


def expert_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, *, how: str) -> torch.Tensor:
    """Rows of ``x`` grouped by expert (group e has counts[e] rows) times w[e]ᵀ, w of shape (E, out, in);
    ``how`` is "grouped", "loop" or "op" (``expert_mm``, for torch.compile)."""
    if how != "loop":  # neither grouped_mm nor our operator is an autocast op: cast as autocast would
        dtype = matmul_dtype(x, w) or torch.promote_types(x.dtype, w.dtype)
        x, w = x.to(dtype), w.to(dtype)
        if how == "op":
            return expert_mm(x, w, counts)
        offs = counts.cumsum(0).to(torch.int32)
        if (
            x.device.type == "meta"
        ):  # shapes only (smallinit info's trace): grouped_mm's meta kernel takes bf16
            return F.grouped_mm(x.bfloat16(), w.transpose(-2, -1).bfloat16(), offs=offs).to(dtype)
        return F.grouped_mm(x, w.transpose(-2, -1), offs=offs)
    # one matmul per expert; .tolist() waits for the counts (a host sync on GPUs). unbind, not w[e]: the
    # backward of each w[e] would write a full-size gradient of w, E times over
    return torch.cat([xe @ we.T for xe, we in zip(x.split(counts.tolist()), w.unbind(0))])


@torch.library.custom_op("smallinit::expert_mm", mutates_args=())
def expert_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``expert_matmul`` as one operator, run eagerly inside: grouped_mm where it runs, else the loop."""
    if grouped_mm_runs(x.dtype, x.device, w.shape[1:]) and x.dtype == w.dtype:
        return expert_matmul(x, w, counts, how="grouped")
    return expert_matmul(x, w, counts, how="loop")


@expert_mm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("smallinit::expert_mm_weight_grad", mutates_args=())
def expert_mm_weight_grad(dy: torch.Tensor, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The gradient of ``expert_mm``'s w: dy_eᵀ x_e for every group e, shape (E, out, in)."""
    if grouped_mm_runs(x.dtype, x.device, (dy.shape[1], x.shape[1])) and x.dtype == dy.dtype:
        return F.grouped_mm(dy.t(), x, offs=counts.cumsum(0).to(torch.int32))
    groups = counts.tolist()
    return torch.stack([de.T @ xe for de, xe in zip(dy.split(groups), x.split(groups))])


@expert_mm_weight_grad.register_fake
def _(dy: torch.Tensor, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return dy.new_empty(counts.shape[0], dy.shape[1], x.shape[1])


def _expert_mm_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _expert_mm_backward(ctx, dy: torch.Tensor):
    x, w, counts = ctx.saved_tensors
    dx = expert_mm(dy, w.transpose(-2, -1), counts) if ctx.needs_input_grad[0] else None
    dw = expert_mm_weight_grad(dy, x, counts) if ctx.needs_input_grad[1] else None
    return dx, dw, None


expert_mm.register_autograd(_expert_mm_backward, setup_context=_expert_mm_context)


class GatherRows(torch.autograd.Function):
    """``x.index_select(0, index // k)``, ``index`` a permutation of N·k rows and ``inverse`` its inverse, with a
    backward that gathers too: row t of x gets the sum of its k rows' gradients, added in slot order. Autograd's
    own backward of a gather adds the k gradients into one row in whatever order the threads (or GPU atomics)
    run, so with k >= 3 two identical runs differ in the last bits."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor, k: int) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.k = k
        return x.index_select(0, index // k if k > 1 else index)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        g = g.index_select(0, inverse)
        return (g.view(-1, ctx.k, g.shape[-1]).sum(1) if ctx.k > 1 else g), None, None, None


class MoE(nn.Module):
    def __init__(self, d_model: int, d_ff: int, cfg: MoEConfig, *, dispatch: str = "auto"):
        super().__init__()
        E, d_expert = cfg.num_experts, cfg.d_expert or d_ff
        self.num_experts, self.top_k, self.d_expert, self.score = E, cfg.top_k, d_expert, cfg.score
        self.aux_loss_weight, self.z_loss_weight = cfg.aux_loss_weight, cfg.z_loss_weight
        self.dispatch = dispatch
        self.router = nn.Linear(d_model, E, bias=False)
        # empty: the model's gamma_init_ fills them (and nothing is drawn when built on the meta device)
        self.gate_proj = nn.Parameter(torch.empty(E, d_expert, d_model))
        self.up_proj = nn.Parameter(torch.empty(E, d_expert, d_model))
        self.down_proj = nn.Parameter(torch.empty(E, d_model, d_expert))
        # (E, out, in), applied as x @ w[e]ᵀ
        self.gamma_in_dim = {"gate_proj": 2, "up_proj": 2, "down_proj": 2}
        self.shared_expert = SwiGLU(d_model, d_expert) if cfg.shared_expert else None
        # integer counts stay exact when the model is cast to bf16
        self.register_buffer("expert_counts", torch.zeros(E, dtype=torch.int64), persistent=False)
        self.register_buffer("loss_sums", torch.zeros(3), persistent=False)  # balance, z, forwards

    def active_fraction(self, name: str) -> float:
        """Fraction of a parameter that one token uses (for ``Transformer.num_params(active=True)``)."""
        return self.top_k / self.num_experts if name in EXPERT_PARAMS else 1.0

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits and probabilities (N, E), top-k weights and expert indices (N, k), all fp32."""
        # no autocast region where the device has none (the meta device, on which `smallinit info` traces)
        off = torch.amp.is_autocast_available(x.device.type)
        with torch.autocast(x.device.type, enabled=False) if off else contextlib.nullcontext():
            logits = F.linear(x.float(), self.router.weight.float())
        if self.score == "softmax":
            scores = logits.softmax(-1)
            probs = scores
        else:
            scores = logits.sigmoid()
            probs = scores / scores.sum(-1, keepdim=True)
        weights, experts = scores.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, probs, weights, experts

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output shaped like x, weighted router loss: aux_loss_weight·balance + z_loss_weight·z)."""
        shape, k = x.shape, self.top_k
        x = x.reshape(-1, shape[-1])
        logits, probs, weights, experts = self.route(x)

        # dispatch: (token, slot) pairs sorted by expert, so each expert's tokens are one contiguous block
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        # a scatter, not bincount: the same counts with a static shape, so fake-tensor traces (a memory plan on
        # fake ranks) can run the forward
        counts = torch.zeros(self.num_experts, dtype=torch.int64, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat)
        )
        # the inverse permutation: where each (token, slot) pair went
        slots = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
        how = self._how(x)
        xs = self.to_experts(x, order, slots, k)
        hs = F.silu(expert_matmul(xs, self.gate_proj, counts, how=how))
        hs = hs * expert_matmul(xs, self.up_proj, counts, how=how)
        ys = expert_matmul(hs, self.down_proj, counts, how=how)
        # combine: back to (token, slot) order, weighted sum over the k slots
        y = self.from_experts(ys, order, slots).view(-1, k, shape[-1])
        y = (y * weights.unsqueeze(-1).to(y.dtype)).sum(1)
        if self.shared_expert is not None:
            y = y + self.shared_expert(x)

        balance, z = load_balancing_loss(probs, counts), router_z_loss(logits)
        if self.training:
            self._accumulate(counts, balance, z)
        return y.view(shape), self.aux_loss_weight * balance + self.z_loss_weight * z

    @staticmethod
    def to_experts(x: torch.Tensor, order: torch.Tensor, slots: torch.Tensor, k: int) -> torch.Tensor:
        """Dispatch: the rows of the (token, slot) pairs in ``order`` (pair i is token i // k's slot i % k);
        ``slots`` is the inverse permutation of ``order``."""
        return GatherRows.apply(x, order, slots, k)

    @staticmethod
    def from_experts(ys: torch.Tensor, order: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Combine: the experts' rows back in (token, slot) order."""
        return GatherRows.apply(ys, slots, order, 1)

    def _how(self, x: torch.Tensor) -> str:
        if self.dispatch not in DISPATCHES:
            raise ValueError(f"MoE dispatch must be one of {DISPATCHES}, got {self.dispatch!r}")
        if self.dispatch != "auto":
            return self.dispatch
        # under torch.compile, grouped_mm's tracing kernel takes bf16 only and the loop breaks the graph
        if torch.compiler.is_compiling():
            return "op"
        if x.device.type == "meta":  # shapes only: the loop cannot split by counts it does not hold
            return "grouped"
        # eagerly on GPUs the grouped path is not verified yet: the loop
        dtype = matmul_dtype(x, self.gate_proj)
        cpu = x.device.type == "cpu"
        return "grouped" if cpu and grouped_mm_runs(dtype, x.device, (x.shape[-1], self.d_expert)) else "loop"

    @torch.no_grad()
    def _accumulate(self, counts: torch.Tensor, balance: torch.Tensor, z: torch.Tensor) -> None:
        self.expert_counts += counts
        self.loss_sums += torch.stack([balance.detach(), z.detach(), torch.ones_like(z)]).to(
            self.loss_sums.dtype
        )

    @torch.no_grad()
    def reset_stats(self) -> None:
        """Zero the routing statistics (after ``to_empty`` they hold whatever memory held)."""
        self.expert_counts.zero_()
        self.loss_sums.zero_()

    @torch.no_grad()
    def pop_stats(self) -> RouterStats | None:
        """Routing statistics since the last call (None if no training forward ran), and reset them."""
        forwards = int(self.loss_sums[2].item())
        if forwards == 0:
            return None
        load = (self.expert_counts.double() / self.expert_counts.sum()).tolist()
        balance, z = (self.loss_sums[:2] / forwards).tolist()
        self.reset_stats()
        return RouterStats(load=load, balance_loss=balance, z_loss=z, forwards=forwards)
