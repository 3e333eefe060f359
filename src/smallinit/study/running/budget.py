"""A recipe's budget: the training length of a run from its tokens per non-embedding parameter, and the
evaluation, analysis and warmup schedule that follows from that length."""

from __future__ import annotations

import math
from typing import Any

from smallinit.config import Config
from smallinit.model import Transformer


def budget_steps(cfg: Config, budget: dict[str, Any]) -> int:
    """Steps for ``cfg``'s model to see ``budget["tokens_per_param"]`` tokens per non-embedding parameter."""
    tokens = float(budget["tokens_per_param"]) * Transformer.count_params(cfg.model)[1]
    return max(1, math.ceil(tokens / (cfg.train.batch_size * cfg.data.seq_len)))


def budget_schedule(n: int, budget: dict[str, Any]) -> dict[str, Any]:
    """The keys a run of ``n`` steps gets from the budget: evaluations, analyses and warmup spread over them."""
    return {
        "train.steps": n,
        "train.eval_every": max(1, n // int(budget.get("eval_points", 8))),
        "analysis.every": max(1, n // int(budget.get("analysis_points", 8))),
        "train.warmup_steps": round(float(budget.get("warmup_frac", 0.05)) * n),
    }
