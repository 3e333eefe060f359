"""Training and configs: ``train``, ``config`` (the resolved config) and ``info`` (counts, the init table,
memory)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smallinit.cli.args import config_args, load_config, num_devices_arg, out_arg
from smallinit.cli.base import Command
from smallinit.cli.deprecated import old, to_set


def add_train(p: argparse.ArgumentParser) -> None:
    config_args(p)
    out_arg(p, "run folder (default runs/train)", default="runs/train")
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
    old(p, "--wandb", nargs=0, new="--set train.wandb=true", then=to_set("train.wandb", "true"))


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
        cfg = load_config(args)
    trainer = Trainer(cfg, out, resume=args.resume)
    if trainer.finished:  # a resumed run that already reached train.steps: say so, write nothing
        trainer.close()
        shutdown()
        if trainer.runtime.is_main:
            how = (
                f"smallinit train --out {out} --resume --set train.steps=N (N > {trainer.step})"
                if trainer.lengthens
                else f"its {trainer.cfg.train.schedule} schedule has run its course, so start a new run from its "
                f"weights: smallinit train --out NEW_RUN --init-from {out} --set train.steps=N (docs/config.md)"
            )
            print(
                f"nothing trained: {out} already reached train.steps={trainer.step}; to train longer: {how}"
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


def add_config(p: argparse.ArgumentParser) -> None:
    config_args(p)


def cmd_config(args: argparse.Namespace) -> int:
    print("# smallinit config: defaults → --config → --preset → --set, resolved; every key in docs/config.md")
    print(load_config(args).to_toml(), end="")
    return 0


def add_info(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--memory", action="store_true", help="estimate training memory per GPU instead of the init table"
    )
    num_devices_arg(p, "GPUs for --memory (the global batch is split over them; default 1)", default=1)
    p.add_argument(
        "--layers",
        action="store_true",
        help="the init table with one row per parameter of every layer "
        "(default: one row per parameter of a block, with its count)",
    )


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    from smallinit.analysis import check_norm_saturation
    from smallinit.init import init_plan
    from smallinit.model import Transformer

    cfg = load_config(args)
    check_norm_saturation(cfg.model)
    with torch.device("meta"):  # shapes only: counts and the init table without allocating the weights
        model = Transformer(cfg.model, init=False)
    # the plan first: a bad init scale is refused before anything is printed
    plan = init_plan(
        model, cfg.model.gamma, example_inputs=model.example_inputs(), scales=cfg.model.init_scales
    )
    total, active = model.num_params(), model.num_params(active=True)
    print(
        f"parameters: {total:,} total, {active:,} active, {model.num_params(embeddings=False):,} without embeddings"
    )
    if args.memory:
        from smallinit.train.memory import describe_memory

        print(describe_memory(cfg, args.num_devices))
        return 0
    print(plan if args.layers else plan.summary())
    return 0


COMMANDS = (
    Command("train", "train a model", add_train, cmd_train),
    Command(
        "config",
        "print the resolved config (defaults → --config → --preset → --set) as commented TOML",
        add_config,
        cmd_config,
    ),
    Command("info", "parameter counts and the γ-init table of a config", add_info, cmd_info),
)
