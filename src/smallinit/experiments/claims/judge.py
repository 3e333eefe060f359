"""Every claim judged on one set of runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..power import MIN_TOKENS_PER_PARAM
from .c1 import claim_c1
from .c2 import claim_c2
from .c3 import claim_c3
from .c4 import claim_c4
from .c5 import claim_c5
from .c6 import claim_c6
from .c7 import claim_c7
from .comparison import SECONDARY, ClaimResult, judge_table
from .selection import Runs, baselines, reference_lr


def judge_all(runs: Runs, flow: dict[str, Any] | None = None, gaps: dict[int, dict[str, Any]] | None = None, *,
              n_boot: int = 1000, min_tpp: float = MIN_TOKENS_PER_PARAM) -> list[ClaimResult]:
    """C1–C7 on ``runs``; C5's exponent needs a residual-flow sweep (``flow``), C7 token comparisons (``gaps``).
    C1 and C2 are judged on the emulated baseline where present, with the plain-ε baseline as secondary; the
    primaries are judged together (Holm over the table)."""
    main = reference_lr(runs)
    out = [_with_contrasts(claim, main, min_tpp) for claim in (claim_c1, claim_c2)]
    out += [claim_c3(main, min_tpp=min_tpp), claim_c4(main, n_boot=n_boot, all_lrs=runs, min_tpp=min_tpp),
            claim_c5(main, flow, min_tpp=min_tpp), claim_c6(main), claim_c7(gaps)]
    judge_table(out)
    return out


def _with_contrasts(claim: Callable[..., ClaimResult], runs: Runs, min_tpp: float) -> ClaimResult:
    """The claim on its first baseline (emulated saturation where present); the comparisons on another baseline
    (plain ε) join it as secondary, so each claim has one row and one primary."""
    (_, arm), *others = baselines(runs)
    res = claim(runs, baseline=arm, min_tpp=min_tpp)
    for suffix, other in others:
        extra = claim(runs, baseline=other, suffix=suffix, min_tpp=min_tpp)
        for c in extra.comparisons:
            c.label, c.role = f"{c.label}{suffix}", SECONDARY
        res.comparisons += extra.comparisons
        res.notes += [f"{note}{suffix}" for note in extra.notes]
    res.judge()
    return res
