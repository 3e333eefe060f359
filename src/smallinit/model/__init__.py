"""The model: a plain nn.Module that knows nothing of training, data, logging or distribution."""

from .attention import Attention, KVCache, apply_rope, rope_tables
from .mlp import SwiGLU
from .moe import MoE, RouterStats
from .norm import RMSNorm
from .transformer import Block, ModelOutput, Transformer

__all__ = ["Attention", "Block", "KVCache", "ModelOutput", "MoE", "RMSNorm", "RouterStats", "SwiGLU", "Transformer", "apply_rope", "rope_tables"]
