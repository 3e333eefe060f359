"""The study: ``plan`` (what a recipe or sweep file costs and decides), ``recipes``, ``recipe``, ``sweep``,
``status`` (a sweep folder's cells) and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from smallinit.cli.args import num_devices_arg, out_arg, set_arg, slurm, slurm_args
from smallinit.cli.base import Command
from smallinit.cli.deprecated import OmittedOnlyByOld, notice, old, store, verb
from smallinit.errors import ConfigError, ExperimentError, Preempted, SmallinitError

LAUNCHER_HELP = (
    "command that starts each cell's '-m smallinit train' instead of this Python, e.g. "
    "'torchrun --standalone --nproc_per_node=gpu' or a site's wrapper; replaces the file's launcher"
)


class _GpuKinds:
    """The GPU kinds a plan knows (cost.GPUS), read only when a help is printed: every command, each sweep cell's
    ``train`` among them, would otherwise import the planner to start."""

    def __str__(self) -> str:
        from smallinit.study.planning.cost import GPUS

        return ", ".join(GPUS)


def _plan_args(p: argparse.ArgumentParser, hide: tuple[str, ...] = ()) -> None:
    """The hardware and noise a plan assumes. ``hide``: flags kept only for the old ``--plan`` of recipe and sweep
    (its own notice names the new spelling), left out of their --help."""

    def add(flag: str, **kwargs) -> argparse.Action:
        return p.add_argument(
            flag, **{**kwargs, "help": argparse.SUPPRESS if flag in hide else kwargs["help"]}
        )

    num_devices_arg(
        p,
        argparse.SUPPRESS
        if "--num-devices" in hide
        else "devices to plan for (default 8 GPUs for "
        "scales that run under torchrun, else this machine's CPU cores)",
    )
    kind = add(
        "--accelerator",
        metavar="KIND",
        help="the devices' kind: %(gpus)s, or cpu (default: h100 for scales that run under torchrun, else cpu)",
    )
    kind.gpus = _GpuKinds()  # argparse fills %(gpus)s from the action's attributes
    old(p, "--gpu", metavar="KIND", new="--accelerator {}", then=store("accelerator"))
    add(
        "--mfu",
        type=float,
        metavar="X",
        help="model FLOPs utilisation to assume (default: the measured or stated one the plan prints)",
    )
    add(
        "--tokens-per-s",
        type=float,
        metavar="X",
        help="training tokens/s of all devices together, instead of an MFU",
    )
    add(
        "--seed-sd",
        action="append",
        metavar="X|CLAIM=X",
        help="sd over seeds of a paired final-loss gap (nats), or "
        "CLAIM=X of that claim's primary in its own unit (C6=0.06: a stable rank), for the minimum detectable "
        "effects; repeatable (default: the recipe's pilot, else the CPU study's)",
    )
    add("--json", action="store_true", help="the plan as JSON")
    add(
        "--untimed",
        action="store_true",
        help="on this machine's CPU, price by FLOPs instead of training each kind of cell for a few steps first",
    )


PLAN_FLAGS = ("--num-devices", "--accelerator", "--mfu", "--tokens-per-s", "--seed-sd", "--json", "--untimed")


def _hardware(args: argparse.Namespace):
    """The hardware the flags describe, or None (no flag given) for the plan's default for the scale."""
    from smallinit.study.planning.cost import Hardware

    given = (args.accelerator, args.num_devices, args.mfu, args.tokens_per_s)
    if all(v is None for v in given):
        return None
    return Hardware.make(args.accelerator, args.num_devices, mfu=args.mfu, tokens_per_s=args.tokens_per_s)


def _seed_sd(values: list[str] | None) -> tuple[float | None, dict[str, float]]:
    """``--seed-sd`` as given (repeatable): X, the loss gaps' sd in nats, or CLAIM=X, one claim's in its unit."""
    from smallinit.study.judging.claims import CLAIMS

    loss, claims = None, {}
    for value in values or []:
        key, _, number = value.rpartition("=")
        if key and key not in CLAIMS:
            raise ExperimentError(f"--seed-sd {value}: unknown claim {key!r}; use one of {', '.join(CLAIMS)}")
        try:
            sd = float(number)
        except ValueError:
            raise ExperimentError(
                f"--seed-sd {value}: not a number; give X or CLAIM=X (e.g. C6=0.06)"
            ) from None
        if not sd > 0:
            raise ExperimentError(f"--seed-sd must be > 0, got {value}")
        if key:
            claims[key] = sd
        else:
            loss = sd
    return loss, claims


def _presets(args: argparse.Namespace) -> list[str] | None:
    presets = getattr(args, "presets", None)  # the old `sweep --plan` has none
    return [p.strip() for p in presets.split(",") if p.strip()] if presets else None


def add_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="RECIPE_OR_SWEEP",
        help="recipe name, recipe .toml or sweep .toml (a file "
        "without [recipe] or [scales.NAME] is a sweep file)",
    )
    p.add_argument(
        "--scale", help="the recipe's scale (default cpu; see smallinit recipes); not for a sweep file"
    )
    p.add_argument("--presets", metavar="P1,P2", help="replace the recipe's sizes by these presets")
    set_arg(p, "override a config key in every run of the recipe, as smallinit recipe does")
    _plan_args(p)
    slurm_args(p)


def cmd_plan(args: argparse.Namespace) -> int:
    from smallinit.study.planning.plan import plan_recipe, plan_sweep
    from smallinit.study.planning.printing import format_plan
    from smallinit.study.planning.recipes import is_sweep_file

    if not args.target:  # the old `sweep --plan` without a file
        raise ExperimentError("pass a sweep file to plan: smallinit plan SWEEP.toml")
    loss_sd, claim_sd = _seed_sd(args.seed_sd)
    scale, presets, overrides = getattr(args, "scale", None), _presets(args), getattr(args, "overrides", [])
    timed = not (args.untimed or args.mfu or args.tokens_per_s)  # a rate given is the user's price
    if is_sweep_file(args.target):
        given = [flag for flag, v in (("--scale", scale), ("--presets", presets), ("--set", overrides)) if v]
        if given:
            raise ConfigError(
                f"{given[0]} is for recipes; a sweep file has no scales: change its [base] or [grid]"
            )
        plan = plan_sweep(
            args.target, _hardware(args), seed_sd=loss_sd, claim_sd=claim_sd, slurm=slurm(args), timed=timed
        )
    else:
        plan = plan_recipe(
            args.target,
            scale or "cpu",
            _hardware(args),
            presets=presets,
            overrides=overrides,
            seed_sd=loss_sd,
            claim_sd=claim_sd,
            slurm=slurm(args),
            timed=timed,
        )
    print(json.dumps(plan.to_dict(), indent=1) if args.json else format_plan(plan))
    return 0


def cmd_recipes(_args: argparse.Namespace) -> int:
    from smallinit.study.planning.plan import scale_headline
    from smallinit.study.planning.recipes import describe, load_recipe, recipe_names

    for name in recipe_names():
        recipe = load_recipe(name)
        print(describe(recipe, lambda scale, r=recipe: scale_headline(r, scale)), flush=True)
    return 0


def add_recipe(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target", action=OmittedOnlyByOld, metavar="RECIPE", help="recipe name or a recipe .toml file"
    )
    p.add_argument(
        "--scale",
        default="cpu",
        help="cpu (a laptop's cores), gpu (paper sizes; torchrun per cell) or micro; see smallinit recipes",
    )
    out_arg(p, "recipe folder (default runs/<name>-<scale>); re-run to continue")
    p.add_argument(
        "--jobs", type=int, metavar="N", help="cells side by side (default: the sweep packing rule)"
    )
    p.add_argument(
        "--presets", metavar="P1,P2", help="replace the recipe's sizes by these presets (e.g. MoE ones)"
    )
    set_arg(p, "override a config key in every run (not the keys the recipe sweeps)")
    p.add_argument("--launcher", metavar="CMD", help=LAUNCHER_HELP)
    slurm_args(p)
    old(p, "--list", nargs=0, new="smallinit recipes", then=verb(cmd_recipes))
    old(p, "--plan", nargs=0, new="smallinit plan RECIPE", then=verb(cmd_plan))
    _plan_args(
        p, hide=("--seed-sd", "--json", "--untimed")
    )  # the hardware of the [plan] line printed before a run


def cmd_recipe(args: argparse.Namespace) -> int:
    from smallinit.study.judging.verdicts import verdict_table
    from smallinit.study.planning.plan import plan_recipe
    from smallinit.study.planning.recipes import run_recipe

    if not args.target:
        notice("smallinit recipe", "smallinit recipes")
        return cmd_recipes(args)
    presets = _presets(args)
    plan = plan_recipe(args.target, args.scale, _hardware(args), presets=presets, overrides=args.overrides)
    print(f"[plan] {plan.headline()}", file=sys.stderr, flush=True)
    result = run_recipe(
        args.target,
        args.scale,
        args.out,
        jobs=args.jobs,
        presets=presets,
        overrides=args.overrides,
        launcher=args.launcher,
        slurm=slurm(args),
    )
    if result.findings is None and any(o.in_slurm for o in result.sweeps.values()):
        print(
            "smallinit: cells on SLURM; run the same command again once they have finished (the findings step runs then)"
        )
    if result.exit_code == Preempted.exit_code:
        print(
            f"smallinit: stopped by a signal; run the same command again to continue {result.out}",
            file=sys.stderr,
        )
    if result.findings is not None:
        print(verdict_table(result.findings["claims"]))
    print(
        f"recipe folder {result.out} ({result.wall_s / 60:.1f} min); findings {result.out / 'findings.json'}"
    )
    return result.exit_code


def add_sweep(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        action=OmittedOnlyByOld,
        metavar="SWEEP.toml",
        help="sweep file: [base], [grid], optional [arms.NAME]",
    )
    out_arg(p, "sweep folder (default runs/<the sweep's name>, else the file's); re-run to continue it")
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="cells side by side (default: one per core for small CPU models, else 1)",
    )
    p.add_argument(
        "--retry-failed", action="store_true", help="run failed cells again (resuming where they can)"
    )
    p.add_argument("--launcher", metavar="CMD", help=LAUNCHER_HELP)
    slurm_args(p)
    old(p, "--status", metavar="DIR", new="smallinit status {}", then=verb(cmd_status, "folder"))
    old(p, "--plan", nargs=0, new="smallinit plan SWEEP.toml", then=verb(cmd_plan))
    _plan_args(p, hide=PLAN_FLAGS)  # for the old --plan


def cmd_sweep(args: argparse.Namespace) -> int:
    from smallinit.study import Sweep, format_table, run_sweep

    if not args.target:
        raise SmallinitError(
            "pass a sweep file: smallinit sweep SWEEP.toml (smallinit status DIR shows a sweep folder)"
        )
    sweep = Sweep.load(args.target)
    out = args.out or str(Path("runs") / sweep.folder_name)
    outcome = run_sweep(
        sweep,
        out,
        jobs=args.jobs,
        retry_failed=args.retry_failed,
        echo=sys.stderr,
        launcher=args.launcher,
        slurm=slurm(args),
    )
    if outcome.interrupted:
        print(
            f"smallinit: sweep stopped by a signal; run the same command again to continue {out}",
            file=sys.stderr,
        )
    print(format_table(outcome.rows))
    print(f"results: {Path(out) / 'results.csv'}")
    return outcome.exit_code


def add_status(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", metavar="DIR", help="a sweep folder (a sweep's --out)")


def cmd_status(args: argparse.Namespace) -> int:
    from smallinit.study import format_table, sweep_status

    rows, note = sweep_status(args.folder)
    print(format_table(rows))
    if note:
        print(note)
    return 0


def add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scale",
        choices=("full", "quick", "micro"),  # micro: for the tests, left out of --help
        metavar="{full,quick}",
        default="full",
        help="full (default), or quick: a first look at d = 16, a fraction of the full demo's time; it says "
        "first what it cannot test",
    )
    old(p, "--quick", nargs=0, new="--scale quick", then=store("scale", "quick"))
    out_arg(p, "demo folder (default runs/demo-full or runs/demo-quick)")
    p.add_argument("--jobs", type=int, metavar="N", help="runs side by side (default: one per core)")
    slurm_args(p)


def cmd_demo(args: argparse.Namespace) -> int:
    from smallinit.demo import run_demo

    demo = run_demo(scale=args.scale, out=args.out, jobs=args.jobs, slurm=slurm(args))
    if not demo.table and any(o.in_slurm for o in demo.result.sweeps.values()):
        print("smallinit: demo cells on SLURM; run the same command again once they have finished")
        return 0
    if not demo.table:
        print(
            f"smallinit: demo stopped by a signal; run the same command again to continue {demo.result.out}",
            file=sys.stderr,
        )
        return demo.result.exit_code
    a = demo.result.findings
    cpu_min = (a["cells_cpu_s"] + a["findings_cpu_s"]) / 60
    planned = f" (its plan said {demo.plan_wall_s / 60:.1f} min)" if demo.plan_wall_s else ""
    print(
        f"\nsmallinit demo ({args.scale}): {demo.wall_s / 60:.1f} min wall{planned}, {cpu_min:.1f} CPU-min of "
        "training and analysis; verdicts computed from the runs and their seed spread"
    )
    print(demo.table)
    print(f"report: {demo.report}" if demo.report else f"findings: {demo.result.out / 'findings.json'}")
    return demo.result.exit_code


COMMANDS = (
    Command(
        "plan",
        "what a recipe scale or a sweep file costs (tokens, FLOPs, GPU-hours, memory) and which claims it can "
        "decide, with minimum detectable effects; on this machine's CPU it first times a few steps of each kind "
        "of cell (--untimed: trains nothing)",
        add_plan,
        cmd_plan,
    ),
    Command(
        "recipes", "list the paper's recipes, their scales and each scale's plan headline", run=cmd_recipes
    ),
    Command(
        "recipe",
        "run a named experiment of the paper (see smallinit recipes), then judge its claims",
        add_recipe,
        cmd_recipe,
    ),
    Command(
        "sweep",
        "run a grid of training runs, one process per cell (exit 1 if a cell failed)",
        add_sweep,
        cmd_sweep,
    ),
    Command(
        "status", "the cells of a sweep folder as they stand (also while it runs)", add_status, cmd_status
    ),
    Command(
        "demo",
        "the paper's claims C1–C7 at CPU scale, with an HTML report and a verdict table "
        "(how long it takes: docs/findings-cpu.md)",
        add_demo,
        cmd_demo,
    ),
)
