"""Training: the loop, optimizer and schedules, checkpoints, callbacks, and the monitor any training can call."""

from smallinit.train.callbacks import Callback, Progress
from smallinit.train.checkpoint import latest_checkpoint, load_model
from smallinit.train.moe_log import RouterLog
from smallinit.train.monitor import AnalysisCallback, Monitor, load_snapshots, scalars
from smallinit.train.optim import build_optimizer, lr_at
from smallinit.train.trainer import Runtime, Trainer

__all__ = [
    "AnalysisCallback",
    "Callback",
    "Monitor",
    "load_snapshots",
    "scalars",
    "Progress",
    "RouterLog",
    "Runtime",
    "Trainer",
    "build_optimizer",
    "latest_checkpoint",
    "load_model",
    "lr_at",
]
