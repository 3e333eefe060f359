"""What a sweep submits to SLURM: its options and the batch script of its job array.

A sweep file's ``[slurm]`` table (or the command line's flags, which win) sets::

    [slurm]
    partition = "gpu"
    account = "my-project"
    time = "24:00:00"               # each job's limit; a cell that needs longer is requeued from its checkpoint
    nodes = 1                       # per cell; one torchrun per node
    gpus_per_node = 8               # 0: a CPU cell, one process
    cpus_per_task = 64
    max_running = 8                 # the array's throttle, --array=...%8 (0: SLURM decides)
    signal_s = 300                  # the stop request this long before the limit: checkpoint, then requeue
    extra = ["--qos=high", "--constraint=h100"]   # more #SBATCH lines

The script (one per sweep folder, ``slurm/cells.sbatch``) is ``examples/slurm.sbatch`` made for a job array:
array task i runs cell i into ``cells/<cell-id>`` (``--resume`` once the cell has a config.json), under
``srun`` (one torchrun per node where the cell has GPUs), output appended to the cell's train.log. SLURM
sends USR1 ``signal_s`` before the time limit: the script sends the cell's processes SIGTERM (every rank
finishes its step, checkpoints and exits 75) and requeues the task, which resumes from that checkpoint. A ``scancel``, an
``scontrol requeue`` or a preemption sends SIGTERM: the cell checkpoints the same way and SLURM requeues it
or not. Each attempt appends ``{"job", "restart", "start", "end", "rc"}`` to the cell's ``slurm.jsonl``, from
which smallinit tells a cell that failed (its error line) from one that was stopped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from smallinit.errors import ExperimentError

SCRIPT = "slurm/cells.sbatch"
ATTEMPTS_FILE = "slurm.jsonl"  # in each cell's folder: one line per attempt the batch script saw end
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+")
_EXTRA = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(=[^\s'\"\\$`;|&<>]*)?")
# set by the options above or by smallinit itself: an extra line must not change what the array runs
_OWN = ("array", "job-name", "output", "error", "open-mode", "requeue", "no-requeue", "signal", "wrap")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str = ""
    account: str = ""
    time: str = "24:00:00"
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    max_running: int = 0
    signal_s: int = 300
    extra: tuple[str, ...] = field(default=())

    @staticmethod
    def from_dict(raw: dict[str, Any], where: str = "[slurm]") -> SlurmOptions:
        """Options from a sweep file's [slurm] table or the flags (None: not given), checked."""
        known = {f.name: f for f in fields(SlurmOptions)}
        bad = sorted(set(raw) - set(known))
        if bad:
            raise ExperimentError(f"{where}: unknown key {bad[0]}; it takes {', '.join(known)}")
        given = {k: v for k, v in raw.items() if v is not None}
        for key in ("nodes", "gpus_per_node", "cpus_per_task", "max_running", "signal_s"):
            if key in given and (not isinstance(given[key], int) or isinstance(given[key], bool)):
                raise ExperimentError(f"{where}: {key} must be a whole number, not {given[key]!r}")
        if "extra" in given:
            if isinstance(given["extra"], str) or not all(isinstance(x, str) for x in given["extra"]):
                raise ExperimentError(f'{where}: extra must be a list of options, e.g. ["--qos=high"]')
            given["extra"] = tuple(given["extra"])
        opts = SlurmOptions(**given)
        opts.check(where)
        return opts

    def merged(self, flags: dict[str, Any]) -> SlurmOptions:
        """These options with the command line's (None: not given; extra lines add to the file's)."""
        given = {k: v for k, v in flags.items() if v not in (None, [], ())}
        if "extra" in given:
            given["extra"] = (*self.extra, *given["extra"])
        return SlurmOptions.from_dict({**self.to_dict(), **given}, "--scheduler slurm")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def check(self, where: str) -> None:
        if self.nodes < 1 or self.cpus_per_task < 1 or self.gpus_per_node < 0 or self.max_running < 0:
            raise ExperimentError(
                f"{where}: nodes and cpus_per_task must be ≥ 1, gpus_per_node and max_running ≥ 0"
            )
        if self.signal_s < 10:
            raise ExperimentError(
                f"{where}: signal_s {self.signal_s} leaves no time for a checkpoint; use ≥ 10"
            )
        if not _TIME.fullmatch(self.time):
            raise ExperimentError(
                f"{where}: time {self.time!r} is not a SLURM time limit such as 24:00:00, 90 or 2-00:00:00"
            )
        if self.limit_s <= self.signal_s:
            raise ExperimentError(f"{where}: time {self.time} must be longer than signal_s {self.signal_s} s")
        for name in ("partition", "account"):
            if not re.fullmatch(r"[A-Za-z0-9_.,-]*", getattr(self, name)):
                raise ExperimentError(f"{where}: {name} {getattr(self, name)!r} is not a SLURM name")
        for line in self.extra:
            if not _EXTRA.fullmatch(line):
                raise ExperimentError(
                    f"{where}: extra line {line!r} is not one --option or --option=value without quotes"
                )
            if line[2:].split("=")[0] in _OWN:
                raise ExperimentError(f"{where}: extra line {line!r} sets what smallinit sets itself")

    @property
    def limit_s(self) -> int:
        """The time limit in seconds (SLURM's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S)."""
        days, _, rest = self.time.rpartition("-")
        parts = [int(p) for p in rest.split(":")]
        if days:
            parts += [0] * (3 - len(parts))
            h, m, s = parts
        else:
            h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
        return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def job_name(sweep_dir: Path) -> str:
    """The array's job name: squeue finds a folder's jobs by it, also those a crashed submission never recorded."""
    import hashlib

    folder = sweep_dir.resolve()
    return f"smallinit-{folder.name[:40]}-{hashlib.sha1(str(folder).encode()).hexdigest()[:8]}"


def array_spec(indices: list[int], max_running: int) -> str:
    """--array's value: runs of indices as ranges, then the throttle (0,2-4%2)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    spec = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return spec + (f"%{max_running}" if max_running else "")


def batch_script(
    sweep_dir: Path,
    cells: list[tuple[str, list[str], list[str]]],
    opts: SlurmOptions,
    *,
    python: str,
    launcher: list[str] | None,
    env: dict[str, str],
) -> str:
    """The job array's script: task i runs ``cells[i]``: (cell id, its ``smallinit train`` arguments, those
    added only to its first attempt)."""
    q = shlex.quote
    root = sweep_dir.resolve()
    head = [
        "#!/bin/bash",
        f"# smallinit: the cells of sweep folder {root} as a SLURM job array; written by smallinit sweep",
        f"#SBATCH --nodes={opts.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={opts.cpus_per_task}",
        f"#SBATCH --time={opts.time}",
        f"#SBATCH --signal=B:USR1@{opts.signal_s}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={root}/slurm/%A_%a.out",
    ]
    head += [f"#SBATCH --gpus-per-node={opts.gpus_per_node}"] if opts.gpus_per_node else []
    head += [f"#SBATCH --partition={opts.partition}"] if opts.partition else []
    head += [f"#SBATCH --account={opts.account}"] if opts.account else []
    head += [f"#SBATCH {line}" for line in opts.extra]
    if opts.gpus_per_node or opts.nodes > 1:  # one torchrun per node, meeting on the first node
        start = [python, "-m", "torch.distributed.run", "--nnodes", "$SLURM_NNODES"]
        start += ["--nproc-per-node", str(opts.gpus_per_node or 1), "--rdzv-backend", "c10d"]
        start += [
            "--rdzv-endpoint",
            '"$head_node:$port"',
            "--rdzv-id",
            "$SLURM_JOB_ID",
            "--max-restarts",
            "0",
        ]
    else:
        start = [q(w) for w in launcher] if launcher else [q(python)]
    case = [
        f"    {i}) cell={q(cid)}; args=({' '.join(map(q, args))}); first=({' '.join(map(q, first))}) ;;"
        for i, (cid, args, first) in enumerate(cells)
    ]
    exports = [f"export {k}={q(v)}" for k, v in sorted(env.items())]
    body = f"""
set -u
case "$SLURM_ARRAY_TASK_ID" in
{chr(10).join(case)}
    *) echo "smallinit: no cell for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;
esac
{chr(10).join(exports)}
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}}
run={q(str(root))}/cells/$cell
mkdir -p "$run"
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((20000 + SLURM_JOB_ID % 20000))
job=${{SLURM_ARRAY_JOB_ID}}_$SLURM_ARRAY_TASK_ID
if [[ -f $run/config.json ]]; then args=(--resume "${{args[@]}}"); else args+=(${{first[@]+"${{first[@]}}"}}); fi
start=$(date +%s.%N)
echo "=== attempt: job $job, restart ${{SLURM_RESTART_COUNT:-0}}: smallinit train ${{args[*]}}" >>"$run/train.log"

# USR1 comes signal_s before the time limit: SIGTERM to the cell's processes (not to srun, which would kill
# them), so they checkpoint and exit 75; then requeue the task. TERM (scancel, scontrol requeue, preemption)
# reaches the cell's processes from SLURM itself: wait for them to checkpoint, and record how they ended.
# "$job", ARRAY_TASK: a task's own SLURM_JOB_ID may name the whole array. slurmctld may answer "try again later"
# while the array's other tasks change state.
stop_cell() {{ for _ in $(seq 30); do scancel --signal=TERM "$job" && return; sleep 1; done; }}
requeue=0
trap 'requeue=1; stop_cell' USR1
trap ':' TERM
srun --kill-on-bad-exit=1 {" ".join(start)} -m smallinit train --out "$run" "${{args[@]}}" >>"$run/train.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done  # a trap interrupts wait (128 + its signal): again
wait "$pid"
rc=$?  # srun's own code, which bash kept
printf '{{"job": "%s", "restart": %s, "start": %s, "end": %s, "rc": %s}}\\n' \\
    "$job" "${{SLURM_RESTART_COUNT:-0}}" "$start" "$(date +%s.%N)" "$rc" >>"$run/{ATTEMPTS_FILE}"
if [[ $requeue == 1 && $rc == 75 && ! -f $run/summary.json ]]; then
    scontrol requeue "$job"
fi
exit "$rc"
"""
    return "\n".join(head) + "\n" + body
