"""The paper's claims C1–C7, measured on a set of finished runs, each with a computed verdict.

A claim is tested by one or more comparisons. Each comparison yields one number per seed, signed so that a
positive value is the paper's direction (for example L(γ=0.5) − L(γ=1): γ = 1 better), and is judged by the
project's one rule (:mod:`smallinit.study.judging.verdicts`): Student-t over seeds; one pre-declared **primary**
comparison decides each claim, at its level under Holm over the table's primaries; the others are secondary
(shown, never deciding); **not testable here** where a precondition fails. The comparisons and their signs come
from the paper's statements; none was chosen or changed to make a verdict agree.

Preconditions are computed from the runs themselves, never from their configuration alone
(:mod:`.preconditions`):

* every loss comparison: each run trained to ≥ ``min_tokens_per_param`` tokens per non-embedding
  parameter (20 by default) and evaluated at ≥ 4 points. The gap is judged at that budget; its trend over
  the second half of training is reported beside it and withholds nothing. The gap along training is kept
  with the comparison (``trajectory``), since that curve is the finding.
* C1 and C2 on the emulated-ε arm: its embedding's norm saturated for a share of training near the paper
  scale's (within 3×, or 1 % of training); far from it, the arm does not stand for the paper's scale.
* C2: the γ = 1 baseline's RMSNorm factor at init, analytic and measured, is below 0.5 (ε can saturate).
* C3: a sink has formed in the no-gate γ = 1 runs: some layer's sink score exceeds 3× the uniform-attention
  value (H_T − 1)/(T − 1), measured on ≥ 16 sequences of ≥ 256 tokens. Without a sink the gate has nothing
  to remove, so the whole claim, its loss gains included, is not testable.
* C4's best-lr comparison: each γ's best rate (chosen on the other seeds) lies inside the lr grid.
* C6: the γ = 1 stable-rank minimum, located on other seeds than those its rebound is tested on, falls
  before the last third of training.
* C7: γ = 1 is better on average (its mean Δ_sym's interval above 0, on the other half of the tokens than the
  profile it gates) and both models beat a bigram model.
* C1's shrink: γ = 1 ahead (a positive gain) at the smallest and the largest size. C4's effective size: ≥ 3 sizes, ≥ 2 seeds per arm and
  size, matched tokens per parameter, a finite N_eff within 10× of N.

Runs are selected by their resolved configs (γ, ε, gate, size), not by folder names, so any sweep that
holds the right cells can be judged. A "size" is a model shape (width, depth, heads, d_ff, experts), so
runs with and without the gate count as the same size; the scaling fits use the number of parameters
without embeddings. "Baseline" means ε = 1e-5 with no gate — with ε scaled to emulate a d = 2048 model's
saturation at init (``model.norm_eps_width``) where such runs exist, else as given — and "fixed" ε = 1e-12
with the elementwise gate. Runs at another learning rate than the most common one are only used by the
learning-rate check (each γ at its own best rate).
"""

import importlib
import pkgutil

from smallinit.measures.norm_factor import SATURATED
from smallinit.measures.sink import SINK_RATIO, uniform_sink
from smallinit.study.judging.claims.c1 import claim_c1
from smallinit.study.judging.claims.c2 import claim_c2
from smallinit.study.judging.claims.c3 import claim_c3
from smallinit.study.judging.claims.c4 import best_lr_comparison, claim_c4
from smallinit.study.judging.claims.c5 import FLOW_TOLERANCE, claim_c5
from smallinit.study.judging.claims.c6 import claim_c6
from smallinit.study.judging.claims.c7 import EASY_BINS, MID_BINS, NOISY_BINS, claim_c7, gaps_from_compares
from smallinit.study.judging.claims.comparison import (
    NOT_RUN,
    PRIMARY,
    SECONDARY,
    ClaimResult,
    Comparison,
    judge_table,
    not_run,
)
from smallinit.study.judging.claims.judge import PAPER, judge_all, with_contrasts
from smallinit.study.judging.claims.loss import gap_trajectory, loss_comparison
from smallinit.study.judging.claims.preconditions import regime_problem, sink_formed
from smallinit.study.judging.claims.registry import CLAIMS, QUESTION, Claim, judge, register, registered
from smallinit.study.judging.claims.selection import (
    BASELINE,
    EMULATED,
    EMULATED_WIDTH,
    FIXED,
    Run,
    Runs,
    measured_factor_at_init,
    paired,
    reference_lr,
    sink_layers,
    sink_mean,
    size_label,
    val_loss,
)
from smallinit.study.judging.power import (
    MAX_SIZE_RATIO,
    MIN_EVALS,
    MIN_TOKENS_PER_PARAM,
    SINK_SEQS,
    SINK_TOKENS,
)

__all__ = [
    "BASELINE",
    "CLAIMS",
    "Claim",
    "EASY_BINS",
    "EMULATED",
    "EMULATED_WIDTH",
    "FIXED",
    "FLOW_TOLERANCE",
    "MAX_SIZE_RATIO",
    "MID_BINS",
    "MIN_EVALS",
    "MIN_TOKENS_PER_PARAM",
    "NOISY_BINS",
    "NOT_RUN",
    "SATURATED",
    "SINK_RATIO",
    "SINK_SEQS",
    "SINK_TOKENS",
    "PRIMARY",
    "SECONDARY",
    "ClaimResult",
    "Comparison",
    "Run",
    "Runs",
    "best_lr_comparison",
    "claim_c1",
    "claim_c2",
    "claim_c3",
    "claim_c4",
    "claim_c5",
    "claim_c6",
    "claim_c7",
    "gap_trajectory",
    "gaps_from_compares",
    "PAPER",
    "QUESTION",
    "judge",
    "judge_all",
    "judge_table",
    "register",
    "registered",
    "with_contrasts",
    "loss_comparison",
    "not_run",
    "measured_factor_at_init",
    "paired",
    "reference_lr",
    "regime_problem",
    "sink_formed",
    "sink_layers",
    "sink_mean",
    "size_label",
    "uniform_sink",
    "val_loss",
]

# Every module of this package is imported, so a claim that registers itself in a module of its own is in the
# registry without another file naming it.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
