"""The sweep file: a base config crossed with a grid of values (and optional named arms and sizes).

A sweep file (TOML)::

    [sweep]
    name = "gamma-eps"                      # optional
    description = "γ × ε at cpu-1m"         # optional

    [base]                                  # config keys, dotted or as sections
    model.preset = "cpu-1m"
    train.steps = 200

    [grid]                                  # key → list of values; the cells are the product
    "model.gamma" = [0.5, 1.0]
    "train.seed" = [0, 1, 2]

    [arms.baseline]                         # optional: named override sets, crossed with the grid
    "model.norm_eps" = 1e-5
    [arms.fixed]
    "model.norm_eps" = 1e-12

    [sizes.small]                           # optional: a second named axis, for model sizes
    "model.preset" = "cpu-1m"

    [slurm]                                 # optional: how --scheduler slurm submits it (running.sbatch)
    partition = "gpu"

Later layers win: base, then size, then arm, then grid values. Cells are ordered sizes outermost, then
arms, then the grid keys in file order.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from smallinit.config import Config, flatten, read_toml
from smallinit.config.files import toml_literal
from smallinit.data import load_tokenizer
from smallinit.errors import ExperimentError, SmallinitError
from smallinit.study.running.sbatch import SlurmOptions

_SECTIONS = ("sweep", "base", "grid", "arms", "sizes", "slurm")
_SWEEP_KEYS = ("name", "description", "launcher")
# A file may name torchrun with these launch options only: a sweep file is data, and data downloaded with a
# recipe must not choose which program runs. Any other launcher comes from the command line (--launcher).
_FILE_LAUNCHER = "torchrun"
_LAUNCH_OPTIONS = (
    "standalone",
    "nproc-per-node",
    "nnodes",
    "node-rank",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "master-addr",
    "master-port",
    "max-restarts",
    "monitor-interval",
    "redirects",
    "tee",
)


def launcher_argv(launcher: str, where: str = "--launcher") -> list[str]:
    """The words of a launcher command; ``smallinit train``'s ``-m smallinit ...`` is appended to them."""
    try:
        argv = shlex.split(launcher)
    except ValueError as e:
        raise ExperimentError(
            f"{where}: {launcher!r} is not a command line ({e}); check its quotes"
        ) from None
    if not argv:
        raise ExperimentError(f"{where} is empty; name a program such as torchrun, or leave it out")
    return argv


def check_file_launcher(launcher: str, where: str) -> None:
    """A launcher written in a file: torchrun and its launch options, nothing else (see _LAUNCH_OPTIONS)."""
    argv = launcher_argv(launcher, f"{where}: sweep.launcher")
    if argv[0] != _FILE_LAUNCHER:
        bad = f"program {argv[0]!r}"
    else:
        bad = next((f"option {arg!r}" for arg in argv[1:] if not _launch_option(arg)), "")
    if bad:
        raise ExperimentError(
            f"{where}: sweep.launcher may name only torchrun with --option=value launch options, not {bad}; "
            "to run cells through another command, pass it on the command line: --launcher 'COMMAND'"
        )


def _launch_option(arg: str) -> bool:
    name, _, value = arg.removeprefix("--").partition("=")
    return (
        arg.startswith("--")
        and name.replace("_", "-") in _LAUNCH_OPTIONS
        and re.fullmatch(r"[A-Za-z0-9._:/-]*", value) is not None
    )


def _id_part(value: Any) -> str:
    text = toml_literal(value).strip('"') if not isinstance(value, float) else repr(value)
    return re.sub(r"[^A-Za-z0-9.+-]", "", text) or "x"


def cell_dir(sweep_dir: str | os.PathLike, cell_id: str) -> Path:
    """The run folder of cell ``cell_id`` in a sweep folder."""
    return Path(sweep_dir) / "cells" / cell_id


@dataclass(frozen=True)
class Cell:
    """One point of a sweep: its folder name, its grid values and every config key it sets."""

    id: str
    arm: str | None
    values: dict[str, Any]
    overrides: dict[str, Any]
    size: str | None = None

    def set_args(self) -> list[str]:
        """The ``key=value`` overrides, as ``smallinit train --set`` takes them."""
        return [f"{k}={toml_literal(v)}" for k, v in self.overrides.items()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "size": self.size,
            "arm": self.arm,
            "values": self.values,
            "overrides": self.overrides,
        }


def refuse_a_run_config(sections: list[str], where: str, kind: str) -> None:
    """A file whose unknown sections are a training config's was given where a sweep or recipe goes: say so."""
    if sections and set(sections) <= {f.name for f in fields(Config)}:
        raise ExperimentError(
            f"{where} is a training config ([{'], ['.join(sections)}]), not a {kind}; train it with smallinit "
            f'train --config FILE, or put its keys in a {kind}\'s [base] as "section.key" = value'
        )


@dataclass
class Sweep:
    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    name: str = "sweep"
    description: str = ""
    launcher: str = ""  # command that starts ``-m smallinit train`` instead of this Python, e.g. torchrun
    slurm: SlurmOptions = field(default_factory=SlurmOptions)  # used with --scheduler slurm

    @staticmethod
    def from_dict(raw: dict[str, Any], where: str = "sweep") -> Sweep:
        """Build and check a sweep from a parsed TOML table; ``where`` names it in error messages."""
        unknown = sorted(set(raw) - set(_SECTIONS))
        refuse_a_run_config(unknown, where, "sweep")
        if unknown:
            raise ExperimentError(
                f"{where}: unknown section [{unknown[0]}]; use [sweep], [base], [grid], [arms.NAME] and [slurm]"
            )
        for section in _SECTIONS:
            if not isinstance(raw.get(section, {}), dict):
                raise ExperimentError(f"{where}: [{section}] must be a table")
        meta = raw.get("sweep", {})
        bad = sorted(set(meta) - set(_SWEEP_KEYS))
        if bad:
            raise ExperimentError(
                f"{where}: unknown key sweep.{bad[0]}; [sweep] takes name, description and launcher"
            )
        grid = flatten(raw.get("grid", {}))
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ExperimentError(
                    f"{where}: grid key {key} must be a non-empty list of values, e.g. {key} = [0.5, 1.0]"
                )
        axes: dict[str, dict[str, dict[str, Any]]] = {"arms": {}, "sizes": {}}
        for axis, named in axes.items():
            for name, table in raw.get(axis, {}).items():
                if not isinstance(table, dict):
                    raise ExperimentError(f"{where}: {axis}.{name} must be a table of config keys")
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]*", name):
                    raise ExperimentError(
                        f"{where}: {axis} name {name!r} may hold only letters, digits and . + -"
                    )
                named[name] = flatten(table)
        if meta.get("launcher"):
            check_file_launcher(str(meta["launcher"]), where)
        sweep = Sweep(
            base=flatten(raw.get("base", {})),
            grid=grid,
            arms=axes["arms"],
            sizes=axes["sizes"],
            name=str(meta.get("name", "sweep")),
            description=str(meta.get("description", "")),
            launcher=str(meta.get("launcher", "")),
            slurm=SlurmOptions.from_dict(raw.get("slurm", {}), f"{where}: [slurm]"),
        )
        sweep.cells()  # checks ids and literals
        return sweep

    @staticmethod
    def load(path: str | os.PathLike) -> Sweep:
        try:
            raw = read_toml(path)
        except SmallinitError as e:
            raise ExperimentError(str(e).replace("config file", "sweep file")) from None
        sweep = Sweep.from_dict(raw, where=f"sweep file {os.fspath(path)}")
        if "name" not in raw.get("sweep", {}):  # a file without [sweep] name is named by its file
            sweep.name = Path(path).stem
        return sweep

    @property
    def folder_name(self) -> str:
        """The sweep's name as a folder name: ``smallinit sweep`` writes to runs/<this> unless told --out."""
        return re.sub(r"[^\w.+=-]+", "-", self.name).strip(".-") or "sweep"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "launcher": self.launcher,
            "base": self.base,
            "grid": self.grid,
            "arms": self.arms,
            "sizes": self.sizes,
            "slurm": self.slurm.to_dict(),
        }

    def cells(self) -> list[Cell]:
        """Every cell, in run order: sizes, then arms, then the grid keys in the order they were written."""
        short = {k: k.rsplit(".", 1)[-1] for k in self.grid}
        if len(set(short.values())) < len(short):
            short = {k: k.replace(".", "-") for k in self.grid}
        cells, seen = [], {}
        for size, arm in itertools.product(list(self.sizes) or [None], list(self.arms) or [None]):
            for combo in itertools.product(*self.grid.values()):
                values = dict(zip(self.grid, combo))
                parts = [n for n in (size, arm) if n] + [
                    f"{short[k]}-{_id_part(v)}" for k, v in values.items()
                ]
                cid = "_".join(parts) or "base"
                overrides = {
                    **self.base,
                    **self.sizes.get(size or "", {}),
                    **self.arms.get(arm or "", {}),
                    **values,
                }
                if cid in seen:
                    raise ExperimentError(
                        f"sweep: cells {seen[cid]} and {values} get the same folder name {cid!r}; "
                        "make the grid values distinct"
                    )
                seen[cid] = values
                cell = Cell(cid, arm, values, overrides, size)
                cell.set_args()  # every value must have a literal
                cells.append(cell)
        return cells


def resolve_config(cell: Cell, vocab_sizes: dict[str, int] | None = None) -> Config:
    """The cell's full config, as the training process will see it (vocabulary from its tokenizer).

    ``vocab_sizes`` caches tokenizer name → vocabulary size across cells.
    """
    vocab_sizes = {} if vocab_sizes is None else vocab_sizes
    try:
        cfg = Config.load(overrides=cell.set_args())
        name = cfg.data.tokenizer
        if name not in vocab_sizes:
            vocab_sizes[name] = load_tokenizer(name).vocab_size
        cfg.model.vocab_size = vocab_sizes[name]
        return cfg.validate()
    except SmallinitError as e:
        raise ExperimentError(f"sweep cell {cell.id}: {e}") from None
