"""Every claim judged on one set of runs."""

from __future__ import annotations

from typing import Any

from ..power import MIN_TOKENS_PER_PARAM
from .c1 import claim_c1
from .c2 import claim_c2
from .c3 import claim_c3
from .c4 import claim_c4
from .c5 import claim_c5
from .c6 import claim_c6
from .c7 import claim_c7
from .comparison import ClaimResult
from .selection import Runs, baselines, reference_lr


def judge_all(runs: Runs, flow: dict[str, Any] | None = None, gaps: dict[int, dict[str, Any]] | None = None, *,
              n_boot: int = 1000, min_tpp: float = MIN_TOKENS_PER_PARAM) -> list[ClaimResult]:
    """C1–C7 on ``runs``; C5's exponent needs a residual-flow sweep (``flow``), C7 token comparisons (``gaps``).
    C1 and C2 are judged once per baseline present (emulated saturation, plain ε)."""
    main = reference_lr(runs)
    out = []
    for suffix, arm in baselines(main):
        out.append(claim_c1(main, baseline=arm, suffix=suffix, min_tpp=min_tpp))
    for suffix, arm in baselines(main):
        out.append(claim_c2(main, baseline=arm, suffix=suffix, min_tpp=min_tpp))
    out += [claim_c3(main, min_tpp=min_tpp), claim_c4(main, n_boot=n_boot, all_lrs=runs, min_tpp=min_tpp),
            claim_c5(main, flow, min_tpp=min_tpp), claim_c6(main), claim_c7(gaps)]
    return out
