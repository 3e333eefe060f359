"""smallinit: small initialization for language models.

from smallinit import add_attention_gate_, gamma_init_
report = gamma_init_(model, gamma=1.0)   # W ~ N(0, d_in^(−2γ)) for every weight matrix
add_attention_gate_(model)               # the output gate σ(X W_θ) on every softmax attention
print(audit(model).table())              # per matrix σ, d_in, γ, fresh-random; the recipe; every norm's factor
"""

from smallinit.auditing import audit  # the function: smallinit.audit(model); the room is smallinit.auditing.*
from smallinit.config import AnalysisConfig, Config, DataConfig, ModelConfig, MoEConfig, TrainConfig
from smallinit.errors import SmallinitError
from smallinit.export.gated import add_attention_gate_, load_gated
from smallinit.generate import Sampling, generate, load_pretrained
from smallinit.init import (
    InitReport,
    ParamRole,
    as_out_in,
    gamma_init_,
    gamma_normal_,
    measure_gamma,
    param_roles,
    set_norm_eps_,
)
from smallinit.model import ModelOutput, Transformer
from smallinit.monitor import Monitor
from smallinit.train import load_model
from smallinit.version import __version__

__all__ = [
    "__version__",
    "AnalysisConfig",
    "Config",
    "DataConfig",
    "InitReport",
    "ModelConfig",
    "ModelOutput",
    "MoEConfig",
    "Monitor",
    "ParamRole",
    "Sampling",
    "SmallinitError",
    "TrainConfig",
    "Transformer",
    "add_attention_gate_",
    "as_out_in",
    "audit",
    "gamma_init_",
    "gamma_normal_",
    "generate",
    "load_gated",
    "load_model",
    "load_pretrained",
    "measure_gamma",
    "param_roles",
    "set_norm_eps_",
]
