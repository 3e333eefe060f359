"""Training: the loop, optimizer and schedules, checkpoints, callbacks, and the monitor any training can call."""

from .callbacks import Callback, Progress
from .checkpoint import latest_checkpoint, load_model
from .moe_log import RouterLog
from .monitor import AnalysisCallback, Monitor, load_snapshots, scalars
from .optim import build_optimizer, lr_at
from .trainer import Runtime, Trainer

__all__ = ["AnalysisCallback", "Callback", "Monitor", "load_snapshots", "scalars", "Progress", "RouterLog", "Runtime", "Trainer", "build_optimizer", "latest_checkpoint", "load_model", "lr_at"]
