"""Which claims a recipe scale's design decides, before anything runs, and with what power.

The claims code itself decides: every planned cell becomes a run holding what the design fixes
(its config, size, tokens per parameter, and the evaluation and analysis steps its config's schedule rules give)
with every outcome unknown (``PlannedRun``). The recipe's claims, from the one registry
(smallinit.study.judging.claims.registry), are judged on these runs: whatever is "not testable here" fails by
design — seeds, tokens per parameter, evaluations, the sink sample, ε's saturation by the formula, sizes — and
will fail whatever the runs show. The preconditions that depend on outcomes are skipped on planned runs and
named, per claim, as decided by the runs. No outcome is invented.

Power. For each claim, the minimum detectable effect at 80 % power of its paired t-test over the planned
seeds (smallinit.study.judging.power), at the level its table judges it (Holm over the primaries the design decides:
α/k for k of them, 0.05 for a recipe that decides one), in the claim's own unit (nats for a loss gap, the flow
exponent, the stable rank, Δ_sym, an accuracy) from a seed sd of that quantity: ``--seed-sd CLAIM=X``, else for a
loss gap ``--seed-sd X`` or the recipe's pilot (``recipe.seed_sd``), else the CPU study's measured sd of it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smallinit.config import Config, flatten
from smallinit.measures.condensation import MatrixStat
from smallinit.measures.sink import Sink
from smallinit.monitor.records import AnalysisRecord, EvalRecord, NormFactorRecord
from smallinit.monitor.runs import Run
from smallinit.study.judging.claims import NOT_RUN, ClaimResult, Comparison, Runs, registered
from smallinit.study.judging.findings import flow_design, token_gap_pairs
from smallinit.study.judging.power import (
    ALPHA,
    MIN_SEEDS,
    POWER,
    minimum_detectable_by,
    minimum_detectable_effect,
    power_of_test,
    seeds_for_power,
)
from smallinit.study.judging.verdicts import seeds_problem

# The seed sd of a paired final-loss gap, when neither --seed-sd nor the recipe gives one: the median sd over
# 3 seeds of the 15 paired loss gaps of the CPU study's earlier run (docs/findings-cpu.md, its verdict table), in nats.
CPU_STUDY_SEED_SD = 0.017


@dataclass
class ClaimPlan:
    """What the design lets a claim's analysis judge. The verdict is its primary comparison's, so the claim is
    decided when the primary passes every design-level precondition."""

    claim: str
    statement: str
    primary: str  # the primary comparison's label
    decides: bool  # the primary passes the design-level preconditions
    seeds: int  # the primary's paired seeds …
    mde: float  # … and its minimum detectable effect at 80 % power, in ``unit`` (inf: none, or no seed sd)
    unit: str = "nats"
    alpha: float = (
        ALPHA  # the level its table judges its primary at (Holm's first step over the decided primaries)
    )
    mde_sds: float = math.inf  # the MDE in seed sds, which needs no seed sd
    seed_sd: float | None = None  # in ``unit``; None where nothing measured it
    seed_sd_source: str = ""
    fewest_seeds: int = 0  # over every testable comparison, primary and secondary
    most_seeds: int = 0
    failing: dict[str, str] = field(default_factory=dict)  # comparison → why it cannot be judged, by design
    testable: list[str] = field(default_factory=list)
    not_run: str = ""  # why the design does not run the claim at all (the recipe scale's options.dropped)
    rule: str = ""  # the primary's rule where it is more than a paired t-test (its MDE is then that rule's)
    # each testable secondary judged over seeds: label → seeds, alpha (Holm's first step over the claim's
    # secondaries), mde_sds, mde, unit, rule, the seed sd of its own quantity and its source, and the power at the
    # recipe's design effect with the seeds 80 % needs (a loss gap)
    secondaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    design: dict[str, Any] | None = None  # the primary's power at the recipe's design effect (nats claims)

    @property
    def partly(self) -> bool:
        """Some comparisons can be judged, not all."""
        return bool(self.testable) and bool(self.failing)


UNKNOWN = math.nan  # an outcome the plan cannot know


class PlannedRun(Run):
    """A cell as its design fixes it, read like a finished run: its config, size, tokens per parameter and schedule
    (the evaluations and analysis steps the config's own rules give), with every outcome unknown (NaN). The claims
    check their design preconditions on it and skip their outcome preconditions (``Run.planned``)."""

    planned = True

    def __init__(self, sweep: str, cell_id: str, cfg: Config, nonembed: int):
        flat = flatten(cfg.to_dict())
        flat.setdefault("model.norm_eps_width", 0)
        super().__init__(
            Path(sweep) / cell_id, cell_id, flat, {"step": cfg.train.steps, "params_nonembed": nonembed}
        )
        self.planned_cfg = cfg

    @property
    def cfg(self) -> Config:
        return self.planned_cfg

    @property
    def evals(self) -> list[EvalRecord]:
        return [EvalRecord(s, UNKNOWN) for s in self.planned_cfg.train.eval_steps()]

    @property
    def val_curve(self) -> list[tuple[int, float]]:
        return [(e.step, e.val_loss) for e in self.evals]

    @property
    def analysis(self) -> list[AnalysisRecord]:  # every measurement unknown (one stable rank stands for all)
        cfg = self.planned_cfg
        return [
            AnalysisRecord(
                step=s,
                sink=Sink((UNKNOWN,) * cfg.model.n_layers, mean=UNKNOWN),
                matrices=(MatrixStat("unknown", (), UNKNOWN, None),),
            )
            for s in cfg.analysis.steps(cfg.train.steps)
        ]

    @property
    def norm_records(self) -> list[NormFactorRecord]:
        cfg = self.planned_cfg
        return [NormFactorRecord(s, {}) for s in cfg.analysis.norm_steps(cfg.train.steps)]

    @property
    def lost(self) -> bool:
        return False

    @property
    def val_loss(self) -> float:
        return UNKNOWN


def planned_measurements(runs: Runs, claims: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """What the analysis will measure beside the runs for these claims, as the findings would choose it (which γ,
    widths and seeds; which model pairs), every value unknown."""
    dropped = options.get("dropped", {})
    needs = {need for key in claims if key not in dropped for need in registered(key).needs}
    out: dict[str, Any] = {}
    if "anchor" in needs:
        out["anchor"] = {
            r.path: {"heldout_reasoning": UNKNOWN, "heldout_memorising": UNKNOWN}
            for r in runs
            if str(r.config.get("data.corpus", "")).startswith("builtin:anchor")
        }
    gammas, widths, seeds = flow_design(options)
    if "flow" in needs and len(widths) >= 2:  # one fitted exponent per γ and seed
        out["flow"] = {
            "gammas": gammas,
            "seeds": seeds,
            "seed_slopes": [[UNKNOWN] * len(seeds) for _ in gammas],
            "planned": True,
        }
    if "gaps" in needs:  # one token comparison per seed pair; its profile unknown
        pairs, _ = token_gap_pairs(runs)
        out["gaps"] = dict.fromkeys(pairs) or None
    return out


def claim_plans(
    results: list[ClaimResult],
    loss_sd: tuple[float, str],
    claim_sd: dict[str, float],
    design: float | None = None,
) -> list[ClaimPlan]:
    """Each claim's plan at the level its table judges it: Holm over the k primaries the design decides gives the
    first of them α/k (a recipe that decides one claim judges it at α), in the claim's unit from its seed sd. A
    comparison whose quantity has its own sd (``Comparison.planned_sd``) is priced at that one; with a ``design``
    effect (nats) each loss comparison says its power at it and the seeds 80 % would need."""
    plans, powers, raw_levels = [], [], []
    for res in results:
        problems = {c.label: _design_problem(res, c) for c in res.comparisons}
        failing = {label: why for label, why in problems.items() if why}
        testable = [c for c in res.comparisons if not problems[c.label]]
        counts = [_seeds(c) for c in testable if _seeds(c)] or [0]
        primary = res.primary
        n = 0 if problems[primary.label] else _seeds(primary)
        key = res.claim.split()[0]
        claim = registered(key)
        unit = claim.unit
        sd, source = (
            (claim_sd[key], f"--seed-sd {key}={claim_sd[key]:g}")
            if key in claim_sd
            else primary.planned_sd  # its quantity's own (Q1's best-lr gap)
            or (loss_sd if unit == "nats" else claim.seed_sd or (None, ""))
        )
        dropped = res.untestable.removeprefix(f"{NOT_RUN}: ") if res.untestable.startswith(NOT_RUN) else ""
        plans.append(
            ClaimPlan(
                res.claim,
                res.statement,
                primary.label,
                not problems[primary.label],
                n,
                math.inf,
                unit=unit,
                seed_sd=sd,
                seed_sd_source=source,
                fewest_seeds=min(counts),
                most_seeds=max(counts),
                failing={} if dropped else failing,
                testable=[c.label for c in testable],
                not_run=dropped,
                rule=primary.power_why,
            )
        )
        powers.append(primary.power)
        raw_levels.append(primary.raw_level)
        secondaries = [c for c in testable if c is not primary]
        level = ALPHA / max(
            1, len(secondaries)
        )  # Holm's first step over the claim's secondaries (or α/m spent)
        for c in secondaries:
            if c.estimate is not None:  # a bootstrap interval: the runs' fit decides it, not the seeds
                continue
            own, own_source = c.planned_sd or (loss_sd if c.unit == "nats" else (sd, source))
            own_unit = c.unit or unit
            power = functools.partial(c.power, alpha=level) if c.power is not None else None
            mde_sds = minimum_detectable_by(power) if power else _mde(1.0, _seeds(c), level)
            if own is not None and design and own_unit == "nats":
                had = power(design / own) if power else power_of_test(design, own, _seeds(c), level)
            else:
                had = 0.0
            plans[-1].secondaries[c.label] = {
                "seeds": _seeds(c),
                "alpha": level,
                "mde_sds": finite(mde_sds),
                "mde": finite(mde_sds * own) if own is not None else None,
                "unit": own_unit,
                "rule": c.power_why or f"paired t-test, Holm over the claim's {len(secondaries)} secondaries",
                "seed_sd": own,
                "seed_sd_source": own_source,
                "design": _at_design(design, own, own_unit, had, c.raw_level(level)),
            }
    alpha = ALPHA / max(1, sum(c.decides for c in plans))
    for c, power, raw_level in zip(plans, powers, raw_levels):
        c.alpha = alpha
        c.mde_sds = (
            _mde(1.0, c.seeds, alpha)
            if power is None or not c.decides
            else minimum_detectable_by(functools.partial(power, alpha=alpha))
        )
        c.mde = c.mde_sds * c.seed_sd if c.seed_sd is not None else math.inf
        if c.decides and design and c.seed_sd is not None:
            had = (
                power(design / c.seed_sd, alpha)
                if power
                else power_of_test(design, c.seed_sd, c.seeds, alpha)
            )
            c.design = _at_design(design, c.seed_sd, c.unit, had, raw_level(alpha))
    return plans


def _at_design(
    design: float | None, sd: float | None, unit: str, power: float, alpha: float = ALPHA
) -> dict[str, Any] | None:
    """A loss comparison's power at the recipe's design effect, and the seeds the paired t-test would need for 80 %
    at its seed sd and ``alpha`` (the best-lr test has the t-test's power at its seeds at the level its raw p is
    judged at, passed here: tests/study/test_best_lr.py)."""
    if not design or sd is None or unit != "nats":
        return None
    return {
        "effect": design,
        "power": power,
        "seeds_for_80": seeds_for_power(design, sd, alpha, POWER, 10_000),
    }


def finite(x: float) -> float | None:
    """A number JSON can hold: inf (no MDE) as None."""
    return x if math.isfinite(x) else None


def _design_problem(res: ClaimResult, c: Comparison) -> str:
    """Why the design cannot judge ``c`` ("" if it can): a failed precondition, or too few paired seeds for a
    t-test (its planned values are unknown, so counted, not tested)."""
    return res.untestable or c.untestable or ("" if c.estimate is not None else seeds_problem(_seeds(c)))


def _seeds(c: Comparison) -> int:
    """The seeds a comparison of planned runs pairs (their values are all unknown)."""
    return len(c.samples) + len(c.unknown)


def _mde(seed_sd: float, seeds: int, alpha: float) -> float:
    return minimum_detectable_effect(seed_sd, seeds, alpha, POWER) if seeds >= MIN_SEEDS else math.inf
