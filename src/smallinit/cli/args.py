"""The flags several commands share, declared once, and the value types of flags: configuration (--config,
--preset, --set), --out, --device, the SLURM options, and the lists and budgets flags take."""

from __future__ import annotations

import argparse
from pathlib import Path

from smallinit.cli.deprecated import notice, old, store
from smallinit.config.overrides import parse_override
from smallinit.errors import ConfigError, did_you_mean


def _key_value(text: str) -> str:
    """--set takes one word KEY=VALUE; "--set train.steps 10" would otherwise end as "unrecognized arguments: 10"."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE; write key and value as one word, e.g. --set "
            f"{text if '.' in text else 'train.steps'}=VALUE"
        )
    return text


def set_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_key_value,
        help=help,
    )


def config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE.toml",
        help="a TOML config (sections model, train, data, analysis), "
        "or a run folder or its config.json to take that run's config",
    )
    p.add_argument("--preset", metavar="NAME", help="model preset, e.g. cpu-1m, cpu-5m, 0.1b, 1.5b")
    set_arg(p, "override a config key, e.g. --set train.steps=200 --set model.gate=headwise")


def load_config(args: argparse.Namespace):
    from smallinit.config import Config

    return Config.load(args.config, preset=args.preset, overrides=args.overrides)


def model_sets(args: argparse.Namespace, keys: dict[str, tuple[type, object]]) -> dict[str, object]:
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
            what = {int: "a whole number", string_list: 'a list of strings such as ["output=zero"]'}
            raise ConfigError(f"--set {item}: {key} takes {what.get(kind, 'a number')}") from None
    return values


def string_list(text: str) -> list[str]:
    """A --set value that is a list of strings, read as a config's is (a TOML literal: ["a", "b"])."""
    _, value = parse_override(f"v={text}")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(text)
    return value


def out_arg(p: argparse.ArgumentParser, help: str, **kwargs) -> None:
    p.add_argument("--out", metavar="DIR", help=help, **kwargs)


def positional_out(p: argparse.ArgumentParser) -> None:
    """--out DIR, required, and the positional OUT_DIR it replaces (kept for one release)."""
    out_arg(p, "new folder to write (required)")
    old(p, "old_out", nargs="?", metavar="OUT_DIR", new="--out {}", then=store("out"))


def required_out(args: argparse.Namespace, command: str) -> Path:
    if args.out is None:
        raise ConfigError(f"{command} needs --out DIR, the new folder to write")
    return Path(args.out)


def out_file(out: str | None, name: str, command: str) -> Path | None:
    """The file a one-file command writes: DIR/name for --out DIR. An --out ending in name's suffix is the old
    spelling, the file itself; it still works."""
    if out is None:
        return None
    suffix = Path(name).suffix
    if out.endswith(suffix):
        notice(
            f"smallinit {command} --out FILE{suffix}", f"smallinit {command} --out DIR (writes DIR/{name})"
        )
        return Path(out)
    return Path(out) / name


def device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="where this command runs: cpu (default), cuda or cuda:N")


def num_devices_arg(p: argparse.ArgumentParser, help: str, **kwargs) -> None:
    p.add_argument("--num-devices", type=int, metavar="N", help=help, **kwargs)
    old(p, "--gpus", type=int, metavar="N", new="--num-devices {}", then=store("num_devices"))


def floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def budget(text: str) -> int | str:
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


def slurm_args(p: argparse.ArgumentParser) -> None:
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


def slurm(args: argparse.Namespace) -> dict | None:
    """The SLURM flags given (None: not given), or None to run here."""
    if getattr(args, "scheduler", "local") != "slurm":
        return None
    keys = ("partition", "account", "time", "nodes", "gpus_per_node", "cpus_per_task", "max_running")
    return {**{k: getattr(args, k) for k in keys}, "extra": args.sbatch}
