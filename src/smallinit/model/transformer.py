"""The decoder: token embedding → L pre-norm blocks (attention, feed-forward) → final RMSNorm → LM head.

h_0 = E[tokens];  h_l = h_{l−1} + Attn(Norm(h_{l−1}));  h_l ← h_l + FFN(Norm(h_l));  logits = Norm(h_L) Wᵀ.
FFN is a SwiGLU, or in MoE layers (``model.moe``) a routed mixture of SwiGLU experts (model/moe.py).
Every weight matrix starts from N(0, d_in^(−2γ)) (smallinit.init). For analysis, ``capture`` returns
internal states of the same forward pass ("hidden", "norms", "qk", "attn"), observed through hooks
(model/capture.py) so that the forward itself is only the equations above.
For decoding, ``cache`` (a KVCache from ``new_cache``) holds the earlier positions' keys and values: the
forward takes only the new tokens, places them after the cached ones (RoPE included) and extends the cache.
Built under ``torch.device("meta")`` nothing is drawn; ``to_empty`` then ``reset_parameters(seed)`` gives the
weights and buffers of a CPU build with that seed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from smallinit.config import ModelConfig
from smallinit.init import InitReport, gamma_init_
from smallinit.model.attention import Attention, KVCache, rope_tables
from smallinit.model.capture import capturing, check_kinds
from smallinit.model.loss import cross_entropy
from smallinit.model.mlp import SwiGLU
from smallinit.model.moe import MoE
from smallinit.model.norm import RMSNorm


@dataclass
class ModelOutput:
    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None  # mean next-token cross-entropy (plus nothing else)
    aux_loss: torch.Tensor | None = (
        None  # MoE router losses (weighted, mean over MoE layers); add to ``loss``
    )
    hidden_states: list[torch.Tensor] = field(default_factory=list)
    norm_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    qk: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    attentions: list[torch.Tensor] = field(default_factory=list)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.effective_norm_eps)
        self.attn = Attention(
            cfg.d_model,
            cfg.n_heads,
            cfg.n_kv_heads,
            gate=cfg.gate,
            qk_norm=cfg.qk_norm,
            norm_eps=cfg.effective_norm_eps,
        )
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.effective_norm_eps)
        self.mlp: SwiGLU | MoE
        if cfg.moe is not None and layer % cfg.moe.every_n_layers == cfg.moe.every_n_layers - 1:
            self.mlp = MoE(cfg.d_model, cfg.d_ff, cfg.moe)
        else:
            self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, h, cos, sin, cache: KVCache | None = None, layer: int = 0):
        """(h after the block, the MoE layer's weighted router loss or None for a dense block)."""
        h = h + self.attn(self.attn_norm(h), cos, sin, cache, layer)
        if isinstance(self.mlp, MoE):
            y, aux = self.mlp(self.mlp_norm(h))
            return h + y, aux
        return h + self.mlp(self.mlp_norm(h)), None


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, *, seed: int = 0, init: bool = True):
        super().__init__()
        config.validate()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.effective_norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # built on the meta device nothing is drawn (PyTorch's convention): to_empty, then reset_parameters
        meta = self.embed.weight.is_meta
        self.init_report: InitReport | None = self.reset_parameters(seed) if init and not meta else None

    def reset_parameters(self, seed: int = 0) -> InitReport:
        """γ-init every matrix from ``seed`` (same weights on every machine and parallel layout), and set the
        buffers: after ``to_empty`` this gives the weights a build on the CPU with the same seed has."""
        c = self.config
        if c.tie_embeddings:  # to_empty gives each name its own storage
            self.lm_head.weight = self.embed.weight
        report = gamma_init_(
            self,
            c.gamma,
            generator=torch.Generator().manual_seed(seed),
            scales=c.init_scales,
            # per-role scales tell the output projections by one forward
            example_inputs=self.example_inputs() if c.init_scales else None,
        )
        with torch.no_grad():
            cos, sin = rope_tables(c.head_dim, c.max_seq_len, c.rope_theta)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)
            for mod in self.modules():
                if isinstance(mod, MoE):
                    mod.reset_stats()
        return report

    def example_inputs(self) -> torch.Tensor:
        """Two tokens on the model's device: enough for one forward that shows how the parameters are used."""
        return torch.zeros(1, 2, dtype=torch.long, device=self.embed.weight.device)

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        capture: Iterable[str] = (),
        cache: KVCache | None = None,
    ) -> ModelOutput:
        kinds = check_kinds(capture)
        if kinds:  # the same forward, observed by hooks
            if cache is not None:
                raise ValueError("capture needs the whole sequence in one forward; pass no cache")
            with capturing(self, kinds) as got:
                out = self.forward(tokens, targets)
            out.hidden_states, out.norm_inputs, out.qk, out.attentions = (
                got.hidden,
                got.norms,
                got.qk,
                got.attn,
            )
            return out
        past, T = (cache.length if cache is not None else 0), tokens.shape[1]
        if past + T > self.config.max_seq_len:
            raise ValueError(f"sequence length {past + T} exceeds max_seq_len {self.config.max_seq_len}")
        cos, sin = self.rope_cos[past : past + T], self.rope_sin[past : past + T]

        h = self.embed(tokens)
        aux = []
        for i, block in enumerate(self.blocks):
            h, block_aux = block(h, cos, sin, cache, i)
            if block_aux is not None:
                aux.append(block_aux)
        if cache is not None:
            cache.length += T
        logits = self.lm_head(self.norm(h))

        out = ModelOutput(logits=logits)
        if targets is not None:
            out.loss = cross_entropy(logits.flatten(0, 1), targets.flatten())
        if aux:  # the mean, so the loss weights do not scale with depth
            out.aux_loss = torch.stack(aux).mean()
        return out

    def new_cache(self, batch_size: int = 1) -> KVCache:
        """An empty KVCache for up to max_seq_len positions, on the model's device and in its dtype."""
        c, w = self.config, self.embed.weight
        return KVCache(
            c.n_layers, batch_size, c.n_kv_heads, c.max_seq_len, c.head_dim, dtype=w.dtype, device=w.device
        )

    def num_params(self, *, active: bool = False, embeddings: bool = True) -> int:
        """Unique parameters; ``active`` counts only the experts a token uses (MoE)."""
        seen, total = set(), 0
        for mod in self.modules():
            for pname, p in mod.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if not embeddings and mod is self.embed:
                    continue
                n = p.numel()
                if active and hasattr(mod, "active_fraction"):
                    n = round(n * mod.active_fraction(pname))
                total += n
        return total

    @staticmethod
    def count_params(config: ModelConfig) -> tuple[int, int]:
        """(total, without the embedding) parameters of ``config``, from shapes only: nothing is allocated."""
        with torch.device("meta"):
            model = Transformer(config, init=False)
        return model.num_params(), model.num_params(embeddings=False)
