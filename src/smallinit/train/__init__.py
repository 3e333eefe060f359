"""Training: the loop, optimizer and schedules, checkpoints, callbacks."""

from .callbacks import Callback, Progress
from .checkpoint import latest_checkpoint, load_model
from .moe_log import RouterLog
from .optim import build_optimizer, lr_at
from .trainer import Runtime, Trainer

__all__ = ["Callback", "Progress", "RouterLog", "Runtime", "Trainer", "build_optimizer", "latest_checkpoint", "load_model", "lr_at"]
