"""The paper's measurements, one module per measurement; each works on its own.

norm_factor (RMSNorm factor, analytic and measured), sink (attention sink scores), residual_flow
(‖h_L − e‖/‖e‖ and its d-exponent), condensation (stable rank, row cosine), tokens (Δ_sym by difficulty),
coordcheck (activation / update scale over γ), scaling (power-law fits and effective model size: import
from smallinit.analysis.scaling); measure (all single-model measurements at once), during_training (the same,
every N steps of training).
"""

from ..measures.condensation import (
    MatrixStat,
    RowCosine,
    matrix_stats,
    row_cosine,
    spectral_norm,
    stable_rank,
)
from ..measures.norm_factor import (
    check_norm_saturation,
    measured_norm_factors,
    norm_saturation_message,
    relative_factor,
    rmsnorm_factor,
    saturation_gamma,
)
from ..measures.residual_flow import ResidualFlowSweep, residual_flow_ratio, residual_flow_sweep
from ..measures.sink import SinkScores, sink_scores
from .coordcheck import CoordCheck, coord_check
from .during_training import AnalysisCallback, load_snapshots
from .measure import analyze_checkpoint, analyze_model, load_run, measure_activations
from .tokens import TokenGapResult, text_batches, token_gap, token_gap_batch

__all__ = [
    "AnalysisCallback", "CoordCheck", "MatrixStat", "ResidualFlowSweep", "RowCosine", "SinkScores",
    "TokenGapResult", "analyze_checkpoint", "analyze_model", "check_norm_saturation", "coord_check", "load_run",
    "load_snapshots", "matrix_stats", "measure_activations", "measured_norm_factors", "norm_saturation_message", "relative_factor",
    "residual_flow_ratio", "residual_flow_sweep", "rmsnorm_factor", "row_cosine", "saturation_gamma",
    "sink_scores", "spectral_norm", "stable_rank", "text_batches", "token_gap", "token_gap_batch",
]
