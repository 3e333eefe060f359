"""Checkpoints: safetensors for tensors, JSON for the rest, written atomically, verified on load.

Layout of a run folder::

    RUN/config.json                      the resolved config
    RUN/metrics.jsonl                    one JSON record per logged step / evaluation
    RUN/checkpoints/step_0000100/        model.safetensors, optim.safetensors, state.json

A checkpoint folder is written under a temporary name and renamed when complete, and state.json (written
last) records the size and sha256 of each tensor file, so a torn or altered checkpoint is detected and
refused. Optimizer state is keyed by parameter name, so it does not depend on the parallel layout.
Nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import CheckpointError

FORMAT = "smallinit-checkpoint-1"
CKPT_DIR = "checkpoints"
TENSOR_FILES = ("model.safetensors", "optim.safetensors")


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CKPT_DIR / f"step_{step:07d}"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: Path, step: int, model_tensors: dict[str, torch.Tensor], optim_tensors: dict[str, torch.Tensor],
    state: dict[str, Any], *, keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically, then prune to the newest ``keep`` complete ones."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files = {}
        for fname, tensors in zip(TENSOR_FILES, (model_tensors, optim_tensors)):
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp / fname)
            files[fname] = {"bytes": (tmp / fname).stat().st_size, "sha256": sha256(tmp / fname)}
        write_json_atomic(tmp / "state.json", {**state, "format": FORMAT, "step": step, "files": files})
        for fname in TENSOR_FILES:
            with open(tmp / fname, "rb") as f:
                os.fsync(f.fileno())
        if final.exists():  # a stale copy of the same step (e.g. re-running after a crash): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Completed checkpoint folders (named and renamed), oldest first; temp folders are ignored."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def read_checkpoint(path: Path, *, verify: bool = True) -> Checkpoint:
    """Read and verify a checkpoint folder's state.json (sizes and checksums of its tensor files)."""
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no state.json); pick another or retrain")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{state_file} is not valid JSON; the checkpoint is damaged") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("files"), dict):
        raise CheckpointError(f"{state_file} is not a smallinit checkpoint state ({FORMAT})")
    for fname in TENSOR_FILES:
        meta = state["files"].get(fname)
        f = path / fname
        if not isinstance(meta, dict) or not f.is_file():
            raise CheckpointError(f"checkpoint {path} lacks {fname}; it is incomplete")
        if f.stat().st_size != meta.get("bytes"):
            raise CheckpointError(f"{f} has {f.stat().st_size} bytes, expected {meta.get('bytes')}: it is truncated")
        if verify and sha256(f) != meta.get("sha256"):
            raise CheckpointError(f"{f} does not match its checksum: it was altered or damaged")
    return Checkpoint(path=path, step=int(state["step"]), state=state)


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies; damaged newer ones are skipped (they are never deleted)."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return read_checkpoint(path)
        except CheckpointError:
            continue
    return None


def split_aliases(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that share storage with an earlier one (tied weights); return them as aliases."""
    unique, aliases, by_ptr = {}, {}, {}
    for k, v in tensors.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape)) if v.numel() else None
        if key is not None and key in by_ptr:
            aliases[k] = by_ptr[key]
        else:
            unique[k] = v
            if key is not None:
                by_ptr[key] = k
    return unique, aliases


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """AdamW state keyed by parameter name: ``{name}.exp_avg``, ``{name}.exp_avg_sq``, ``{name}.step``."""
    out = {}
    for p, st in optimizer.state.items():
        for k, v in st.items():
            out[f"{names[id(p)]}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], names: dict[int, str]
) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            keys = [k for k in ("exp_avg", "exp_avg_sq", "step") if f"{name}.{k}" in tensors]
            if not keys:
                continue
            st = {}
            for k in keys:
                t = tensors[f"{name}.{k}"]
                if k != "step" and t.shape != p.shape:
                    raise CheckpointError(f"optimizer state {name}.{k} has shape {tuple(t.shape)}, "
                                          f"the model has {tuple(p.shape)}: the checkpoint is from another model")
                st[k] = t.to(p.device) if k != "step" else t
            optimizer.state[p] = st


def load_model_tensors(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: Path, aliases: dict[str, str] | None = None
) -> None:
    """Copy tensors into ``model``, refusing missing, unexpected or misshapen ones."""
    own = model.state_dict()
    for alias, target in (aliases or {}).items():
        if target in tensors:
            tensors[alias] = tensors[target]
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise CheckpointError(f"{source} does not match the model ({what}); check the config or the file")
    for k, v in own.items():
        if tensors[k].shape != v.shape:
            raise CheckpointError(
                f"{source}: {k} has shape {tuple(tensors[k].shape)}, the model expects {tuple(v.shape)}"
            )
    model.load_state_dict(tensors)


def resolve_checkpoint(path: str | Path) -> Checkpoint:
    """A checkpoint folder, or a run folder (its newest complete checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a run folder or a checkpoint folder")
    if (path / "state.json").is_file():
        return read_checkpoint(path)
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"{path} holds no complete checkpoint; pass a run folder that finished a checkpoint")
    return found


def load_model(path: str | Path, *, device: str | torch.device = "cpu"):
    """The model (eval mode) from a run folder or a checkpoint folder."""
    from ..config import Config
    from ..model import Transformer

    found = resolve_checkpoint(path)
    cfg = Config.from_dict(found.state["config"])
    model = Transformer(cfg.model, init=False)
    tensors = load_tensors(found.path / "model.safetensors")
    load_model_tensors(model, tensors, found.path, found.state.get("aliases"))
    return model.to(device).eval()
