"""What a report says of a run that no study judges: the γ, init recipe and ε its model started with, whether its
norms saturated (→ ε), whether its matrices still look freshly drawn, whether a sink formed (→ the gate), its
residual flow against d^(1−γ) at its own width, and how its matrices condensed — each measured from the run's own
records and weights, with one line on what it means for this run. What the weights say (γ, recipe, each norm's ε
and factor at step 0, fresh-random matrices) is read from the audit (smallinit.auditing) of the weights the run
started from and of its newest checkpoint; a folder a Monitor wrote beside another engine, whose weights are not
here, is told from its records. Built here as data; ``smallinit.report.html`` renders it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from smallinit.auditing import AuditResult
from smallinit.auditing.audit import audit_latest, audit_start
from smallinit.errors import SmallinitError
from smallinit.init.scale import ONE_GAMMA
from smallinit.io import read_json
from smallinit.measures.norm_factor import SATURATED, relative_factor
from smallinit.measures.sink import SINK_RATIO, sink_threshold, uniform_sink
from smallinit.model import Transformer
from smallinit.monitor.monitor import MONITOR_FILE
from smallinit.monitor.runs import Run

CONDENSED = 0.7  # stable rank fallen below this share of its start: the rows align along fewer directions
BALANCED = 2.0  # a flow ratio within this factor of 1: branch and embedding balance (the γ = 1 regime)
# the report audits a run by building its step-0 model and loading its newest checkpoint on the CPU, fp32: up to
# 2 × 4 B per parameter; a larger model is left to `smallinit audit`, which the user runs knowing the cost
AUDIT_MAX_PARAMS = 100_000_000


@dataclass(frozen=True)
class Observation:
    """One measurement of the run, what it is held against, and what it means for this run."""

    what: str
    value: str
    reference: str
    meaning: str


@dataclass(frozen=True)
class Diagnosis:
    run: str
    observations: tuple[Observation, ...]


def _gamma(run: Run, start: AuditResult | None) -> tuple[float | None, Observation]:
    """The γ the model started with: the caller's, and the one read from the weights at step 0 (the audit's, else
    what a Monitor read at its start); whether the matrices follow one γ is the audit's recipe where there is one."""
    given = run.config.get("model.gamma")
    read = _gamma_read(run, start)
    if read is not None:
        median, low, high, n = read
        value = f"{median:.2f} from the weights at step 0 ({low:.2f}–{high:.2f} over {n} matrices)"
        if given is not None:
            value += f"; given {given:g}"
        base = start.recipe.roles.get("matrices") if start is not None else None
        if start is not None:
            one_rule = base is not None and base.rule in ("fan-in γ", "either")
        else:
            one_rule = high - low < ONE_GAMMA
        if not one_rule:
            drawn = base.describe if base is not None else "a fixed std, as most libraries draw"
            meaning = (
                f"the matrices follow no one γ: their stds do not scale as d_in^(−γ) ({drawn}); "
                "smallinit.gamma_init_(model, gamma=1.0) draws every matrix by the rule"
            )
        else:
            meaning = _gamma_meaning(median)
        return (given if given is not None else median), Observation(
            "γ at step 0", value, "σ = d_in^(−γ)", meaning
        )
    if given is not None:
        return given, Observation(
            "γ at step 0", f"{given:g} (as the run was configured)", "σ = d_in^(−γ)", _gamma_meaning(given)
        )
    return None, Observation(
        "γ at step 0",
        "unknown",
        "σ = d_in^(−γ)",
        "the run's first measurement was not at step 0, so the weights' γ was not read; the monitor reads it "
        "when it starts with the run",
    )


def _gamma_read(run: Run, start: AuditResult | None) -> tuple[float, float, float, int] | None:
    """(median, low, high, matrices) of the γ the weights at step 0 imply, or None where they were not read."""
    if start is not None:
        gammas = [r.gamma for r in start.matrices if r.gamma is not None]
        if gammas:
            return statistics.median(gammas), min(gammas), max(gammas), len(gammas)
        return None
    known = read_json(run.path / MONITOR_FILE) if run.monitored else None
    read = known.get("gamma_at_start") if isinstance(known, dict) else None
    median = read.get("median") if isinstance(read, dict) else None
    if isinstance(median, (int, float)):
        return median, read["low"], read["high"], read["matrices"]
    return None


def _recipe(start: AuditResult) -> Observation:
    """The rule each role's σ follows at step 0, as the audit names it."""
    recipe = start.recipe
    base = recipe.roles.get("matrices")
    if recipe.disagree:
        roles = ", ".join(d.split(":", 1)[0] for d in recipe.disagree)
        meaning = (
            f"the roles follow different rules ({roles}): each role's scale sets how much its matrices "
            "move the residual stream at the start, beside γ"
        )
    elif base is not None and base.rule in ("fan-in γ", "either"):
        meaning = "one γ rule in every role, as smallinit.gamma_init_ draws"
    else:
        meaning = "no one γ rule: smallinit.gamma_init_(model, gamma=1.0) draws every matrix by it"
    return Observation(
        "init recipe at step 0",
        recipe.summary,
        "fixed std, fan-in γ (σ = d_in^(−γ)), depth-scaled 1/√(k·L), zero, per role",
        meaning,
    )


def _fresh(latest: AuditResult) -> Observation:
    """The matrices of the newest checkpoint that still look as an init draws them."""
    judged = [r for r in latest.matrices if r.fresh_random is not None]
    fresh = latest.fresh_random
    shown = f" ({', '.join(fresh[:3])}{', …' if len(fresh) > 3 else ''})" if fresh else ""
    if not fresh:
        meaning = "training moved every matrix off its random draw"
    elif not latest.step:
        meaning = "the newest checkpoint is of step 0: nothing was trained yet"
    else:
        meaning = (
            f"after {latest.step} steps these matrices are still as an init draws them: not trained (frozen, "
            "outside the optimizer, a learning rate too small to move them) or re-initialised on load"
        )
    return Observation(
        f"matrices still fresh-random at step {latest.step}",
        f"{len(fresh)} of {len(judged)} matrices{shown}",
        "an i.i.d. draw: top singular value inside the random-matrix bulk, no heavy tails",
        meaning,
    )


def _gamma_meaning(gamma: float) -> str:
    if abs(gamma - 1) < 0.1:
        return "the paper's small init: it pays off with both fixes, a small ε and a gated attention"
    if abs(gamma - 0.5) < 0.1:
        return "the usual scale; the paper finds γ = 1 better once ε = 1e-12 and the attention is gated"
    return f"γ = {gamma:.2f}: the paper's loss is best at γ = 1 and worse above it"


def _norm(run: Run, gamma: float | None, d: int | None, start: AuditResult | None) -> Observation | None:
    """Each norm's factor at step 0 and the ε it used: the audit's (each norm's own ε), else the Monitor's
    step-0 record with the config's ε."""
    measured = [n for n in start.norms if n.factor is not None] if start is not None else []
    if measured:
        factors = {n.name: n.factor for n in measured}
        saturated = sum(bool(n.saturated) for n in measured)
        used = sorted({n.eps for n in measured if n.eps is not None})
        eps = used[0] if len(used) == 1 else None
        eps_words = (
            f"ε = {eps:g}" if eps is not None else f"ε {used[0]:g}–{used[-1]:g}" if used else "their ε"
        )
    else:
        factors = next((a.norm_factor for a in run.analysis if a.step == 0 and a.norm_factor), None)
        factors = factors or next(
            (n.norm_factor for n in run.norm_records if n.step == 0 and n.norm_factor), None
        )
        if not factors:
            return None
        saturated = sum(f < SATURATED for f in factors.values())
        eps = run.norm_eps  # the ε the norms used, scaled where the run emulates a wider model
        eps_words = f"ε = {eps:g}" if eps is not None else "their ε"
    low, mean = min(factors.values()), statistics.fmean(factors.values())
    ref = f"< {SATURATED}: ε sets the scale"
    if gamma is not None and d and isinstance(eps, (int, float)):
        ref += f"; the formula at γ {gamma:.2f}, ε {eps:g}, d {d}: {relative_factor(gamma, eps, d):.2f}"
    width = run.config.get("model.norm_eps_width")
    if saturated and width:  # the run chose this saturation: it emulates a wider model's, so no fix to advise
        meaning = (
            f"{saturated} of {len(factors)} norms saturated, as this run emulates: {eps_words} "
            f"(model.norm_eps {run.config['model.norm_eps']:g} at width {width}, scaled to d = {d}) sets their "
            "scale, as it would at that width"
        )
    elif saturated:
        meaning = (
            f"{saturated} of {len(factors)} norms saturated: {eps_words}, not the input, sets their scale and "
            "undoes the small init; smallinit.set_norm_eps_(model, 1e-12)"
        )
    else:
        meaning = f"every norm sees the init scale: {eps_words} is small enough for this γ and width"
    return Observation(
        "RMSNorm factor at step 0", f"min {low:.3f}, mean {mean:.3f} over {len(factors)} norms", ref, meaning
    )


def _sink(run: Run) -> Observation | None:
    measured = [a for a in run.analysis if a.sink]
    tokens = run.config.get("data.seq_len")
    if not measured or not isinstance(tokens, int) or tokens < 2:
        return None
    first, last = measured[0], measured[-1]
    top = max(last.sink.per_layer)
    threshold = sink_threshold(tokens)
    gate = run.config.get("model.gate")
    if top > threshold:
        meaning = (
            "a sink formed although the attention is gated"
            if gate not in (None, "none")
            else "a sink formed: queries park their attention on the first token; the paper's gate removes it "
            "(smallinit.add_attention_gate_)"
        )
    else:
        meaning = "no sink so far: attention on the first token stays near uniform"
    return Observation(
        "attention sink along training",
        f"largest layer {top:.3f} at step {last.step} (mean over layers {first.sink.mean:.3f} at step "
        f"{first.step} → {last.sink.mean:.3f})",
        f"uniform attention {uniform_sink(tokens):.3f} on {tokens} tokens; formed above {SINK_RATIO:g}× = "
        f"{threshold:.3f}",
        meaning,
    )


def _flow(run: Run, gamma: float | None, d: int | None) -> Observation | None:
    at_start = next((a for a in run.analysis if a.step == 0 and a.residual_flow is not None), None)
    if at_start is None:
        return None
    ratio = at_start.residual_flow
    ref = (
        f"≍ d^(1−γ) = {d}^{1 - gamma:.2f} = {d ** (1 - gamma):.2f}"
        if gamma is not None and d
        else "≍ d^(1−γ)"
    )
    if ratio > BALANCED:
        meaning = "the residual branch dominates the embedding at init (the γ < 1 regime)"
    elif ratio < 1 / BALANCED:
        meaning = (
            "the network starts near the identity: the branch barely moves the embedding (the γ > 1 regime)"
        )
    else:
        meaning = "branch and embedding balance at init, as the paper predicts at γ = 1"
    return Observation("residual flow ‖h_L − e‖/‖e‖ at step 0", f"{ratio:.3f}", ref, meaning)


def _condensation(run: Run) -> Observation | None:
    ranked = [a for a in run.analysis if a.matrices]
    if len(ranked) < 2:
        return None
    ranks = {a.step: a.by_matrix("stable_rank") for a in ranked}
    names = [n for n in ranks[ranked[0].step] if all(n in r for r in ranks.values())]
    if not names:
        return None

    def mean_rank(a) -> float:
        return statistics.fmean(ranks[a.step][n] for n in names)

    start, end = mean_rank(ranked[0]), mean_rank(ranked[-1])
    low = min(ranked, key=mean_rank)
    course = f"{start:.2f} at step {ranked[0].step} → {end:.2f} at step {ranked[-1].step}"
    if low is not ranked[-1] and low is not ranked[0]:
        course += f" (lowest {mean_rank(low):.2f} at step {low.step})"
    if mean_rank(low) < CONDENSED * start:
        meaning = (
            "the matrices condensed (rows aligned along few directions)"
            + (" and have since expanded" if end > 1.2 * mean_rank(low) else ", and are still condensed")
            + ", as the paper finds early in training with γ = 1"
        )
    else:
        meaning = "no condensation so far: the stable rank stays near its start"
    return Observation(
        "condensation: stable rank",
        f"mean over {len(names)} matrices {course}",
        f"condensed below {CONDENSED:g}× its start",
        meaning,
    )


def _audits(run: Run, max_params: int) -> tuple[AuditResult | None, AuditResult | None, Observation | None]:
    """The audits of the weights ``run`` started from and of its newest checkpoint (None: not here), or why
    they could not be read."""
    if run.monitored:  # the weights are the engine's, not in this folder
        return None, None, None
    n = Transformer.count_params(run.cfg.model)[0]
    if n > max_params:
        why = (
            f"{n / 1e6:,.0f}M parameters: the report audits models up to {max_params / 1e6:,.0f}M (it builds the "
            f"step-0 model and loads the newest checkpoint, {8 * n / 2**30:.1f} GiB here); "
            f"`smallinit audit {run.path}` audits this one"
        )
        return None, None, Observation("the weights (smallinit audit)", "not read here", "", why)
    try:
        return audit_start(run.cfg, source=run.name), audit_latest(run.path), None
    except SmallinitError as e:
        return None, None, Observation("the weights (smallinit audit)", "not read", "", str(e))


def diagnose(run: Run, *, max_params: int = AUDIT_MAX_PARAMS) -> Diagnosis:
    """The run's own measurements, each with what it means; those its records lack are left out. Its weights are
    audited where the model has at most ``max_params`` parameters."""
    d = run.config.get("model.d_model")
    d = d if isinstance(d, int) and d > 1 else None
    start, latest, unread = _audits(run, max_params)
    gamma, first = _gamma(run, start)
    rest = (
        unread,
        _recipe(start) if start is not None else None,
        _norm(run, gamma, d, start),
        _fresh(latest) if latest is not None else None,
        _sink(run),
        _flow(run, gamma, d),
        _condensation(run),
    )
    return Diagnosis(run.name, (first, *(f for f in rest if f is not None)))
