"""Sweeps: a base config crossed with a grid of values (and optional named arms), one process per cell.

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

Cells run in order (sizes outermost, then arms, then the grid keys in file order) as ``python -m smallinit
train --out SWEEP/cells/<cell-id> --set ...`` (or ``<launcher> -m smallinit train ...`` when [sweep] sets
``launcher``, e.g. ``"torchrun --standalone --nproc_per_node=gpu"``: in a file only torchrun with launch
options, any other command only from the command line), so a crash or a NaN in one cell cannot
stop the others. Later layers win: base, then size, then arm, then grid values. The sweep folder
holds ``sweep.json`` (the cells), ``status.json`` (pending / running / done / failed / interrupted per cell,
with the error line; rewritten atomically after every change), ``results.csv`` and ``results.json`` (one
row per cell) and ``cells/<cell-id>/`` (a run folder plus ``train.log``). Running the sweep again skips
cells that finished, resumes interrupted ones from their newest checkpoint (``--resume``) and leaves failed
ones alone unless asked to retry them. A lock on the folder keeps two runners apart.

Packing: ``jobs`` cells run side by side, each with ``cores // jobs`` threads (through OMP_NUM_THREADS, so
a cell's config and hence its results do not depend on the packing). Default rule: on CPU, models of at most
``SMALL_MODEL_PARAMS`` parameters run one single-threaded cell per core (small matmuls do not use two threads
well: two 1-thread runs side by side trained 1.22-1.34× the tokens/s of one 2-thread run at cpu-1m,
1.12-1.18× at cpu-5m and 1.05-1.08× at cpu-20m, benchmarks/README.md); larger models, which were not
measured, and any cell on a GPU, run one at a time with every thread.

Compiling: the cells share one compile cache (``TORCHINDUCTOR_CACHE_DIR``: the user's, else ``compile/`` in
smallinit's cache folder), and cells that leave ``train.compile`` at "auto" get one choice per graph, weighed
over all the cells of that graph (``smallinit.train.compiling``), passed as ``--set train.compile=...``.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import itertools
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from ..config import Config, flatten, read_toml
from ..data import load_tokenizer
from ..data.cache import default_cache_dir
from ..errors import ExperimentError, SmallinitError
from ..io import read_json, write_json_atomic, write_text_atomic
from ..model import Transformer
from ..train import compiling
from ..train.metrics import read_metrics

STATUSES = ("pending", "running", "done", "failed", "interrupted")
SMALL_MODEL_PARAMS = 25_000_000  # ≤ this (every CPU preset, the demo's shapes): pack one cell per core
_SECTIONS = ("sweep", "base", "grid", "arms", "sizes")
_SWEEP_KEYS = ("name", "description", "launcher")
# A file may name torchrun with these launch options only: a sweep file is data, and data downloaded with a
# recipe must not choose which program runs. Any other launcher comes from the command line (--launcher).
_FILE_LAUNCHER = "torchrun"
_LAUNCH_OPTIONS = ("standalone", "nproc-per-node", "nnodes", "node-rank", "rdzv-backend", "rdzv-endpoint", "rdzv-id",
                   "master-addr", "master-port", "max-restarts", "monitor-interval", "redirects", "tee")
_POLL_S = 0.2
_ORPHAN_WAIT_S = 120.0  # how long a re-run waits for a cell process left over from a killed runner
_EXIT_PREEMPTED = 75


# -- the sweep file ---------------------------------------------------------------------------------------


def toml_literal(value: Any) -> str:
    """A value as the TOML literal ``--set key=<literal>`` reads back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ExperimentError(f"sweep value {value!r} is not finite; use a finite number")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise ExperimentError(f"sweep value {value!r} has unsupported type {type(value).__name__}")


def launcher_argv(launcher: str, where: str = "--launcher") -> list[str]:
    """The words of a launcher command; ``smallinit train``'s ``-m smallinit ...`` is appended to them."""
    try:
        argv = shlex.split(launcher)
    except ValueError as e:
        raise ExperimentError(f"{where}: {launcher!r} is not a command line ({e}); check its quotes") from None
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
            "to run cells through another command, pass it on the command line: --launcher 'COMMAND'")


def _launch_option(arg: str) -> bool:
    name, _, value = arg.removeprefix("--").partition("=")
    return (arg.startswith("--") and name.replace("_", "-") in _LAUNCH_OPTIONS
            and re.fullmatch(r"[A-Za-z0-9._:/-]*", value) is not None)


def _id_part(value: Any) -> str:
    text = toml_literal(value).strip('"') if not isinstance(value, float) else repr(value)
    return re.sub(r"[^A-Za-z0-9.+-]", "", text) or "x"


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
        return {"id": self.id, "size": self.size, "arm": self.arm, "values": self.values, "overrides": self.overrides}


@dataclass
class Sweep:
    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    name: str = "sweep"
    description: str = ""
    launcher: str = ""  # command that starts ``-m smallinit train`` instead of this Python, e.g. torchrun

    @staticmethod
    def from_dict(raw: dict[str, Any], where: str = "sweep") -> Sweep:
        """Build and check a sweep from a parsed TOML table; ``where`` names it in error messages."""
        unknown = sorted(set(raw) - set(_SECTIONS))
        if unknown:
            raise ExperimentError(
                f"{where}: unknown section [{unknown[0]}]; use [sweep], [base], [grid] and [arms.NAME]"
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
                    raise ExperimentError(f"{where}: {axis} name {name!r} may hold only letters, digits and . + -")
                named[name] = flatten(table)
        if meta.get("launcher"):
            check_file_launcher(str(meta["launcher"]), where)
        sweep = Sweep(
            base=flatten(raw.get("base", {})), grid=grid, arms=axes["arms"], sizes=axes["sizes"],
            name=str(meta.get("name", "sweep")), description=str(meta.get("description", "")),
            launcher=str(meta.get("launcher", "")),
        )
        sweep.cells()  # checks ids and literals
        return sweep

    @staticmethod
    def load(path: str | os.PathLike) -> Sweep:
        try:
            raw = read_toml(path)
        except SmallinitError as e:
            raise ExperimentError(str(e).replace("config file", "sweep file")) from None
        return Sweep.from_dict(raw, where=f"sweep file {os.fspath(path)}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "launcher": self.launcher, "base": self.base,
                "grid": self.grid, "arms": self.arms, "sizes": self.sizes}

    def cells(self) -> list[Cell]:
        """Every cell, in run order: sizes, then arms, then the grid keys in the order they were written."""
        short = {k: k.rsplit(".", 1)[-1] for k in self.grid}
        if len(set(short.values())) < len(short):
            short = {k: k.replace(".", "-") for k in self.grid}
        cells, seen = [], {}
        for size, arm in itertools.product(list(self.sizes) or [None], list(self.arms) or [None]):
            for combo in itertools.product(*self.grid.values()):
                values = dict(zip(self.grid, combo))
                parts = [n for n in (size, arm) if n] + [f"{short[k]}-{_id_part(v)}" for k, v in values.items()]
                cid = "_".join(parts) or "base"
                overrides = {**self.base, **self.sizes.get(size or "", {}), **self.arms.get(arm or "", {}), **values}
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


# -- resolving cells --------------------------------------------------------------------------------------


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


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _on_gpu(cfg: Config) -> bool:
    device = cfg.train.device
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def compile_cache_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The compile cache of the cells: the user's TORCHINDUCTOR_CACHE_DIR, else one under smallinit's cache
    folder, shared by the cells of every sweep, so a graph compiled once loads in seconds in later cells."""
    return {"TORCHINDUCTOR_CACHE_DIR": environ.get("TORCHINDUCTOR_CACHE_DIR") or str(default_cache_dir() / "compile")}


def default_jobs(configs: list[Config], cores: int | None = None) -> int:
    """The packing rule: small CPU models one single-threaded cell per core, anything else one at a time."""
    cores = cores or available_cores()
    if not configs or any(_on_gpu(c) for c in configs):
        return 1
    if max(Transformer.count_params(c.model)[0] for c in configs) <= SMALL_MODEL_PARAMS:
        return max(1, min(cores, len(configs)))
    return 1


# -- status and results -----------------------------------------------------------------------------------


def error_line(log: Path) -> str:
    """The line that says why a cell failed: smallinit's error line, else the last line of its log."""
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for ln in reversed(lines):
        if ln.startswith("smallinit: error:"):
            return ln[len("smallinit: error:"):].strip()
    return lines[-1] if lines else "exited without output"


def cell_row(sweep_dir: Path, cell: Cell, state: dict[str, Any]) -> dict[str, Any]:
    """One results row: grid values, status, losses, sizes and time."""
    run = sweep_dir / "cells" / cell.id
    summary = read_json(run / "summary.json") or {}
    records = read_metrics(run)
    train = [r for r in records if "loss" in r and r.get("event") is None]
    vals = [r for r in records if "val_loss" in r]
    speeds = [r["tokens_per_s"] for r in train if isinstance(r.get("tokens_per_s"), (int, float))]
    row: dict[str, Any] = {"cell": cell.id, "status": state.get("status", "pending")}
    if cell.size is not None:
        row["size"] = cell.size
    if cell.arm is not None:
        row["arm"] = cell.arm
    row.update(cell.values)
    row.update({
        "val_loss": summary.get("val_loss", vals[-1]["val_loss"] if vals else None),
        "final_loss": train[-1]["loss"] if train else None,
        "step": summary.get("step", max((r.get("step", 0) for r in records), default=0)),
        "params": summary.get("params", state.get("params")),
        "params_active": summary.get("params_active"),
        "params_nonembed": state.get("params_nonembed"),
        "wall_s": state.get("wall_s"),
        "cpu_s": state.get("cpu_s"),
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "error": state.get("error"),
        "dir": f"cells/{cell.id}",
    })
    return row


def load_cells(sweep_dir: Path) -> list[Cell]:
    spec = read_json(sweep_dir / "sweep.json")
    if not isinstance(spec, dict) or "cells" not in spec:
        raise ExperimentError(f"{sweep_dir} is not a sweep folder (no readable sweep.json); pass a sweep's --out")
    return [Cell(c["id"], c.get("arm"), c["values"], c["overrides"], c.get("size")) for c in spec["cells"]]


def sweep_rows(sweep_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The results rows of a sweep folder, as they stand now (also while it runs)."""
    sweep_dir = Path(sweep_dir)
    cells = load_cells(sweep_dir)
    states = (read_json(sweep_dir / "status.json") or {}).get("cells", {})
    return [cell_row(sweep_dir, c, states.get(c.id, {})) for c in cells]


def write_results(sweep_dir: Path, rows: list[dict[str, Any]]) -> None:
    write_json_atomic(sweep_dir / "results.json", rows)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    write_text_atomic(sweep_dir / "results.csv", buf.getvalue())


def format_table(rows: list[dict[str, Any]]) -> str:
    """cell, status, step, val loss, wall time, error — one line per cell, then the counts."""
    header = ("cell", "status", "step", "val loss", "wall", "error")
    lines = [header]
    for r in rows:
        val = f"{r['val_loss']:.4f}" if isinstance(r.get("val_loss"), (int, float)) else "-"
        wall = f"{r['wall_s']:.0f}s" if isinstance(r.get("wall_s"), (int, float)) else "-"
        err = (r.get("error") or "")[:80] if r["status"] in ("failed", "interrupted") else ""
        lines.append((r["cell"], r["status"], str(r.get("step") or 0), val, wall, err))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = ["  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + ("  " + line[-1] if line[-1] else "")
           for line in lines]
    counts = {s: sum(r["status"] == s for r in rows) for s in ("done", "running", "interrupted", "pending", "failed")}
    out.append(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no cells")
    return "\n".join(line.rstrip() for line in out)


# -- running ------------------------------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    sweep_dir: Path
    rows: list[dict[str, Any]]
    interrupted: bool = False

    def count(self, status: str) -> int:
        return sum(r["status"] == status for r in self.rows)

    @property
    def exit_code(self) -> int:
        """0 all done; 1 some cell failed; 75 stopped by a signal (run again to continue)."""
        if self.interrupted:
            return _EXIT_PREEMPTED
        return 1 if self.count("failed") else 0


@contextlib.contextmanager
def _folder_lock(sweep_dir: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform: the user keeps runners apart
        yield
        return
    fd = os.open(sweep_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExperimentError(
                f"sweep folder {sweep_dir} is being run by another process; wait for it or choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _die_with_parent() -> None:
    """In the cell process: get SIGTERM (checkpoint, exit 75) when the runner dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: a killed runner leaves its cells running; the re-run waits for them


def _alive_cell_process(pid: int | None, run_dir: Path) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():  # the pid may have been reused by an unrelated process
        try:
            return str(run_dir) in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
    return True


@dataclass
class _Running:
    cell: Cell
    index: int
    proc: subprocess.Popen
    log: TextIO
    log_path: Path
    started: float
    offset: int = 0
    partial: str = ""
    cpu_s: float | None = None  # user + system CPU seconds of the cell process, once it has ended


def _poll(r: _Running) -> int | None:
    """The cell's exit code, or None while it runs; reaps it with wait4 to learn its CPU time."""
    if not hasattr(os, "wait4"):
        return r.proc.poll()
    try:
        pid, status, usage = os.wait4(r.proc.pid, os.WNOHANG)
    except ChildProcessError:
        return r.proc.poll()
    if pid == 0:
        return None
    r.proc.returncode = os.waitstatus_to_exitcode(status)
    r.cpu_s = usage.ru_utime + usage.ru_stime
    return r.proc.returncode


class SweepRunner:
    """Runs a sweep's cells into ``sweep_dir``; see the module docstring."""

    def __init__(
        self, sweep: Sweep, sweep_dir: str | os.PathLike, *, jobs: int | None = None, retry_failed: bool = False,
        echo: TextIO | None = None, python: str = sys.executable, progress: Progress | None = None,
    ):
        self.sweep, self.dir = sweep, Path(sweep_dir)
        self.cells = sweep.cells()
        vocab_sizes: dict[str, int] = {}
        self.configs = {c.id: resolve_config(c, vocab_sizes) for c in self.cells}  # all checked before any runs
        if jobs is not None and jobs < 1:
            raise ExperimentError(f"--jobs {jobs} must be ≥ 1")
        self.jobs = jobs or default_jobs(list(self.configs.values()))
        self.threads = max(1, available_cores() // self.jobs)
        self.retry_failed, self.echo, self.python = retry_failed, echo, python
        self.compile = self._compile_choices()
        self.overall = progress  # a recipe's progress over all its sweeps, told of each cell that ends
        self.states: dict[str, dict[str, Any]] = {}
        self.stop: list[str] = []

    # -- bookkeeping --

    def _say(self, text: str) -> None:
        if self.echo is not None:
            print(text, file=self.echo, flush=True)

    def _save_status(self) -> None:
        write_json_atomic(self.dir / "status.json", {
            "sweep": self.sweep.name, "updated": time.time(), "jobs": self.jobs,
            "cells": {c.id: self.states[c.id] for c in self.cells},
        })

    def _check_folder(self) -> None:
        """Refuse a folder that holds another sweep whose cells would collide with ours."""
        old = read_json(self.dir / "sweep.json")
        if old is None:
            if (self.dir / "cells").exists():
                raise ExperimentError(f"{self.dir} holds cells but no sweep.json; choose another --out")
            return
        before = {c["id"]: c.get("overrides") for c in old.get("cells", [])}
        for cell in self.cells:
            if cell.id in before and before[cell.id] != cell.overrides:
                raise ExperimentError(
                    f"sweep folder {self.dir} already has cell {cell.id} with other settings (the sweep file "
                    "changed); choose another --out or delete that cell's folder and its entry"
                )

    def _initial_states(self) -> None:
        old = (read_json(self.dir / "status.json") or {}).get("cells", {})
        for cell in self.cells:
            state = dict(old.get(cell.id) or {})
            run = self.dir / "cells" / cell.id
            total, nonembed = Transformer.count_params(self.configs[cell.id].model)
            state.update(params=total, params_nonembed=nonembed)
            state.setdefault("attempts", 0)
            state.setdefault("wall_s", 0.0)
            if state.get("status") == "running" and _alive_cell_process(state.get("pid"), run):
                self._wait_orphan(cell, state["pid"])
            if (run / "summary.json").is_file():
                state.update(status="done", error=None)
            elif state.get("status") not in ("failed",) or self.retry_failed:
                was = state.get("status")
                state["status"] = "interrupted" if was in ("running", "interrupted") else "pending"
            self.states[cell.id] = state

    def _wait_orphan(self, cell: Cell, pid: int) -> None:
        """A cell process outlived a killed runner: let it checkpoint and exit before we resume the cell."""
        run = self.dir / "cells" / cell.id
        self._say(f"[sweep] cell {cell.id}: waiting for its old process {pid} to stop")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + _ORPHAN_WAIT_S
        while _alive_cell_process(pid, run) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if _alive_cell_process(pid, run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_S)

    def _compile_choices(self) -> dict[str, bool]:
        """train.compile for each cell left at "auto": one choice per graph, its cells weighed together, since
        they share the compile cache (the first ``jobs`` of them compile cold side by side, the rest load)."""
        groups: dict[str, list[Cell]] = {}
        for cell in self.cells:
            if self.configs[cell.id].train.compile == "auto":
                groups.setdefault(compiling.graph_key(self.configs[cell.id]), []).append(cell)
        env = compile_cache_env()
        choices = {}
        for cells in groups.values():
            configs = [self.configs[c.id] for c in cells]
            pays = compiling.compile_pays(configs, warm=compiling.is_warm(configs[0], env), jobs=self.jobs)
            choices.update((c.id, pays) for c in cells)
        return choices

    # -- processes --

    def _launch(self, cell: Cell, index: int) -> _Running:
        run = self.dir / "cells" / cell.id
        run.mkdir(parents=True, exist_ok=True)
        resume = (run / "config.json").is_file()
        start = launcher_argv(self.sweep.launcher) if self.sweep.launcher else [self.python]
        cmd = [*start, "-m", "smallinit", "train", "--out", str(run)]
        for item in cell.set_args():
            cmd += ["--set", item]
        if resume:
            cmd.append("--resume")  # with the same --set: the trainer refuses a run of another config
        elif cell.id in self.compile:  # a resumed cell keeps the choice its config.json recorded
            cmd += ["--set", f"train.compile={toml_literal(self.compile[cell.id])}"]
        env = dict(os.environ)
        if self.jobs > 1 and not self.configs[cell.id].train.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(compile_cache_env(env))
        log_path = run / "train.log"
        log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed when the process ends
        offset = log.tell()
        state = self.states[cell.id]
        log.write(f"=== attempt {state['attempts'] + 1}{' (resume)' if resume else ''}: {' '.join(cmd[1:])}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        state.update(status="running", pid=proc.pid, attempts=state["attempts"] + 1, error=None,
                     started=time.time())
        self._save_status()
        self._say(f"[{index}/{len(self.cells)}] {cell.id}: {'resumed' if resume else 'started'}")
        return _Running(cell, index, proc, log, log_path, time.monotonic(), offset)

    def _echo_output(self, r: _Running) -> None:
        if self.echo is None:
            return
        try:
            with open(r.log_path, encoding="utf-8", errors="replace") as f:
                f.seek(r.offset)
                text = f.read()
                r.offset = f.tell()
        except OSError:
            return
        *lines, r.partial = (r.partial + text).split("\n")
        for line in lines:
            if line.strip() and not line.startswith("=== attempt"):
                self._say(f"  [{r.index}/{len(self.cells)}] {line.rstrip()}")

    def _finish(self, r: _Running, rc: int) -> None:
        self._echo_output(r)
        r.log.close()
        state = self.states[r.cell.id]
        state["wall_s"] = float(state.get("wall_s") or 0.0) + time.monotonic() - r.started
        if r.cpu_s is not None:
            state["cpu_s"] = float(state.get("cpu_s") or 0.0) + r.cpu_s
        state["returncode"] = rc
        state["finished"] = time.time()
        state.pop("pid", None)
        run = self.dir / "cells" / r.cell.id
        if (run / "summary.json").is_file():  # written last, atomically: the run finished (a signal may follow)
            state.update(status="done", error=None)
        elif rc == _EXIT_PREEMPTED or (rc < 0 and self.stop):
            state.update(status="interrupted", error=error_line(r.log_path))
        else:
            why = error_line(r.log_path) if rc >= 0 else f"killed by {signal.Signals(-rc).name}"
            state.update(status="failed", error=why)
        row = cell_row(self.dir, r.cell, state)
        val = f", val loss {row['val_loss']:.4f}" if isinstance(row["val_loss"], (int, float)) else ""
        err = f": {state['error']}" if state["status"] != "done" else ""
        self._say(f"[{r.index}/{len(self.cells)}] {r.cell.id}: {state['status']} in {time.monotonic() - r.started:.0f} s"
                  f"{val}{err}")
        self._save_status()
        write_results(self.dir, self.rows())

    def rows(self) -> list[dict[str, Any]]:
        return [cell_row(self.dir, c, self.states[c.id]) for c in self.cells]

    # -- the loop --

    def run(self) -> SweepOutcome:
        self.dir.mkdir(parents=True, exist_ok=True)
        with _folder_lock(self.dir):
            self._check_folder()
            write_json_atomic(self.dir / "sweep.json", {**self.sweep.to_dict(), "cells": [c.to_dict() for c in self.cells]})
            self._initial_states()
            self._save_status()
            todo = [(i, c) for i, c in enumerate(self.cells, 1)
                    if self.states[c.id]["status"] in ("pending", "interrupted")]
            skipped = len(self.cells) - len(todo)
            to_run = {c.id for _, c in todo}
            for cell in self.cells:  # finished or failed before: not part of this session's work
                if self.overall is not None and cell.id not in to_run:
                    self.overall.drop(self._key(cell))
            self._say(f"[sweep] {self.sweep.name}: {len(self.cells)} cells, {len(todo)} to run"
                      f"{f' ({skipped} finished or failed before)' if skipped else ''}; {self.jobs} at a time, "
                      f"{self.threads} thread(s) each; folder {self.dir}")
            with _stop_signals(self.stop):
                self._loop(todo)
            rows = self.rows()
            write_results(self.dir, rows)
        return SweepOutcome(self.dir, rows, interrupted=bool(self.stop))

    def _key(self, cell: Cell) -> str:
        return str(self.dir / "cells" / cell.id)

    def _steps_done(self, r: _Running) -> float:
        """The fraction of its steps a running cell has logged."""
        step = max((rec.get("step", 0) for rec in read_metrics(self.dir / "cells" / r.cell.id)), default=0)
        return min(1.0, step / self.configs[r.cell.id].train.steps)

    def _train_s(self, r: _Running) -> float | None:
        """Seconds a finished cell spent in training steps: its tokens at its median logged speed."""
        speed = cell_row(self.dir, r.cell, self.states[r.cell.id])["tokens_per_s"]
        tc = self.configs[r.cell.id].train
        return tc.steps * tc.batch_size * self.configs[r.cell.id].data.seq_len / speed if speed else None

    def _loop(self, todo: list[tuple[int, Cell]]) -> None:
        running: list[_Running] = []
        signalled = False
        progress = Progress("sweep", {self._key(c): cell_work(self.configs[c.id]) for _, c in todo})
        try:
            while todo or running:
                while todo and len(running) < self.jobs and not self.stop:
                    index, cell = todo.pop(0)
                    running.append(self._launch(cell, index))
                if self.stop and not signalled:  # pass the stop on: each cell checkpoints and exits 75
                    signalled = True
                    for r in running:
                        with contextlib.suppress(ProcessLookupError):
                            r.proc.send_signal(signal.SIGTERM)
                    todo.clear()
                time.sleep(_POLL_S)
                for r in list(running):
                    rc = _poll(r)
                    if rc is None:
                        self._echo_output(r)
                        continue
                    running.remove(r)
                    self._finish(r, rc)
                    if self.stop:
                        continue
                    in_flight = {self._key(x.cell): self._steps_done(x) for x in running}
                    for p in (progress, self.overall):
                        if p is not None:
                            p.finish(self._key(r.cell), time.monotonic() - r.started, self._train_s(r))
                            self._say(p.line(in_flight))
        finally:
            for r in running:  # only reached on an unexpected error in the runner itself
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(signal.SIGTERM)
                r.proc.wait()
                self._finish(r, r.proc.returncode)


@contextlib.contextmanager
def _stop_signals(stop: list[str]) -> Iterator[None]:
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        stop.append(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def cell_work(cfg: Config) -> float:
    """A cell's training compute in parameter-tokens (parameters × steps × tokens per step), its weight in an
    ETA: a cell of a larger or longer-trained model counts for what it costs."""
    return float(Transformer.count_params(cfg.model)[0]) * cfg.train.steps * cfg.train.batch_size * cfg.data.seq_len


class Progress:
    """How far a session of cells has come (one sweep, or every sweep of a recipe) and the time it has left.

    ``work`` maps each cell to run (by key) to its ``cell_work``. A cell's time is modelled as a fixed overhead
    (start-up, evaluation, checkpoints) plus its compute at a rate, both measured on the cells that finished:
    with tiny CPU models the overhead dominates, with large ones the compute. The ETA scales the time since
    the session started by the modelled time left over the time done (which also accounts for cells run side by
    side), counting the logged share of the steps of cells still running.
    """

    def __init__(self, label: str, work: dict[str, float], *, after: str = ""):
        self.label, self.after = label, after
        self.left = dict(work)
        self.total, self.finished, self.wall_done = len(work), 0, 0.0
        self.timed: list[tuple[float, float, float]] = []  # (work, wall s, training s) of each finished cell
        self.t0 = time.monotonic()

    def drop(self, key: str) -> None:
        """A cell that will not run in this session after all (it finished or failed before)."""
        if self.left.pop(key, None) is not None:
            self.total -= 1

    def finish(self, key: str, wall_s: float, train_s: float | None) -> None:
        """A cell ended after ``wall_s`` seconds, ``train_s`` of them in training steps (None: unknown)."""
        if key in self.left:
            work = self.left.pop(key)
            self.finished += 1
            self.wall_done += wall_s
            if train_s:
                self.timed.append((work, wall_s, min(train_s, wall_s)))

    def cell_seconds(self, work: float) -> float:
        """Modelled seconds of one cell of this much work (needs a timed cell)."""
        overhead = statistics.fmean(wall - train for _, wall, train in self.timed)
        rate = sum(w for w, _, _ in self.timed) / max(sum(t for _, _, t in self.timed), 1e-9)
        return overhead + work / rate

    def eta(self, in_flight: dict[str, float] | None = None) -> float | None:
        """Seconds left; ``in_flight`` maps running cells to the fraction of their steps done. None until a cell
        has finished with its training time known."""
        if not self.timed:
            return None
        partial = sum(self.cell_seconds(self.left[k]) * f for k, f in (in_flight or {}).items() if k in self.left)
        left = sum(self.cell_seconds(w) for w in self.left.values()) - partial
        return (time.monotonic() - self.t0) * left / max(self.wall_done + partial, 1e-9)

    def line(self, in_flight: dict[str, float] | None = None) -> str:
        eta = self.eta(in_flight)
        return (f"[{self.label}] {self.finished}/{self.total} runs | elapsed {_hms(time.monotonic() - self.t0)} | "
                f"ETA {'?' if eta is None else _hms(eta)}{self.after}")


def run_sweep(
    sweep: Sweep | str | os.PathLike, sweep_dir: str | os.PathLike, *, jobs: int | None = None,
    retry_failed: bool = False, echo: TextIO | None = None, launcher: str | None = None,
    progress: Progress | None = None,
) -> SweepOutcome:
    """Run (or continue) a sweep into ``sweep_dir``; ``echo`` receives progress lines.

    ``launcher`` (from the command line, so any command) replaces the sweep file's [sweep] launcher.
    ``progress`` (a recipe's, over all its sweeps) is told of every cell that ends and printed after the sweep's.
    """
    if not isinstance(sweep, Sweep):
        sweep = Sweep.load(sweep)
    if launcher is not None:
        launcher_argv(launcher)
        sweep = dataclasses.replace(sweep, launcher=launcher)
    return SweepRunner(sweep, sweep_dir, jobs=jobs, retry_failed=retry_failed, echo=echo, progress=progress).run()
