"""The command line: parses arguments, calls the library, maps errors to exit codes — nothing else.

One grammar (docs/cli.md says it for users, with the old spellings and what replaces them):
- a command is a verb or a noun that names what it prints: ``train``, ``plan``, ``recipes``, ``status DIR``;
  no flag turns one command into another;
- positionals are inputs; ``--out DIR`` is always a folder of outputs, never positional; a command that writes
  one file writes it into that folder under a fixed name (``tokenizer.json``, ``report.html``);
- configuration goes through ``--config`` / ``--preset`` / ``--set KEY=VALUE`` and nothing else;
- ``--num-devices N`` is a count of devices, ``--accelerator KIND`` their kind, ``--device`` where this
  command itself runs;
- each command's flags are declared by ``add_<command>`` right above its ``cmd_<command>``.
Old spellings keep working for one release through :class:`_Old`, which prints one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from smallinit.errors import ConfigError, ExperimentError, Preempted, SmallinitError, did_you_mean

# -- the grammar's parts ---------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line and exit 2, like every other user error (argparse would print the usage first)."""
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def add_subparsers(self, **kwargs):
        """A command that holds subcommands (smallinit, smallinit tokenizer, ...) prints its help when given alone,
        rather than argparse's "the following arguments are required"."""
        self.set_defaults(func=self._print_help)
        return super().add_subparsers(**{**kwargs, "required": False})

    def _print_help(self, _args: argparse.Namespace) -> int:
        self.print_help()
        return 0


def _deprecated(old: str, new: str) -> None:
    """The notice of every old spelling: one line on stderr that names the new one (once, not per rank)."""
    if os.environ.get("RANK", "0") == "0":
        sys.stderr.write(
            f"smallinit: deprecated: '{old}' is now '{new}'; the old spelling goes in the next release\n"
        )


class _Old(argparse.Action):
    """An old spelling kept for one release: hidden from --help, it prints the notice, then does what its new
    spelling does: ``then(namespace, value)``. ``new`` may hold ``{}`` for the value given."""

    def __init__(self, option_strings, dest, *, new: str, then, **kwargs):
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.new, self.then = new, then

    def __call__(self, parser, namespace, values, option_string=None):
        shown = " ".join(map(str, values)) if isinstance(values, list) else str(values)
        old = f"{parser.prog} {option_string or '…'} {shown}".rstrip()  # a positional: its value alone
        new = self.new.format(shown)
        _deprecated(old, f"{parser.prog} {new}" if new.startswith("-") else new)
        self.then(namespace, values)


def _old(p: argparse.ArgumentParser, *spelling: str, new: str, then, **kwargs) -> None:
    p.add_argument(*spelling, action=_Old, new=new, then=then, **kwargs)


def _store(dest: str):
    """``then`` of a renamed flag or a positional that became a flag: what was given goes to the new one."""
    return lambda ns, given: setattr(ns, dest, given)


def _verb(func, dest: str | None = None):
    """``then`` of a flag that was a verb in disguise: run ``func`` instead, with what was given as ``dest``."""

    def then(ns: argparse.Namespace, given) -> None:
        ns.func = func
        if dest:
            setattr(ns, dest, given)

    return then


def _to_set(key: str, value: str | None = None):
    """``then`` of an old flag that duplicated a config key: it becomes --set KEY=VALUE."""
    return lambda ns, given: setattr(
        ns, "overrides", [*ns.overrides, f"{key}={given if value is None else value}"]
    )


def _key_value(text: str) -> str:
    """--set takes one word KEY=VALUE; "--set train.steps 10" would otherwise end as "unrecognized arguments: 10"."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE; write key and value as one word, e.g. --set "
            f"{text if '.' in text else 'train.steps'}=VALUE"
        )
    return text


def _set_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_key_value,
        help=help,
    )


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE.toml",
        help="a TOML config (sections model, train, data, analysis), "
        "or a run folder or its config.json to take that run's config",
    )
    p.add_argument("--preset", metavar="NAME", help="model preset, e.g. cpu-1m, cpu-5m, 0.1b, 1.5b")
    _set_arg(p, "override a config key, e.g. --set train.steps=200 --set model.gate=headwise")


def _load_config(args: argparse.Namespace):
    from smallinit.config import Config

    return Config.load(args.config, preset=args.preset, overrides=args.overrides)


def _model_sets(args: argparse.Namespace, keys: dict[str, tuple[type, object]]) -> dict[str, object]:
    """The --set values of a command that reads a model rather than resolving a config: only ``keys`` (KEY:
    (type, default)) have a meaning there, so any other is refused rather than ignored."""
    values = {key: default for key, (_, default) in keys.items()}
    for item in args.overrides:
        key, _, text = (s.strip() for s in item.partition("="))
        if key not in keys:
            raise ConfigError(
                f"--set {item}: this command reads only {', '.join(keys)}{did_you_mean(key, keys)}"
            )
        kind = keys[key][0]
        try:
            values[key] = kind(text)
        except ValueError:
            raise ConfigError(
                f"--set {item}: {key} takes {'a whole number' if kind is int else 'a number'}"
            ) from None
    return values


def _out(p: argparse.ArgumentParser, help: str, **kwargs) -> None:
    p.add_argument("--out", metavar="DIR", help=help, **kwargs)


def _positional_out(p: argparse.ArgumentParser) -> None:
    """--out DIR, required, and the positional OUT_DIR it replaces (kept for one release)."""
    _out(p, "new folder to write (required)")
    _old(p, "old_out", nargs="?", metavar="OUT_DIR", new="--out {}", then=_store("out"))


def _required_out(args: argparse.Namespace, command: str) -> Path:
    if args.out is None:
        raise ConfigError(f"{command} needs --out DIR, the new folder to write")
    return Path(args.out)


def _out_file(out: str | None, name: str, command: str) -> Path | None:
    """The file a one-file command writes: DIR/name for --out DIR. An --out ending in name's suffix is the old
    spelling, the file itself; it still works."""
    if out is None:
        return None
    suffix = Path(name).suffix
    if out.endswith(suffix):
        _deprecated(
            f"smallinit {command} --out FILE{suffix}", f"smallinit {command} --out DIR (writes DIR/{name})"
        )
        return Path(out)
    return Path(out) / name


def _device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="where this command runs: cpu (default), cuda or cuda:N")


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _budget(text: str) -> int | str:
    """--max-tokens: a positive count, or "all"."""
    if text == "all":
        return text
    try:
        n = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of tokens or 'all'")
    return n


TOKENIZER_HELP = (
    "the tokenizer of a Hugging Face folder that has none or another (a folder saved by "
    "save_pretrained, a tokenizer.json, or 'default' / 'bytes': smallinit's builtin 8,192- and "
    "257-token ones)"
)
LAUNCHER_HELP = (
    "command that starts each cell's '-m smallinit train' instead of this Python, e.g. "
    "'torchrun --standalone --nproc_per_node=gpu' or a site's wrapper; replaces the file's launcher"
)


def _slurm_args(p: argparse.ArgumentParser) -> None:
    """--scheduler slurm and its options (over the sweep file's [slurm] table; docs/distributed.md)."""
    p.add_argument(
        "--scheduler",
        choices=("local", "slurm"),
        default="local",
        help="local: run the cells here (default); slurm: submit them as one job array per sweep and return "
        "(smallinit status DIR follows them; the same command again submits what is missing)",
    )
    for flag, kind, help in (
        ("--partition", str, "SLURM partition"),
        ("--account", str, "SLURM account"),
        (
            "--time",
            str,
            "each job's time limit, e.g. 24:00:00 (a longer cell is requeued from its checkpoint)",
        ),
        ("--nodes", int, "nodes per cell (one torchrun per node)"),
        ("--gpus-per-node", int, "GPUs per node of a cell (0: one CPU process)"),
        ("--cpus-per-task", int, "CPU cores per node of a cell"),
        ("--max-running", int, "array tasks running at once (--array=...%%K)"),
    ):
        p.add_argument(flag, type=kind, help=help)
    p.add_argument(
        "--sbatch", action="append", metavar="--OPTION=VALUE", help="one more #SBATCH line; repeatable"
    )


def _slurm(args: argparse.Namespace) -> dict | None:
    """The SLURM flags given (None: not given), or None to run here."""
    if getattr(args, "scheduler", "local") != "slurm":
        return None
    keys = ("partition", "account", "time", "nodes", "gpus_per_node", "cpus_per_task", "max_running")
    return {**{k: getattr(args, k) for k in keys}, "extra": args.sbatch}


# -- training and configs ------------------------------------------------------------------------------------------


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model")
    _config_args(p)
    _out(p, "run folder (default runs/train)", default="runs/train")
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest checkpoint; "
        "with --set train.steps=N also extend it, where its schedule allows (docs/config.md)",
    )
    # not a mere train.init_from: it also takes that run's config
    start.add_argument(
        "--init-from",
        metavar="RUN_OR_CHECKPOINT",
        help="start a new run from the weights of a run "
        "(its newest checkpoint) or a checkpoint, with that run's config unless --config/--preset; "
        "fresh optimizer, step 0",
    )
    _old(p, "--wandb", nargs=0, new="--set train.wandb=true", then=_to_set("train.wandb", "true"))
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from smallinit.analysis import check_norm_saturation
    from smallinit.config import Config
    from smallinit.train import Trainer
    from smallinit.train.distributed import shutdown

    out = Path(args.out)
    if args.init_from:  # a new run from that run's weights, and from its config unless --config/--preset
        args.overrides.insert(0, f"train.init_from={json.dumps(args.init_from)}")
        args.config = args.config or (None if args.preset else args.init_from)
    if args.resume and not (args.config or args.preset):  # the run's own config; --set may change its layout
        cfg = Config.from_json_file(out / "config.json", args.overrides)  # or its length (train.steps)
    else:
        cfg = _load_config(args)
    trainer = Trainer(cfg, out, resume=args.resume)
    if trainer.finished:  # a resumed run that already reached train.steps: say so, write nothing
        trainer.close()
        shutdown()
        if trainer.runtime.is_main:
            print(
                f"nothing trained: {out} already reached train.steps={trainer.step}; to train longer: smallinit "
                f"train --out {out} --resume --set train.steps=N (N > {trainer.step})"
            )
        return 0
    if trainer.runtime.is_main:
        check_norm_saturation(trainer.cfg.model)
    summary = trainer.fit()
    shutdown()  # under torchrun: leave the process group cleanly once every rank is done
    val = "nothing left to train" if summary["val_loss"] is None else f"val loss {summary['val_loss']:.4f}"
    if trainer.runtime.is_main:
        print(f"done: step {summary['step']}, {val}; run folder {out}")
    return 0


def add_config(sub) -> None:
    p = sub.add_parser(
        "config", help="print the resolved config (defaults → --config → --preset → --set) as commented TOML"
    )
    _config_args(p)
    p.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace) -> int:
    print("# smallinit config: defaults → --config → --preset → --set, resolved; every key in docs/config.md")
    print(_load_config(args).to_toml(), end="")
    return 0


def _num_devices(p: argparse.ArgumentParser, help: str, **kwargs) -> None:
    p.add_argument("--num-devices", type=int, metavar="N", help=help, **kwargs)
    _old(p, "--gpus", type=int, metavar="N", new="--num-devices {}", then=_store("num_devices"))


def add_info(sub) -> None:
    p = sub.add_parser("info", help="parameter counts and the γ-init table of a config")
    _config_args(p)
    p.add_argument(
        "--memory", action="store_true", help="estimate training memory per GPU instead of the init table"
    )
    _num_devices(p, "GPUs for --memory (the global batch is split over them; default 1)", default=1)
    p.add_argument(
        "--layers",
        action="store_true",
        help="the init table with one row per parameter of every layer "
        "(default: one row per parameter of a block, with its count)",
    )
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    from smallinit.analysis import check_norm_saturation
    from smallinit.init import init_plan
    from smallinit.model import Transformer

    cfg = _load_config(args)
    check_norm_saturation(cfg.model)
    with torch.device("meta"):  # shapes only: counts and the init table without allocating the weights
        model = Transformer(cfg.model, init=False)
    total, active = model.num_params(), model.num_params(active=True)
    print(
        f"parameters: {total:,} total, {active:,} active, {model.num_params(embeddings=False):,} without embeddings"
    )
    if args.memory:
        from smallinit.train.memory import describe_memory

        print(describe_memory(cfg, args.num_devices))
        return 0
    plan = init_plan(model, cfg.model.gamma)
    print(plan if args.layers else plan.summary())
    return 0


# -- planning, recipes and sweeps ------------------------------------------------------------------------------------


def _plan_args(p: argparse.ArgumentParser, hide: tuple[str, ...] = ()) -> None:
    """The hardware and noise a plan assumes. ``hide``: flags kept only for the old ``--plan`` of recipe and sweep
    (its own notice names the new spelling), left out of their --help."""

    def add(flag: str, **kwargs) -> None:
        p.add_argument(flag, **{**kwargs, "help": argparse.SUPPRESS if flag in hide else kwargs["help"]})

    _num_devices(
        p,
        argparse.SUPPRESS
        if "--num-devices" in hide
        else "devices to plan for (default 8 GPUs for "
        "scales that run under torchrun, else this machine's CPU cores)",
    )
    add(
        "--accelerator",
        metavar="KIND",
        help="the devices' kind: h100, h200, h800, a100, a100-40gb, l40s, b200, "
        "mi300x, or cpu (default: h100 for scales that run under torchrun, else cpu)",
    )
    _old(p, "--gpu", metavar="KIND", new="--accelerator {}", then=_store("accelerator"))
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


PLAN_FLAGS = ("--num-devices", "--accelerator", "--mfu", "--tokens-per-s", "--seed-sd", "--json")


def _hardware(args: argparse.Namespace):
    from smallinit.study.planning.cost import Hardware

    kind, devices = getattr(args, "accelerator", None), getattr(args, "num_devices", None)
    if kind is None and devices is None and args.mfu is None and args.tokens_per_s is None:
        return None  # the plan's default for the scale
    devices = devices if devices is not None else (os.cpu_count() or 1) if kind == "cpu" else 8
    return Hardware.make(kind or "h100", devices, mfu=args.mfu, tokens_per_s=args.tokens_per_s)


def _presets(args: argparse.Namespace) -> list[str] | None:
    presets = getattr(args, "presets", None)  # the old `sweep --plan` has none
    return [p.strip() for p in presets.split(",") if p.strip()] if presets else None


def _is_sweep_file(target: str) -> bool:
    """A .toml without [recipe] or [scales.NAME] is a sweep file; anything else names a recipe."""
    from smallinit.config.files import read_toml

    path = Path(target)
    if not (path.suffix == ".toml" and path.is_file()):
        return False
    try:
        raw = read_toml(path)
    except SmallinitError:
        return False  # the recipe loader says what is wrong with it
    return not ({"recipe", "scales"} & set(raw))


def add_plan(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="what a recipe scale or a sweep file costs (tokens, FLOPs, GPU-hours, memory) and "
        "which claims it can decide, with minimum detectable effects; trains nothing",
    )
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
    _set_arg(p, "override a config key in every run of the recipe, as smallinit recipe does")
    _plan_args(p)
    _slurm_args(p)
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from smallinit.study.planning.plan import parse_seed_sd, plan_recipe, plan_sweep
    from smallinit.study.planning.printing import format_plan

    if not args.target:  # the old `sweep --plan` without a file
        raise ExperimentError("pass a sweep file to plan: smallinit plan SWEEP.toml")
    loss_sd, claim_sd = parse_seed_sd(args.seed_sd)
    scale, presets, overrides = getattr(args, "scale", None), _presets(args), getattr(args, "overrides", [])
    if _is_sweep_file(args.target):
        given = [flag for flag, v in (("--scale", scale), ("--presets", presets), ("--set", overrides)) if v]
        if given:
            raise ConfigError(
                f"{given[0]} is for recipes; a sweep file has no scales: change its [base] or [grid]"
            )
        plan = plan_sweep(
            args.target, _hardware(args), seed_sd=loss_sd, claim_sd=claim_sd, slurm=_slurm(args)
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
            slurm=_slurm(args),
        )
    print(json.dumps(plan.to_dict(), indent=1) if args.json else format_plan(plan))
    return 0


def add_recipes(sub) -> None:
    p = sub.add_parser(
        "recipes", help="list the paper's recipes, their scales and each scale's plan headline"
    )
    p.set_defaults(func=cmd_recipes)


def cmd_recipes(_args: argparse.Namespace) -> int:
    from smallinit.study.planning.plan import scale_headline
    from smallinit.study.planning.recipes import describe, load_recipe, recipe_names

    for name in recipe_names():
        recipe = load_recipe(name)
        print(describe(recipe, lambda scale, r=recipe: scale_headline(r, scale)), flush=True)
    return 0


def add_recipe(sub) -> None:
    p = sub.add_parser(
        "recipe", help="run a named experiment of the paper (see smallinit recipes), then judge its claims"
    )
    p.add_argument("target", nargs="?", metavar="RECIPE", help="recipe name or a recipe .toml file")
    p.add_argument(
        "--scale",
        default="cpu",
        help="cpu (a laptop's cores), gpu (paper sizes; torchrun per cell) or micro; see smallinit recipes",
    )
    _out(p, "recipe folder (default runs/<name>-<scale>); re-run to continue")
    p.add_argument(
        "--jobs", type=int, metavar="N", help="cells side by side (default: the sweep packing rule)"
    )
    p.add_argument(
        "--presets", metavar="P1,P2", help="replace the recipe's sizes by these presets (e.g. MoE ones)"
    )
    _set_arg(p, "override a config key in every run (not the keys the recipe sweeps)")
    p.add_argument("--launcher", metavar="CMD", help=LAUNCHER_HELP)
    _slurm_args(p)
    _old(p, "--list", nargs=0, new="smallinit recipes", then=_verb(cmd_recipes))
    _old(p, "--plan", nargs=0, new="smallinit plan RECIPE", then=_verb(cmd_plan))
    _plan_args(p, hide=("--seed-sd", "--json"))  # the hardware of the [plan] line printed before a run
    p.set_defaults(func=cmd_recipe)


def cmd_recipe(args: argparse.Namespace) -> int:
    from smallinit.study.judging.verdicts import verdict_table
    from smallinit.study.planning.plan import plan_recipe
    from smallinit.study.planning.recipes import run_recipe

    if not args.target:
        _deprecated("smallinit recipe", "smallinit recipes")
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
        slurm=_slurm(args),
    )
    if result.analysis is None and any(o.in_slurm for o in result.sweeps.values()):
        print(
            "smallinit: cells on SLURM; run the same command again once they have finished (the analysis runs then)"
        )
    if result.exit_code == Preempted.exit_code:
        print(
            f"smallinit: stopped by a signal; run the same command again to continue {result.out}",
            file=sys.stderr,
        )
    if result.analysis is not None:
        print(verdict_table(result.analysis["claims"]))
    print(
        f"recipe folder {result.out} ({result.wall_s / 60:.1f} min); findings {result.out / 'findings.json'}"
    )
    return result.exit_code


def add_sweep(sub) -> None:
    p = sub.add_parser(
        "sweep", help="run a grid of training runs, one process per cell (exit 1 if a cell failed)"
    )
    p.add_argument(
        "target", nargs="?", metavar="SWEEP.toml", help="sweep file: [base], [grid], optional [arms.NAME]"
    )
    _out(p, "sweep folder (default runs/<the sweep's name>, else the file's); re-run to continue it")
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
    _slurm_args(p)
    _old(p, "--status", metavar="DIR", new="smallinit status {}", then=_verb(cmd_status, "folder"))
    _old(p, "--plan", nargs=0, new="smallinit plan SWEEP.toml", then=_verb(cmd_plan))
    _plan_args(p, hide=PLAN_FLAGS)  # for the old --plan
    p.set_defaults(func=cmd_sweep)


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
        slurm=_slurm(args),
    )
    if outcome.interrupted:
        print(
            f"smallinit: sweep stopped by a signal; run the same command again to continue {out}",
            file=sys.stderr,
        )
    print(format_table(outcome.rows))
    print(f"results: {Path(out) / 'results.csv'}")
    return outcome.exit_code


def add_status(sub) -> None:
    p = sub.add_parser("status", help="the cells of a sweep folder as they stand (also while it runs)")
    p.add_argument("folder", metavar="DIR", help="a sweep folder (a sweep's --out)")
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from smallinit.study import format_table, sweep_status

    rows, note = sweep_status(args.folder)
    print(format_table(rows))
    if note:
        print(note)
    return 0


def add_demo(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="the paper's claims C1–C7 at CPU scale, with an HTML report and a verdict table "
        "(how long it takes: docs/findings-cpu.md)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a first look at d = 16, a fraction of the full demo's time; it says first what it cannot test",
    )
    p.add_argument(
        "--scale", choices=("full", "quick", "micro"), help=argparse.SUPPRESS
    )  # micro: for the tests
    _out(p, "demo folder (default runs/demo-full or runs/demo-quick)")
    p.add_argument("--jobs", type=int, metavar="N", help="runs side by side (default: one per core)")
    _slurm_args(p)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from smallinit.demo import run_demo

    scale = args.scale or ("quick" if args.quick else "full")
    demo = run_demo(scale=scale, out=args.out, jobs=args.jobs, slurm=_slurm(args))
    if not demo.table and any(o.in_slurm for o in demo.result.sweeps.values()):
        print("smallinit: demo cells on SLURM; run the same command again once they have finished")
        return 0
    if not demo.table:
        print(
            f"smallinit: demo stopped by a signal; run the same command again to continue {demo.result.out}",
            file=sys.stderr,
        )
        return demo.result.exit_code
    a = demo.result.analysis
    cpu_min = (a["cells_cpu_s"] + a["analysis_cpu_s"]) / 60
    print(
        f"\nsmallinit demo ({scale}): {demo.wall_s / 60:.1f} min wall, {cpu_min:.1f} CPU-min of training and "
        "analysis; verdicts computed from the runs and their seed spread"
    )
    print(demo.table)
    print(f"report: {demo.report}" if demo.report else f"findings: {demo.result.out / 'findings.json'}")
    return demo.result.exit_code


# -- models in and out: tokenizer, Hugging Face, generation, lm-eval ---------------------------------------------


def add_tokenizer(sub) -> None:
    p = sub.add_parser("tokenizer", help="tokenizer tools")
    tsub = p.add_subparsers(dest="tokenizer_command")
    t = tsub.add_parser("train", help="train a byte-level BPE tokenizer on a corpus")
    t.add_argument("corpus", help="builtin corpus name, file, directory or glob")
    t.add_argument(
        "--vocab-size",
        type=int,
        default=8192,
        help="vocabulary size to reach (default 8192); a corpus "
        "too small for it gives a smaller one, kept with a warning that names the size reached",
    )
    t.add_argument(
        "--text-field",
        default="text",
        help="the field holding the text in .jsonl / .parquet documents (default text)",
    )
    _out(
        t,
        "folder to write tokenizer.json into (required; use it as data.tokenizer=DIR/tokenizer.json)",
        required=True,
    )
    t.set_defaults(func=cmd_tokenizer_train)


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from smallinit.data import iter_documents, train_tokenizer

    out = _out_file(args.out, "tokenizer.json", "tokenizer train")
    tok = train_tokenizer(iter_documents(args.corpus, text_field=args.text_field), args.vocab_size, out)
    print(f"wrote {out} (vocab {tok.vocab_size})")
    return 0


def add_export_hf(sub) -> None:
    p = sub.add_parser("export-hf", help="write a Hugging Face transformers folder from a run or checkpoint")
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder"
    )
    _positional_out(p)
    p.set_defaults(func=cmd_export_hf)


def cmd_export_hf(args: argparse.Namespace) -> int:
    from smallinit.export.hf import export_hf

    r = export_hf(args.checkpoint, _required_out(args, "export-hf"))
    remote = " (load with trust_remote_code=True)" if r.remote_code else ""
    print(f"wrote {r.out_dir}: {r.architecture}{remote}, step {r.step}; {r.reason}")
    return 0


def add_generate(sub) -> None:
    p = sub.add_parser(
        "generate", help="continue a prompt with a trained run or checkpoint (KV-cached decoding)"
    )
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder"
    )
    p.add_argument("--prompt", help="text to continue (default: stdin, as is; empty = a new document)")
    p.add_argument(
        "--max-new-tokens", type=int, default=100, help="at most this many new tokens (default 100)"
    )
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1)"
    )
    p.add_argument("--top-k", type=int, help="sample only from the k most likely tokens (default: all)")
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="sample only from the most likely tokens holding this probability, in (0, 1] (default 1)",
    )
    # the sampling's seed: no config key holds it (train.seed seeds the weights and batches)
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument(
        "--no-prompt",
        action="store_true",
        help="print only the continuation (default: the prompt, then its continuation)",
    )
    _device_arg(p)
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from smallinit.generate import Sampling, generate, load_pretrained

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed).validate()
    if args.prompt is None and sys.stdin.isatty():
        raise ConfigError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")
    prompt = sys.stdin.read() if args.prompt is None else args.prompt
    model, tokenizer = load_pretrained(args.checkpoint, device=args.device)
    continuation = generate(model, tokenizer, prompt, args.max_new_tokens, sampling)
    print(continuation if args.no_prompt else prompt + continuation)
    return 0


INIT_HF_KEYS = {
    "model.gamma": (float, 1.0),
    "model.norm_eps": (float, 1e-12),
    "model.gate": (str, "none"),
    "train.seed": (int, 0),
}


def add_init_hf(sub) -> None:
    p = sub.add_parser("init-hf", help="γ-init a Hugging Face architecture from its config.json and save it")
    p.add_argument("config", metavar="CONFIG_OR_DIR", help="a config.json or a folder holding one")
    _positional_out(p)
    _set_arg(
        p,
        "model.gamma=G: σ = d_in^(−γ) (default 1, the paper's choice); model.norm_eps=E: ε of every norm "
        "(default 1e-12); model.gate=elementwise|headwise|none: the attention output gate σ(X W_θ) on every "
        "softmax attention (default none); train.seed=N: seed of the weights (default 0)",
    )
    p.add_argument(
        "--keep-norm-eps",
        action="store_true",
        help="keep the architecture's ε (for norms that hard-code it or configs that cannot save it)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH_OR_FOLDER",
        help="the tokenizer to save with the model: a folder "
        "saved by save_pretrained, a tokenizer.json, or 'default' / 'bytes' (default: the largest of "
        "smallinit's builtin 8,192- and 257-token ones that covers the vocabulary, else none, said)",
    )
    _old(p, "--gamma", metavar="G", new="--set model.gamma={}", then=_to_set("model.gamma"))
    _old(p, "--norm-eps", metavar="E", new="--set model.norm_eps={}", then=_to_set("model.norm_eps"))
    _old(p, "--seed", metavar="N", new="--set train.seed={}", then=_to_set("train.seed"))
    p.set_defaults(func=cmd_init_hf)


def cmd_init_hf(args: argparse.Namespace) -> int:
    from smallinit.export.hf import init_hf

    out, sets = _required_out(args, "init-hf"), _model_sets(args, INIT_HF_KEYS)
    norm_eps = None if args.keep_norm_eps else sets["model.norm_eps"]
    print(
        init_hf(
            args.config,
            out,
            gamma=sets["model.gamma"],
            norm_eps=norm_eps,
            seed=sets["train.seed"],
            tokenizer=args.tokenizer,
            gate=sets["model.gate"],
        )
    )
    return 0


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="lm-evaluation-harness on a run or checkpoint (needs the eval extra)")
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder"
    )
    p.add_argument(
        "--tasks", required=True, help="comma-separated lm-eval tasks, e.g. hellaswag,triviaqa,gsm8k"
    )
    p.add_argument("--limit", type=float, help="at most N examples per task (a fraction if < 1)")
    p.add_argument("--include-path", metavar="DIR", help="folder of extra task YAMLs (e.g. local tasks)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each task's own)")
    # lm-eval's own knob, passed through: no smallinit config key holds it
    p.add_argument(
        "--batch-size", type=int, default=8, help="lm-eval's batch size: requests per forward (default 8)"
    )
    _device_arg(p)
    p.add_argument("--log-samples", action="store_true", help="store every example's inputs and outputs too")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from smallinit.export.lmeval import run_eval

    limit = None if args.limit is None else (int(args.limit) if args.limit.is_integer() else args.limit)
    r = run_eval(
        args.checkpoint,
        args.tasks.split(","),
        limit=limit,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        device=args.device,
        log_samples=args.log_samples,
    )
    print(r.table)
    print(f"results: {r.results_file}")
    return 0


# -- measuring models ----------------------------------------------------------------------------------------------


def _window_args(p: argparse.ArgumentParser, keys: dict[str, tuple[type, object]], help: str) -> None:
    """--set for the windows a measurement reads (the config keys that size training's own windows), and the
    old flags they replace."""
    _set_arg(p, help)
    for key, flag in (
        ("train.eval_batches", "--batches"),
        ("train.batch_size", "--batch-size"),
        ("data.seq_len", "--seq-len"),
    ):
        if key in keys:
            _old(p, flag, metavar="N", new=f"--set {key}={{}}", then=_to_set(key))


ANALYZE_KEYS = {"train.eval_batches": (int, 4), "train.batch_size": (int, 8), "data.seq_len": (int, None)}


def add_analyze(sub) -> None:
    p = sub.add_parser(
        "analyze",
        help="all single-model measurements of a run, checkpoint or Hugging Face model (JSON + figures)",
    )
    p.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="run folder (its newest checkpoint), checkpoint folder, "
        "or Hugging Face model folder (config.json + safetensors)",
    )
    p.add_argument(
        "--hf", action="store_true", help="read the folder as a Hugging Face model (else detected)"
    )
    p.add_argument(
        "--data",
        metavar="CORPUS",
        help="text to measure on (default: the run's validation split; "
        "the builtin corpus for a Hugging Face model)",
    )
    _out(p, "output folder (default: RUN/analysis)")
    _window_args(
        p,
        ANALYZE_KEYS,
        "the held-out windows measured: train.eval_batches=N batches (default 4) of "
        "train.batch_size=N sequences (default 8) of data.seq_len=N tokens (default: the run's; 256 for a "
        "Hugging Face model); progress and the time left go to stderr",
    )
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help=TOKENIZER_HELP)
    _device_arg(p)
    p.set_defaults(func=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    from smallinit.analysis import analyze_checkpoint, check_norm_saturation
    from smallinit.analysis.measure import default_output_dir
    from smallinit.report import analysis_lines, write_analysis

    sets = _model_sets(args, ANALYZE_KEYS)
    batches, batch_size, seq_len = sets["train.eval_batches"], sets["train.batch_size"], sets["data.seq_len"]
    result = analyze_checkpoint(
        args.checkpoint,
        data=args.data,
        batches=batches,
        batch_size=batch_size,
        seq_len=seq_len,
        device=args.device,
        hf=args.hf,
        tokenizer=args.tokenizer,
        progress=sys.stderr,
    )
    cfg = result.run_config
    if cfg is not None:
        check_norm_saturation(cfg.model)
    out = Path(args.out) if args.out else default_output_dir(result.checkpoint)
    paths = write_analysis(result, out)
    if result.note:
        print(result.note)
    print("\n".join(analysis_lines(result, seq_len or (cfg.data.seq_len if cfg else None))))
    print(f"measured on {result.data}")
    if cfg:
        print(_analyze_loss_note(cfg, args.data, (batches, batch_size, seq_len or cfg.data.seq_len)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _analyze_loss_note(cfg, data: str | None, here: tuple[int, int, int]) -> str:
    """Which text the loss above is measured on, beside the windows of training's validation loss."""
    if data:
        return "this loss is on the --data text; training's val loss is on its validation split, so they do not compare"
    train = (cfg.train.eval_batches, cfg.train.batch_size, cfg.data.seq_len)
    if here == train:
        return "this loss is on the validation windows training's val loss is measured on, so the two compare directly"
    return (
        f"this loss is on {here[0] * here[1]} windows of {here[2]} tokens from the start of the validation split, "
        f"training's val loss on {train[0] * train[1]} windows of {train[2]} tokens, so the two differ a little; "
        f"to measure on training's windows add --set train.eval_batches={train[0]} --set "
        f"train.batch_size={train[1]} --set data.seq_len={train[2]}"
    )


COMPARE_KEYS = {"train.batch_size": (int, 8), "data.seq_len": (int, None)}


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="token-level comparison of two models: Δ_sym by token difficulty")
    p.add_argument("checkpoint_a", metavar="CKPT_A", help="model A (Δ_sym > 0 where A is better)")
    p.add_argument(
        "checkpoint_b", metavar="CKPT_B", help="model B (runs, checkpoints or Hugging Face folders)"
    )
    p.add_argument(
        "--hf", action="store_true", help="read both folders as Hugging Face models (else detected)"
    )
    p.add_argument(
        "--data",
        metavar="CORPUS",
        help="text to compare on, streamed (default: A's validation split; "
        "the builtin corpus with a Hugging Face model)",
    )
    _out(p, "output folder (default: A's run folder, analysis/compare-B)")
    p.add_argument("--labels", metavar="A,B", help="names for the two models (default: their run folders)")
    p.add_argument(
        "--max-tokens",
        type=_budget,
        metavar="N|all",
        help="stop after about N tokens (default 32,768; "
        "progress and the time left go to stderr; what it costs: benchmarks/README.md); all: the whole "
        "text",
    )
    p.add_argument("--bins", type=int, default=10, help="difficulty quantile bins (default 10)")
    p.add_argument("--top-k", type=int, default=20, help="largest gaps to list each way (default 20)")
    _window_args(
        p,
        COMPARE_KEYS,
        "the windows compared: train.batch_size=N sequences per forward (default 8) of "
        "data.seq_len=N tokens (default: the runs' data.seq_len)",
    )
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help=TOKENIZER_HELP)
    _device_arg(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from smallinit.analysis.measure import compare_checkpoints
    from smallinit.report import write_compare

    sets = _model_sets(args, COMPARE_KEYS)
    labels = tuple(args.labels.split(",", 1)) if args.labels else None
    budget = (
        {}
        if args.max_tokens is None
        else {"max_tokens": None if args.max_tokens == "all" else args.max_tokens}
    )
    r = compare_checkpoints(
        args.checkpoint_a,
        args.checkpoint_b,
        data=args.data,
        batch_size=sets["train.batch_size"],
        seq_len=sets["data.seq_len"],
        bins=args.bins,
        top_k=args.top_k,
        labels=labels,
        device=args.device,
        hf=args.hf,
        tokenizer=args.tokenizer,
        progress=sys.stderr,
        **budget,
    )
    for note in r.meta.get("notes", []):
        print(note)
    print(f"measured on {r.meta['data']}")
    print(
        f"{r.tokens:,} tokens: mean Δ_sym {r.mean_delta_sym:+.4f} (> 0: {r.meta['label_a']} better); "
        f"loss {r.mean_loss_a:.4f} vs {r.mean_loss_b:.4f}"
    )
    print("wrote " + ", ".join(str(p) for p in write_compare(r, args.out)))
    return 0


def add_coordcheck(sub) -> None:
    p = sub.add_parser(
        "coordcheck",
        help="activation and update scales over γ in the first steps (fresh models); "
        "train.batch_size is 8 here unless --set",
    )
    _config_args(p)
    p.add_argument("--gammas", type=_floats, default=[0.5, 0.75, 1.0, 1.25], help="comma-separated γ values")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per γ (default 5)")
    _out(p, "output folder (default runs/coordcheck, beside the runs)", default="runs/coordcheck")
    p.add_argument(
        "--residual-flow",
        action="store_true",
        help="also fit the residual-flow exponent over widths (the paper predicts 1 − γ)",
    )
    p.add_argument("--widths", type=_ints, default=[64, 128, 256, 512], help="widths for --residual-flow")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="seeds for --residual-flow")
    _old(p, "--batch-size", metavar="N", new="--set train.batch_size={}", then=_to_set("train.batch_size"))
    p.set_defaults(func=cmd_coordcheck)


def cmd_coordcheck(args: argparse.Namespace) -> int:
    from smallinit.analysis import coord_check, residual_flow_sweep
    from smallinit.report import write_coordcheck, write_sweep

    args.overrides.insert(
        0, "train.batch_size=8"
    )  # its few steps need no more; before --set, which may change it
    cfg = _load_config(args)
    cc = coord_check(
        cfg.model,
        args.gammas,
        args.steps,
        train=cfg.train,
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.seq_len,
        seed=cfg.train.seed,
    )
    paths = write_coordcheck(cc, args.out)
    if args.residual_flow:
        sweep = residual_flow_sweep(args.gammas, args.widths, base_config=cfg.model, seeds=args.seeds)
        paths += write_sweep(sweep, args.out)
        for g, s in zip(sweep.gammas, sweep.slopes):
            print(f"γ = {g:g}: residual-flow exponent {s:+.3f} (predicted {1 - g:+.3f})")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def add_report(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report for run, sweep or recipe folders")
    p.add_argument(
        "dirs", nargs="+", metavar="DIR", help="run, sweep or recipe folders; everything below them is read"
    )
    _out(p, "folder to write report.html into (default: the folder given; needed for several folders)")
    p.add_argument(
        "--include-unfinished",
        action="store_true",
        help="draw runs that have not finished in the "
        "figures too (they are always listed, marked, in the runs table)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from smallinit.report import build_report

    out = _out_file(args.out, "report.html", "report")
    print(f"wrote {build_report(args.dirs, out, include_unfinished=args.include_unfinished)}")
    return 0


# -- the whole -------------------------------------------------------------------------------------------------------

COMMANDS = (
    add_train,
    add_config,
    add_info,
    add_plan,
    add_recipes,
    add_recipe,
    add_sweep,
    add_status,
    add_demo,
    add_tokenizer,
    add_export_hf,
    add_generate,
    add_init_hf,
    add_eval,
    add_analyze,
    add_compare,
    add_coordcheck,
    add_report,
)


def _version() -> str:
    import platform

    import torch

    from smallinit.version import __version__

    return f"smallinit {__version__} (torch {torch.__version__}, Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="smallinit", description="Small initialization for language models.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Process setup: PyTorch backs CPU tensors of >= 2 MB with transparent huge pages when this is set before
    # its first such allocation; a training step then takes far fewer page faults (the gain is measured in
    # benchmarks/README.md). THP_MEM_ALLOC_ENABLE=0 in the environment opts out.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SmallinitError as e:
        one_line = str(e).replace("\r", "\\r").replace("\n", "\\n")  # a file name may hold a newline
        kind = "" if isinstance(e, Preempted) else "error: "  # a stop that was asked for is not an error
        sys.stderr.write(
            f"smallinit: {kind}{one_line}\n"
        )  # one write: lines of several ranks do not interleave
        return e.exit_code
    except (
        OSError
    ) as e:  # a read or write no library call turned into a SmallinitError (disk full, read-only)
        where = f" {e.filename}" if e.filename else ""
        sys.stderr.write(
            f"smallinit: error: cannot access{where} ({e.strerror or type(e).__name__}); "
            "check free disk space, permissions and the path\n"
        )
        return 2
    except (MemoryError, RuntimeError) as e:  # an allocation no estimate foresaw (CPU, GPU or numpy)
        if not isinstance(e, MemoryError) and not any(m in str(e) for m in _OUT_OF_MEMORY):
            raise
        sys.stderr.write(
            f"smallinit: error: out of memory ({_first_line(e)}); lower train.batch_size or "
            "data.seq_len, raise train.grad_accum, set train.activation_checkpointing=true or choose a "
            "smaller model\n"
        )
        return 2
    except KeyboardInterrupt:
        print("smallinit: interrupted", file=sys.stderr)
        return 130


_OUT_OF_MEMORY = ("out of memory", "can't allocate memory")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


if __name__ == "__main__":
    sys.exit(main())
