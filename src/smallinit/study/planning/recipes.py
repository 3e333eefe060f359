"""Named recipes: the paper's experiments as shipped sweep files plus the findings step that reads them.

A recipe is a TOML file in ``smallinit/study/planning/recipes/`` (or any path)::

    [recipe]
    title = "..."
    claims = ["C2", "C3"]        # what its findings step judges
    findings = "fig1"             # a name in smallinit.study.judging.findings.FINDINGS
    seed_sd = 0.04                # optional: a pilot's seed sd of its loss gaps, for the plan's power
    seed_sd_source = "..."        # where that sd was measured
    design_effect = 0.05          # optional: the loss gap (nats) its seeds are sized for; the plan gives each
                                  # loss comparison's power at it, and the seeds 80 % would need

    [base]                        # config keys for every sweep of every scale (lowest priority)
    ...
    [scales.cpu]
    description = "... (measured: N min on 2 cores)"
    [scales.cpu.base]             # config keys for every sweep of this scale
    [scales.cpu.options]          # parameters of the findings step
    [scales.cpu.budget]           # optional: training length by size, see apply_budget
    [scales.cpu.sweeps.NAME]      # one or more sweeps, in the sweep-file format ([base], [grid], [arms.*], [sizes.*])

Running it (``smallinit recipe NAME --scale cpu --out DIR``) runs every sweep of the scale into
``DIR/<sweep name>/`` (re-running continues them), then the findings step, which writes ``DIR/findings.json``
(the claims with their comparisons and verdicts, and the numbers behind the figures) plus the files the
HTML report reads (``residual_flow/``, ``tokens/``); ``smallinit report DIR`` then renders the folder.
``--presets a,b`` replaces every sweep's size axis by those presets (dense or MoE); ``--set key=value``
overrides the recipe everywhere except on its grid axes.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from smallinit.config import flatten, parse_override, read_toml
from smallinit.errors import ConfigError, ExperimentError, Preempted, SmallinitError
from smallinit.io import write_json_atomic
from smallinit.monitor.monitor import MONITOR_FILE
from smallinit.monitor.runs import model_shape
from smallinit.study.judging.claims import CLAIMS, NOT_RUN
from smallinit.study.judging.findings import FINDINGS, FINDINGS_FILE
from smallinit.study.running import (
    Sweep,
    SweepOutcome,
    SweepProgress,
    cell_dir,
    cell_work,
    resolve_config,
    run_sweep,
)
from smallinit.study.running.budget import budget_schedule, budget_steps
from smallinit.study.running.spec import refuse_a_run_config

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
_RECIPE_SECTIONS = ("recipe", "base", "scales")
_META_KEYS = ("title", "claims", "findings", "seed_sd", "seed_sd_source", "design_effect")
_SCALE_KEYS = ("description", "base", "options", "budget", "sweeps")
_BUDGET_KEYS = ("tokens_per_param", "eval_points", "analysis_points", "warmup_frac")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")  # scale and sweep names become folder names


@dataclass
class Scale:
    name: str
    description: str
    sweeps: dict[str, Sweep]
    options: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)


@dataclass
class Recipe:
    name: str
    title: str
    claims: list[str]
    findings: str  # the findings step that measures and judges its runs (a name in FINDINGS)
    scales: dict[str, Scale]
    path: Path
    seed_sd: tuple[float, str] | None = None  # (the pilot's seed sd in nats, where it was measured)
    design_effect: float | None = None  # the loss gap (nats) its seeds are sized to see at 80 % power

    def scale(self, name: str) -> Scale:
        if name not in self.scales:
            raise ExperimentError(
                f"recipe {self.name} has no scale {name!r}; choose one of {', '.join(self.scales)}"
            )
        return self.scales[name]


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def is_sweep_file(target: str | os.PathLike) -> bool:
    """Whether ``target`` is a sweep file rather than a recipe: a .toml without [recipe] or [scales.NAME]; anything
    else names a recipe (one that does not load is said by load_recipe)."""
    path = Path(target)
    if not (path.suffix == ".toml" and path.is_file()):
        return False
    try:
        raw = read_toml(path)
    except SmallinitError:
        return False
    return not ({"recipe", "scales"} & set(raw))


def load_recipe(name: str | os.PathLike) -> Recipe:
    """A shipped recipe by name, or a recipe file by path."""
    path = Path(name)
    if not (path.suffix == ".toml" and path.is_file()):
        path = RECIPES_DIR / f"{name}.toml"
        if not path.is_file():
            raise ExperimentError(
                f"unknown recipe {str(name)!r}; choose one of {', '.join(recipe_names())} or pass a .toml"
            )
    where = f"recipe {path.stem}"
    try:
        raw = read_toml(path)
    except SmallinitError as e:
        raise ExperimentError(str(e).replace("config file", "recipe file")) from None
    unknown = sorted(set(raw) - set(_RECIPE_SECTIONS))
    refuse_a_run_config(unknown, where, "recipe")
    if unknown:
        raise ExperimentError(
            f"{where}: unknown section [{unknown[0]}]; use [recipe], [base] and [scales.NAME]"
        )
    for section in _RECIPE_SECTIONS:
        _table(raw.get(section, {}), f"{where}: [{section}]")
    meta = raw.get("recipe", {})
    bad = sorted(set(meta) - set(_META_KEYS))
    if bad:
        raise ExperimentError(f"{where}: unknown key recipe.{bad[0]}; use {', '.join(_META_KEYS)}")
    findings = meta.get("findings", "")
    if not isinstance(findings, str) or findings not in FINDINGS:
        raise ExperimentError(f"{where}: recipe.findings {findings!r} is not one of {', '.join(FINDINGS)}")
    seed_sd = _pilot_sd(meta, where)
    design = meta.get("design_effect")
    if design is not None and (
        isinstance(design, bool) or not isinstance(design, (int, float)) or not design > 0
    ):
        raise ExperimentError(f"{where}: recipe.design_effect must be a loss gap in nats > 0, got {design!r}")
    unknown = [c for c in meta.get("claims", []) if c not in CLAIMS]
    if unknown:
        raise ExperimentError(
            f"{where}: claims names {unknown[0]!r}, which no module registers; the registered claims "
            f"are {', '.join(CLAIMS)}"
        )
    common = flatten(raw.get("base", {}))
    scales = {}
    for sname, table in raw.get("scales", {}).items():
        _table(table, f"{where}: scale {_name(sname, where, 'scale')}")
        bad = sorted(set(table) - set(_SCALE_KEYS))
        if bad:
            raise ExperimentError(
                f"{where}: unknown key scales.{sname}.{bad[0]}; use {', '.join(_SCALE_KEYS)}"
            )
        scale_base = {**common, **flatten(_table(table.get("base", {}), f"{where}: scales.{sname}.base"))}
        sweeps = {}
        for wname, sweep_raw in _table(table.get("sweeps", {}), f"{where}: scales.{sname}.sweeps").items():
            sweep_raw = dict(_table(sweep_raw, f"{where}: sweep {_name(wname, where, 'sweep')}"))
            sweep_raw["base"] = {**scale_base, **flatten(sweep_raw.get("base", {}))}
            sweep_raw.setdefault("sweep", {}).setdefault("name", f"{path.stem}-{sname}-{wname}")
            sweeps[wname] = Sweep.from_dict(sweep_raw, where=f"{where}, scale {sname}, sweep {wname}")
        if not sweeps:
            raise ExperimentError(f"{where}: scale {sname} has no [scales.{sname}.sweeps.NAME]")
        options = dict(_table(table.get("options", {}), f"{where}: scales.{sname}.options"))
        _check_dropped(
            options.get("dropped", {}),
            list(meta.get("claims", [])),
            f"{where}: scales.{sname}.options.dropped",
        )
        budget = dict(_table(table.get("budget", {}), f"{where}: scales.{sname}.budget"))
        bad = sorted(set(budget) - set(_BUDGET_KEYS))
        if bad or (budget and not float(budget.get("tokens_per_param", 0)) > 0):
            raise ExperimentError(
                f"{where}: scales.{sname}.budget takes tokens_per_param (> 0), eval_points, "
                "analysis_points and warmup_frac"
            )
        scales[sname] = Scale(sname, str(table.get("description", "")), sweeps, options, budget)
    if not scales:
        raise ExperimentError(f"{where}: no [scales.NAME]")
    return Recipe(
        path.stem,
        str(meta.get("title", path.stem)),
        list(meta.get("claims", [])),
        findings,
        scales,
        path,
        seed_sd,
        None if design is None else float(design),
    )


def _check_dropped(dropped: Any, claims: list[str], where: str) -> None:
    """A scale's ``dropped`` names claims of the recipe that it does not run, each with why."""
    if not isinstance(dropped, dict) or any(
        k not in claims or not isinstance(v, str) or not v.strip() for k, v in dropped.items()
    ):
        raise ExperimentError(
            f"{where} maps claims of recipe.claims ({', '.join(claims) or 'none'}) to why this "
            'scale does not run them, e.g. C3 = "no sink forms at these widths"'
        )


def _pilot_sd(meta: dict[str, Any], where: str) -> tuple[float, str] | None:
    if "seed_sd" not in meta:
        return None
    sd, source = meta["seed_sd"], meta.get("seed_sd_source")
    if (
        isinstance(sd, bool)
        or not isinstance(sd, (int, float))
        or not sd > 0
        or not isinstance(source, str)
        or not source
    ):
        raise ExperimentError(
            f"{where}: recipe.seed_sd must be a number > 0 with recipe.seed_sd_source saying where "
            f"it was measured; got {sd!r}, {source!r}"
        )
    return float(sd), source


def _table(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ExperimentError(f"{what} must be a table")
    return value


def _name(name: str, where: str, kind: str) -> str:
    if not _NAME.fullmatch(name):  # no "..", "/" or empty names: outputs stay inside the recipe folder
        raise ExperimentError(f"{where}: {kind} name {name!r} may hold only letters, digits and . + -")
    return name


def customise(scale: Scale, *, presets: list[str] | None = None, overrides: list[str] = ()) -> Scale:
    """The scale with its size axes replaced by ``presets`` and ``key=value`` overrides applied."""
    pairs = [parse_override(item) for item in overrides]
    sweeps = {}
    for name, sw in scale.sweeps.items():
        sizes = (
            {p: {"model.preset": p} for p in presets}
            if presets
            else {k: dict(v) for k, v in sw.sizes.items()}
        )
        base, arms = dict(sw.base), {k: dict(v) for k, v in sw.arms.items()}
        if presets:
            base.pop("model.preset", None)
        for key, value in pairs:
            if key in sw.grid:
                raise ExperimentError(
                    f"--set {key}: the recipe sweeps that key; pick another or edit a copy of the recipe"
                )
            base[key] = value
            for table in (*sizes.values(), *arms.values()):
                if key in table:
                    table[key] = value
        sweeps[name] = Sweep(
            base=base,
            grid=sw.grid,
            arms=arms,
            sizes=sizes,
            name=sw.name,
            description=sw.description,
            launcher=sw.launcher,
        )
        sweeps[name].cells()
    return Scale(scale.name, scale.description, sweeps, scale.options, scale.budget)


def apply_budget(scale: Scale, vocab: dict[str, int] | None = None) -> Scale:
    """The scale with its training length set by size: every run of one model shape sees
    ``tokens_per_param`` tokens per non-embedding parameter (the same steps in every arm of that shape, so
    paired runs see the same tokens), is evaluated at ``eval_points`` evenly spaced steps, measured at
    ``analysis_points``, and warms up for ``warmup_frac`` of its steps."""
    b = scale.budget
    if not b:
        return scale
    vocab = {} if vocab is None else vocab
    steps: dict[tuple, int] = {}
    shapes: dict[tuple[str, str | None], set[tuple]] = {}  # (sweep, size) → the model shapes of its cells
    for name, sw in scale.sweeps.items():
        for cell in sw.cells():
            cfg = resolve_config(cell, vocab)
            shape = model_shape(flatten(cfg.to_dict()))
            shapes.setdefault((name, cell.size), set()).add(shape)
            steps[shape] = max(steps.get(shape, 1), budget_steps(cfg, b))
    for (name, _), found in shapes.items():
        if len(found) > 1:
            raise ExperimentError(
                f"sweep {name}: a budget needs one model shape per size; move shape keys to [sizes]"
            )

    def at(name: str, size: str | None) -> dict[str, Any]:
        return budget_schedule(steps[next(iter(shapes[name, size]))], b)

    sweeps = {}
    for name, sw in scale.sweeps.items():
        sizes = {k: {**v, **at(name, k)} for k, v in sw.sizes.items()}
        base = dict(sw.base) if sw.sizes else {**sw.base, **at(name, None)}
        sweeps[name] = Sweep(
            base=base,
            grid=sw.grid,
            arms=sw.arms,
            sizes=sizes,
            name=sw.name,
            description=sw.description,
            launcher=sw.launcher,
        )
    return Scale(scale.name, scale.description, sweeps, scale.options, scale.budget)


@dataclass
class RecipeResult:
    recipe: Recipe
    scale: Scale
    out: Path
    sweeps: dict[str, SweepOutcome]
    findings: dict[str, Any] | None
    wall_s: float

    @property
    def exit_code(self) -> int:
        codes = [o.exit_code for o in self.sweeps.values()]
        return Preempted.exit_code if Preempted.exit_code in codes else (1 if any(codes) else 0)


def check_out(out: Path) -> None:
    """Refuse, before anything is written, an --out that is (or lies below) a file, as train does, or that is
    one run's folder (a recipe's runs and report would mix with that run's files)."""
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "" if existing == out else f" lies below {existing}, which"
        raise ConfigError(f"--out {out}{where} is a file, not a folder; choose another --out")
    run_file = next((f for f in ("config.json", MONITOR_FILE) if (out / f).is_file()), None)
    if run_file is not None:
        raise ConfigError(
            f"--out {out} is a training run's folder (it holds {run_file}), not a recipe's; choose another --out"
        )


def run_recipe(
    recipe: Recipe | str,
    scale: str = "cpu",
    out: str | os.PathLike | None = None,
    *,
    jobs: int | None = None,
    presets: list[str] | None = None,
    overrides: list[str] = (),
    echo: TextIO | None = sys.stderr,
    launcher: str | None = None,
    slurm: dict[str, Any] | None = None,
) -> RecipeResult:
    """Run every sweep of ``scale`` (continuing earlier runs in ``out``), then the recipe's findings step.

    ``launcher`` (from the command line) replaces the launcher of every sweep, e.g. for a site's srun wrapper.
    ``slurm`` (the SLURM flags, see run_sweep): submit every sweep's cells as job arrays instead; the findings step
    runs when the same call finds them all finished.
    """
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    vocab: dict[str, int] = {}
    sc = apply_budget(customise(recipe.scale(scale), presets=presets, overrides=list(overrides)), vocab)
    out = Path(out) if out is not None else Path("runs") / f"{recipe.name}-{scale}"
    check_out(out)
    work: dict[str, float] = {}  # every cell of every sweep is checked before anything runs
    for name, sw in sc.sweeps.items():
        for cell in sw.cells():
            work[str(cell_dir(out / name, cell.id))] = cell_work(resolve_config(cell, vocab))
    out.mkdir(parents=True, exist_ok=True)
    # the findings step reads the design effect beside the scale's options: a loss verdict says its power at it
    options = {**sc.options, **({"design_effect": recipe.design_effect} if recipe.design_effect else {})}
    write_json_atomic(
        out / "recipe.json",
        {
            "recipe": recipe.name,
            "title": recipe.title,
            "scale": sc.name,
            "description": sc.description,
            "claims": recipe.claims,
            "findings": recipe.findings,
            "options": options,
            "budget": sc.budget,
            "presets": presets,
            "overrides": list(overrides),
            "sweeps": list(sc.sweeps),
        },
    )
    t0 = time.monotonic()
    progress = SweepProgress(
        recipe.name,
        {k: w for k, w in work.items() if not (Path(k) / "summary.json").is_file()},
        after=", then the findings",
    )
    if echo is not None:
        print(
            f"[recipe] {recipe.name} ({sc.name}): {len(sc.sweeps)} sweep(s), {progress.total} of {len(work)} runs "
            f"to train; folder {out}",
            file=echo,
            flush=True,
        )
        for claim, why in sc.options.get("dropped", {}).items():
            print(f"[recipe] {recipe.name} ({sc.name}): {claim} {NOT_RUN}: {why}", file=echo, flush=True)
    outcomes = {}
    for name, sw in sc.sweeps.items():
        if echo is not None:
            print(f"[recipe] {recipe.name} ({sc.name}): sweep {name}", file=echo, flush=True)
        outcomes[name] = run_sweep(
            sw, out / name, jobs=jobs, echo=echo, launcher=launcher, progress=progress, slurm=slurm
        )
        if outcomes[name].interrupted:
            return RecipeResult(recipe, sc, out, outcomes, None, time.monotonic() - t0)
    # every sweep submitted; the findings step waits for their cells
    if any(o.in_slurm for o in outcomes.values()):
        return RecipeResult(recipe, sc, out, outcomes, None, time.monotonic() - t0)
    if echo is not None:
        print(f"[recipe] {recipe.name}: findings", file=echo, flush=True)
    train_wall = time.monotonic() - t0
    cpu0 = time.process_time()
    findings = FINDINGS[recipe.findings](out, recipe.claims, options, _stage_printer(echo))
    cells_cpu = sum(r.get("cpu_s") or 0.0 for o in outcomes.values() for r in o.rows)
    if echo is not None:
        print(f"[findings] done in {time.monotonic() - t0 - train_wall:.0f} s", file=echo, flush=True)
    findings = {
        "recipe": recipe.name,
        "scale": sc.name,
        "title": recipe.title,
        "train_wall_s": train_wall,
        "cells_cpu_s": cells_cpu,
        "findings_wall_s": time.monotonic() - t0 - train_wall,
        "findings_cpu_s": time.process_time() - cpu0,
        **findings,
    }
    write_json_atomic(out / FINDINGS_FILE, _jsonable(findings))
    return RecipeResult(recipe, sc, out, outcomes, findings, time.monotonic() - t0)


def _stage_printer(echo: TextIO | None) -> Callable[[str], None]:
    """Prints each stage of a findings step as it starts, with the seconds since the step began."""
    t0 = time.monotonic()

    def say(line: str) -> None:
        if echo is not None:
            print(f"[findings] {time.monotonic() - t0:.0f} s: {line}", file=echo, flush=True)

    return say


def _jsonable(obj: Any) -> Any:
    """NaN/inf → None and numpy scalars → Python, so findings.json is strict JSON."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def describe(recipe: Recipe, headline: Callable[[str], str] | None = None) -> str:
    """The recipe and its scales; ``headline(scale)`` adds a line under each (``smallinit recipes`` adds its plan)."""
    lines = [f"{recipe.name}: {recipe.title}" + (f" [{', '.join(recipe.claims)}]" if recipe.claims else "")]
    for sc in recipe.scales.values():
        n = sum(len(sw.cells()) for sw in sc.sweeps.values())
        lines.append(f"  --scale {sc.name}: {n} runs. {sc.description}")
        if headline is not None:
            lines.append(f"      {headline(sc.name)}")
    return "\n".join(lines)
