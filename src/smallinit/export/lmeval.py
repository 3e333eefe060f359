"""lm-evaluation-harness on a smallinit checkpoint, through the Hugging Face export.

The checkpoint is exported once to ``RUN/eval/hf-step_NNNNNNN-<sha>`` (reused while the checkpoint's
weights are unchanged), then evaluated with lm-eval's own ``hf`` model (fp32, ``pretrained`` = that folder),
so what is scored is exactly the folder a user would publish. Results are written, never overwritten, to
``RUN/eval/results-step_NNNNNNN-<time>.json``: lm-eval's result dict plus a ``smallinit`` section naming the
checkpoint, the export and its architecture.

Tasks such as hellaswag, triviaqa, gsm8k or minerva_math500 download their data from the Hugging Face hub;
offline, pass local YAML tasks with ``include_path`` (tests/lmeval_tasks holds two).
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smallinit.errors import ConfigError, DataError
from smallinit.export.hf import REMOTE_CLASS, REMOTE_DIR, REMOTE_FILES, ExportError, export_hf
from smallinit.io import write_json_atomic
from smallinit.train.checkpoint import CKPT_DIR, model_digest, resolve_checkpoint


@dataclass
class EvalResult:
    results_file: Path
    export_dir: Path
    metrics: dict[str, dict[str, float]]  # task → metric → value (lm-eval's "metric,filter" keys)
    table: str  # lm-eval's markdown table
    raw: dict[str, Any]  # everything lm-eval returned, as written to results_file


def _require_lm_eval():
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ExportError("lm-evaluation-harness is not installed; pip install 'smallinit[eval]'") from None
    if importlib.util.find_spec("accelerate") is None:  # lm-eval's hf model imports it
        raise ExportError("lm-eval's hf model needs the accelerate package; pip install 'smallinit[eval]'")
    return lm_eval, TaskManager


def run_dir_of(checkpoint_path: Path) -> Path:
    """The run folder that holds a checkpoint folder (RUN/checkpoints/step_N → RUN)."""
    return checkpoint_path.parent.parent if checkpoint_path.parent.name == CKPT_DIR else checkpoint_path


def _reusable_export(export_dir: Path) -> str:
    """The architecture of an earlier export, if it holds only what export_hf writes.

    A run folder may come from anywhere, and the harness imports an export's Python files when the
    architecture is ours (trust_remote_code): so they must be smallinit's own, byte for byte, and no
    auto_map may point at code elsewhere (``repo--module.Class`` would fetch it from the Hub).
    """
    refuse = ExportError(
        f"{export_dir} holds code smallinit did not write; delete that folder and run again "
        "to export the checkpoint afresh"
    )
    try:
        configs = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in export_dir.glob("*.json")}
        architecture = configs["config.json"]["architectures"][0]
    except (OSError, ValueError, RecursionError, KeyError, IndexError, TypeError):
        raise refuse from None
    ours = {f: (REMOTE_DIR / f).read_bytes() for f in REMOTE_FILES} if architecture == REMOTE_CLASS else {}
    if {p.name: p.read_bytes() for p in export_dir.glob("*.py")} != ours or not isinstance(architecture, str):
        raise refuse
    for cfg in configs.values():
        auto_map = cfg.get("auto_map", {}) if isinstance(cfg, dict) else {}
        if not isinstance(auto_map, dict) or "--" in json.dumps(auto_map) or (auto_map and not ours):
            raise refuse
    return architecture


def run_eval(
    checkpoint: str | Path,
    tasks: list[str],
    *,
    limit: int | float | None = None,
    include_path: str | Path | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    log_samples: bool = False,
    seed: int = 0,
) -> EvalResult:
    """Export ``checkpoint`` (a run or checkpoint folder) and evaluate it on ``tasks`` with lm-eval."""
    lm_eval, TaskManager = _require_lm_eval()
    from lm_eval.utils import handle_non_serializable, make_table

    tasks = [t.strip() for t in tasks if t.strip()]
    if not tasks:
        raise ConfigError("no tasks given; pass --tasks hellaswag,triviaqa,... (names known to lm-eval)")
    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(
            f"--include-path {include_path} is not a folder; pass the folder holding your task YAMLs"
        )
    found = resolve_checkpoint(checkpoint)
    manager = None
    if include_path is not None:  # indexing lm-eval's own ~15k tasks takes half a minute: skip it if we can
        manager = TaskManager(include_path=str(include_path), include_defaults=False)
        if not all(t in manager.all_tasks for t in tasks):
            manager = None
    manager = manager or TaskManager(include_path=str(include_path) if include_path is not None else None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"unknown lm-eval task {unknown[0]!r}; check the name (lm-eval ls tasks) or --include-path"
        )

    eval_dir = run_dir_of(found.path) / "eval"
    sha = model_digest(found)[:12]
    export_dir = eval_dir / f"hf-step_{found.step:07d}-{sha}"
    if (export_dir / "config.json").is_file():  # exports are written whole or not at all
        architecture = _reusable_export(export_dir)
    else:
        architecture = export_hf(found.path, export_dir).architecture

    model_args = {
        "pretrained": str(export_dir),
        "dtype": "float32",
        "trust_remote_code": architecture == REMOTE_CLASS,
    }
    try:
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=tasks,
            num_fewshot=num_fewshot,
            batch_size=batch_size,
            device=device,
            limit=limit,
            task_manager=manager,
            log_samples=log_samples,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    except ConnectionError as e:  # datasets, offline or without network
        raise DataError(
            f"task data could not be downloaded ({str(e).splitlines()[0]}); go online or "
            "use local tasks with --include-path"
        ) from None
    except FileNotFoundError as e:  # a task's local data_files (relative to the working directory)
        raise DataError(
            f"task data not found ({str(e).splitlines()[0]}); task YAMLs name data_files "
            f"relative to the working directory {Path.cwd()}"
        ) from None
    out["smallinit"] = {
        "checkpoint": str(found.path),
        "step": found.step,
        "export": str(export_dir),
        "architecture": architecture,
        "tasks": tasks,
        "limit": limit,
    }
    raw = json.loads(json.dumps(out, default=handle_non_serializable))
    results_file = eval_dir / f"results-step_{found.step:07d}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    n = 1
    while results_file.exists():  # two evaluations in the same second: keep both
        results_file = results_file.with_name(f"{results_file.stem.split('.')[0]}.{n}.json")
        n += 1
    write_json_atomic(results_file, raw)
    metrics = {
        task: {k: v for k, v in vals.items() if isinstance(v, (int, float)) and not k.startswith("alias")}
        for task, vals in raw["results"].items()
    }
    return EvalResult(results_file, export_dir, metrics, make_table(out), raw)
