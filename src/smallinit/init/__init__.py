"""γ-initialization: every weight matrix W ~ N(0, σ²) with σ = d_in^(−γ).

γ = 0.5 is the usual LeCun/Xavier-like scale; γ = 1 is the paper's recommendation. d_in is the dimension
the forward contracts with the input (``roles``); only weight matrices are drawn (``draw``); every norm's
ε is set by ``eps``; ``scale`` reads the γ back from drawn weights.
"""

from smallinit.init.draw import (
    InitReport,
    InitRow,
    MetaDeviceError,
    gamma_init_,
    gamma_normal_,
    gamma_std,
    init_plan,
)
from smallinit.init.eps import set_norm_eps_
from smallinit.init.own import OwnInitError
from smallinit.init.roles import ParamRole, as_out_in, is_norm, param_roles
from smallinit.init.scale import GammaEstimate, measure_gamma

__all__ = [
    "GammaEstimate",
    "InitReport",
    "InitRow",
    "MetaDeviceError",
    "OwnInitError",
    "ParamRole",
    "as_out_in",
    "gamma_init_",
    "gamma_normal_",
    "gamma_std",
    "init_plan",
    "is_norm",
    "measure_gamma",
    "param_roles",
    "set_norm_eps_",
]
