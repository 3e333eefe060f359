"""What a user sees of a plan: its cost table, each claim's decidability and power, and its SLURM jobs."""

from __future__ import annotations

import math

from smallinit.study.judging.claims import CLAIMS, NOT_RUN, QUESTION
from smallinit.study.judging.power import ALPHA, POWER
from smallinit.study.planning.cost import CellPlan, hours
from smallinit.study.planning.plan import Plan
from smallinit.study.running.sbatch import SlurmOptions


def format_plan(plan: Plan) -> str:
    hw = plan.hardware
    lines = [f"plan: recipe {plan.recipe} --scale {plan.scale} on {hw.describe()}"]
    if plan.timing is not None:
        lines.append(f"  wall time {plan.timing.describe()}")
    head = (
        f"  {'sweep':<12} {'size':<10} {'runs':>5} {'params':>9} {'non-emb':>9} {'tokens/run':>11} {'tok/param':>9} "
        f"{'evals':>5} {'FLOPs/run':>10} {'GiB/dev':>8} {'wall':>9}"
    )
    lines += [head, "  " + "-" * (len(head) - 2)]
    groups: dict[tuple[str, str], list[CellPlan]] = {}
    for c in plan.cells:
        groups.setdefault((c.sweep, c.size), []).append(c)
    for (sweep, size), cs in groups.items():
        c = max(cs, key=lambda x: x.flops)
        wall = plan.group_wall_s(cs)
        lines.append(
            f"  {sweep:<12} {size:<10} {len(cs):>5} {_si(c.params):>9} {_si(c.params_nonembed):>9} "
            f"{_si(c.tokens):>11} {min(x.tokens_per_param for x in cs):>9.1f} {c.evaluations:>5} "
            f"{c.flops:>10.2e} {c.memory_gib:>8.2f} {hours(wall):>9}"
        )
    unit = "CPU-core" if hw.kind == "cpu" else "GPU"
    lines.append(
        f"  total: {len(plan.cells)} runs, {plan.flops:.3g} FLOPs, {hours(plan.wall_s)} wall, "
        f"{plan.device_hours:,.1f} {unit}-hours"
    )
    decided = sum(c.decides for c in plan.claims)
    alpha = plan.claims[0].alpha if plan.claims else ALPHA
    lines.append(
        f"claims (minimum detectable effect of each primary at {POWER:.0%} power, two-sided, at the level its "
        f"table judges it: α = {alpha:.3g}, Holm's first step over the {decided} primar"
        f"{'y' if decided == 1 else 'ies'} this design decides; in the claim's own unit):"
    )
    for c in plan.claims:
        if c.decides:
            at = (
                f"{c.mde:.3g} {c.unit} at seed sd {c.seed_sd:g}"
                if c.seed_sd is not None
                else f"no seed sd of {c.unit} measured: pass --seed-sd {c.claim.split()[0]}=X"
            )
            lines.append(
                f"  {c.claim:<12} decides: primary {c.primary} on {c.seeds} seeds, MDE {c.mde_sds:.2f} seed sds "
                f"({at}{'; ' + c.rule if c.rule else ''}); {len(c.testable)} of "
                f"{len(c.testable) + len(c.failing)} comparisons testable, {c.fewest_seeds}–{c.most_seeds} seeds"
            )
            lines += _design_line(c.design, c.seeds, c.unit)
            for label, s in c.secondaries.items():
                at = f" = {s['mde']:.3g} {s['unit']}" if s["mde"] is not None else ""
                own = (
                    f" at seed sd {s['seed_sd']:g} ({s['seed_sd_source']})"
                    if s["seed_sd"] is not None and s["seed_sd"] != c.seed_sd
                    else ""
                )
                lines.append(
                    f"      · {label}: {s['seeds']} seeds, MDE {s['mde_sds'] or math.inf:.2f} seed sds{at}{own} at "
                    f"α = {s['alpha']:.3g} ({s['rule']})"
                )
                lines += ["  " + x for x in _design_line(s["design"], s["seeds"], s["unit"])]
        elif c.not_run:
            lines.append(f"  {c.claim:<12} {NOT_RUN}: {c.not_run}")
        else:
            lines.append(
                f"  {c.claim:<12} cannot decide: its primary ({c.primary}) fails a precondition by design"
                + (f"; {len(c.testable)} secondary comparison(s) testable" if c.testable else "")
            )
        if CLAIMS[c.claim.split()[0]].question:
            lines.append(f"      ({QUESTION})")
        for reason in _distinct(c.failing):
            lines.append(f"      ↳ {reason}")
    short = _short_of_power(plan)
    if short:
        lines.append(
            f"short of {POWER:.0%} power at the design effect with the seeds this design runs: "
            + "; ".join(short)
        )
    outcome = [
        k for k in (c.claim.split()[0] for c in plan.claims if c.decides) if CLAIMS[k].decided_by_the_runs
    ]
    if outcome:
        lines.append(
            "still decided by the runs themselves (the plan cannot know them): "
            + "; ".join(f"{k} {CLAIMS[k].decided_by_the_runs}" for k in outcome)
        )
    sources = {
        f"{c.seed_sd:g} {c.unit}: {c.seed_sd_source}"
        for c in plan.claims
        if c.decides and c.seed_sd is not None
    }
    lines += [f"seed sd {s}" for s in sorted(sources)]
    lines += [f"note: {n}" for n in plan.notes]
    lines += _slurm_lines(plan, plan.slurm) if plan.slurm is not None else []
    return "\n".join(lines)


def _slurm_lines(plan: Plan, opts: SlurmOptions) -> list[str]:
    """How the plan's cells run as SLURM jobs: how many, of what size, for how long."""
    hw, sweeps = plan.hardware, len({c.sweep for c in plan.cells})
    secs = sorted(hw.seconds(c.flops, c.tokens) for c in plan.cells)
    usable = opts.limit_s - opts.signal_s
    at_once = min(opts.max_running or len(secs), len(secs))
    size = (
        f"{opts.nodes} node(s) × {opts.gpus_per_node} GPUs, {opts.cpus_per_task} CPUs per node"
        if opts.gpus
        else f"one process on {opts.cpus_per_task} CPU core(s)"
    )
    where = "".join(f", {k} {v}" for k, v in (("partition", opts.partition), ("account", opts.account)) if v)
    throttle = f"at most {opts.max_running}" if opts.max_running else "as many as SLURM allows"
    lines = [
        f"slurm: {len(secs)} jobs in {sweeps} job array(s), {throttle} at a time; each {size}, time limit "
        f"{opts.time}{where}",
        f"  training per job: {hours(secs[0])} to {hours(secs[-1])} (median {hours(secs[len(secs) // 2])})",
    ]
    longer = [s for s in secs if s > usable]
    if longer:
        lines.append(
            f"  {len(longer)} job(s) need more than the {hours(usable)} before the stop signal: each checkpoints, "
            f"is requeued and resumes, in up to {max(math.ceil(s / usable) for s in longer)} parts"
        )
    else:
        lines.append(f"  every job fits its time limit ({hours(usable)} before the stop signal)")
    unit = "GPU" if opts.gpus else "CPU-core"
    lines.append(
        f"  all jobs: ≈ {hours(max(secs[-1], sum(secs) / at_once))} wall with {at_once} running at a time, "
        f"{sum(secs) * hw.devices / 3600:,.1f} {unit}-hours"
    )
    return lines


def _short_of_power(plan: Plan) -> list[str]:
    """Each decided claim's primary and secondary whose power at the recipe's design effect is below 80 %."""
    out = []
    for c in plan.claims:
        if not c.decides:
            continue
        lines = [("▶", c.primary, c.design, c.seeds)] + [
            ("·", label, s["design"], s["seeds"]) for label, s in c.secondaries.items()
        ]
        for mark, label, design, seeds in lines:
            if design and design["power"] < POWER:
                need = design["seeds_for_80"]
                out.append(
                    f"{c.claim.split()[0]} {mark} {label} (power {design['power']:.2f} with {seeds} seeds; "
                    + (f"{need} needed)" if need <= 10_000 else "more than 10,000 needed)")
                )
    return out


def _design_line(design: dict | None, seeds: int, unit: str) -> list[str]:
    """A comparison's power at the recipe's design effect, and whether this design reaches 80 % at it."""
    if not design:
        return []
    need = design["seeds_for_80"]
    reach = (
        f"{POWER:.0%} needs {need} seeds, {'more than' if need > seeds else 'within'} the {seeds} this design runs"
        if need <= 10_000
        else f"{POWER:.0%} is out of reach (more than 10,000 seeds)"
    )
    return [f"      ↳ power at the design's +{design['effect']:g} {unit}: {design['power']:.2f}; {reach}"]


def _distinct(failing: dict[str, str], limit: int = 6) -> list[str]:
    """Each reason once (comparisons of several sizes often share one), at most ``limit`` of them."""
    seen: dict[str, str] = {}
    for label, reason in failing.items():
        seen.setdefault(reason, f"{label}: {reason}")
    out = list(seen.values())
    return out[:limit] + ([f"… and {len(out) - limit} more"] if len(out) > limit else [])


def _si(x: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.0f}"
