"""Training: the loop, optimizer and schedules, checkpoints, callbacks (the Monitor attached to the loop)."""

from smallinit.train.callbacks import AnalysisCallback, Callback, Progress
from smallinit.train.checkpoint import latest_checkpoint, load_model
from smallinit.train.moe_log import RouterLog
from smallinit.train.optim import build_optimizer, lr_at
from smallinit.train.trainer import Runtime, Trainer

__all__ = [
    "AnalysisCallback",
    "Callback",
    "Progress",
    "RouterLog",
    "Runtime",
    "Trainer",
    "build_optimizer",
    "latest_checkpoint",
    "load_model",
    "lr_at",
]
