"""smallinit: small initialization for language models.

from smallinit import gamma_init_
report = gamma_init_(model, gamma=1.0)   # W ~ N(0, d_in^(−2γ)) for every weight matrix
"""

from smallinit.config import AnalysisConfig, Config, DataConfig, ModelConfig, MoEConfig, TrainConfig
from smallinit.errors import SmallinitError
from smallinit.generate import Sampling, generate, load_pretrained
from smallinit.init import (
    InitReport,
    ParamRole,
    as_out_in,
    gamma_init_,
    gamma_normal_,
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
    "as_out_in",
    "gamma_init_",
    "gamma_normal_",
    "generate",
    "load_model",
    "load_pretrained",
    "param_roles",
    "set_norm_eps_",
]
