"""The paper's measurements on saved models and runs, and the public names of all of them.

The per-model measurements live in smallinit.measures (norm_factor, sink, residual_flow, condensation) and
are re-exported here; the monitor that takes them along any training is smallinit.monitor. Here:
tokens (Δ_sym by difficulty), coordcheck (activation / update scale over γ), saturation (the share of a run
spent saturated), measure (``smallinit analyze`` / ``compare`` on a run, checkpoint or Hugging Face folder).
"""

from smallinit.analysis.coordcheck import CoordCheck, coord_check
from smallinit.analysis.measure import analyze_checkpoint, analyze_model, load_run, measure_activations
from smallinit.analysis.tokens import TokenGapResult, text_batches, token_gap, token_gap_batch
from smallinit.measures.condensation import (
    MatrixStat,
    RowCosine,
    matrix_stats,
    row_cosine,
    spectral_norm,
    stable_rank,
)
from smallinit.measures.norm_factor import (
    check_norm_saturation,
    measured_norm_factors,
    norm_saturation_message,
    relative_factor,
    rmsnorm_factor,
    saturation_gamma,
)
from smallinit.measures.residual_flow import ResidualFlowSweep, residual_flow_ratio, residual_flow_sweep
from smallinit.measures.sink import Sink, sink_scores
from smallinit.monitor import load_snapshots
from smallinit.train.callbacks import AnalysisCallback

__all__ = [
    "AnalysisCallback",
    "CoordCheck",
    "MatrixStat",
    "ResidualFlowSweep",
    "RowCosine",
    "Sink",
    "TokenGapResult",
    "analyze_checkpoint",
    "analyze_model",
    "check_norm_saturation",
    "coord_check",
    "load_run",
    "load_snapshots",
    "matrix_stats",
    "measure_activations",
    "measured_norm_factors",
    "norm_saturation_message",
    "relative_factor",
    "residual_flow_ratio",
    "residual_flow_sweep",
    "rmsnorm_factor",
    "row_cosine",
    "saturation_gamma",
    "sink_scores",
    "spectral_norm",
    "stable_rank",
    "text_batches",
    "token_gap",
    "token_gap_batch",
]
