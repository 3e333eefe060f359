"""The model: a plain nn.Module that knows nothing of training, data, logging or distribution."""

from smallinit.model.attention import Attention, KVCache, apply_rope, rope_tables
from smallinit.model.mlp import SwiGLU
from smallinit.model.moe import MoE, RouterStats
from smallinit.model.norm import RMSNorm
from smallinit.model.transformer import Block, ModelOutput, Transformer

__all__ = [
    "Attention",
    "Block",
    "KVCache",
    "ModelOutput",
    "MoE",
    "RMSNorm",
    "RouterStats",
    "SwiGLU",
    "Transformer",
    "apply_rope",
    "rope_tables",
]
