"""Checkpoints: safetensors for tensors, JSON for the rest, written atomically, verified on load.

Layout of a run folder::

    RUN/config.json                      the resolved config
    RUN/metrics.jsonl                    one JSON record per logged step / evaluation
    RUN/checkpoints/step_0000100/        model.safetensors, optim.safetensors, state.json (one process)
    RUN/checkpoints/step_0000100/        shards/*.safetensors, state.json (a distributed run, train/sharded.py)

A checkpoint folder is written under a temporary name and renamed when complete, and state.json (written
last) records the size and sha256 of each tensor file, so a torn or altered checkpoint is detected and
refused. Tensors are keyed by parameter name (optimizer state as ``{name}.exp_avg``, ...), whole in one
process's files, in pieces with their offsets in a distributed run's shards, so a checkpoint does not
depend on the parallel layout: every reader here reads both. Nothing is ever unpickled.

A crash (even SIGKILL) leaves at most a temporary folder, which is ignored and removed by the next save;
a named checkpoint is always complete. So a damaged *newest* checkpoint means the disk or a person changed
it: resuming and loading refuse it (``newest_checkpoint``) rather than silently falling back to an older
one and losing the steps in between; the message names the older intact checkpoint and how to use it.
A write that fails (disk full, read-only folder) raises StorageError and leaves the previous checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from smallinit import io
from smallinit.config import Config
from smallinit.errors import CheckpointError
from smallinit.model import Transformer

FORMAT = "smallinit-checkpoint-1"
SHARDED = "smallinit-checkpoint-sharded-1"  # the layout of a distributed run's checkpoint
CKPT_DIR = "checkpoints"
TENSOR_FILES = ("model.safetensors", "optim.safetensors")
SHARDS = "shards"
ADAM_STATE = ("exp_avg", "exp_avg_sq", "step")
MUON_STATE = ("momentum_buffer",)  # torch.optim.Muon's, under train.optimizer = "muon"


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]

    @property
    def sharded(self) -> bool:
        return self.state["format"] == SHARDED

    @property
    def tensor_folder(self) -> Path:
        """The folder of the checkpoint's safetensors files (a distributed run's shards are in their own)."""
        return self.path / SHARDS if self.sharded else self.path


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CKPT_DIR / f"step_{step:07d}"


def kept(run_dir: Path) -> io.Kept:
    """For a failed write in ``run_dir``: the error line names the last intact checkpoint."""

    def note() -> str:
        done = list_checkpoints(run_dir)
        return f"the last checkpoint {done[-1]} is intact" if done else "no checkpoint was written yet"

    return note


def save_checkpoint(
    run_dir: Path,
    step: int,
    model_tensors: dict[str, torch.Tensor],
    optim_tensors: dict[str, torch.Tensor],
    state: dict[str, Any],
    *,
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically, then prune to the newest ``keep`` complete ones."""
    final = checkpoint_dir(run_dir, step)
    with io.publishing(final, kept=kept(run_dir)) as tmp:  # a stale copy of the same step is replaced
        files = {}
        for fname, tensors in zip(TENSOR_FILES, (model_tensors, optim_tensors)):
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp / fname)
            files[fname] = file_record(tmp / fname)
        write_state(tmp, state, FORMAT, step, files, run_dir)
        for fname in TENSOR_FILES:
            with open(tmp / fname, "rb") as f:
                os.fsync(f.fileno())
    prune(run_dir, keep)
    return final


def file_record(path: Path) -> dict[str, Any]:
    """What state.json keeps of a tensor file, to verify it on load."""
    return {"bytes": path.stat().st_size, "sha256": io.sha256_file(path)}


def write_state(
    folder: Path, state: dict[str, Any], fmt: str, step: int, files: dict[str, Any], run_dir: Path
) -> None:
    """state.json, written last into the checkpoint's temporary folder."""
    record = {**state, "format": fmt, "step": step, "files": files}
    io.write_json_atomic(folder / "state.json", record, kept=kept(run_dir))


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; remove the temporary folders of crashed writers."""
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for debris in (Path(run_dir) / CKPT_DIR).glob(".step_*.tmp*"):  # one writer per run folder
        shutil.rmtree(debris, ignore_errors=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Completed checkpoint folders (named and renamed), oldest first; temp folders are ignored."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def read_checkpoint(path: Path, *, verify: bool = True) -> Checkpoint:
    """Read and verify a checkpoint folder's state.json (sizes and, if ``verify``, checksums of its tensor
    files: a distributed run verifies them on all ranks at once, ``verify_file``)."""
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no state.json); pick another or retrain")
    state = io.read_json(state_file)
    if state is None:
        raise CheckpointError(f"{state_file} is not valid JSON; the checkpoint is damaged")
    if (
        not isinstance(state, dict)
        or state.get("format") not in (FORMAT, SHARDED)
        or not isinstance(state.get("files"), dict)
    ):
        raise CheckpointError(f"{state_file} is not a smallinit checkpoint state ({FORMAT})")
    _check_state(state, path)
    found = Checkpoint(path=path, step=state["step"], state=state)
    for fname in _tensor_files(found):
        meta, f = state["files"].get(fname), path / fname
        if not isinstance(meta, dict) or not f.is_file():
            raise CheckpointError(f"checkpoint {path} lacks {fname}; it is incomplete")
        if f.stat().st_size != meta.get("bytes"):
            raise CheckpointError(
                f"{f} has {f.stat().st_size} bytes, expected {meta.get('bytes')}: it is truncated"
            )
        if verify:
            verify_file(found, fname)
    return found


def _tensor_files(found: Checkpoint) -> list[str]:
    """The tensor files a checkpoint must hold: its two files, or every shard state.json lists and no other
    (DCP's reader reads every safetensors file in the shard folder)."""
    if not found.sharded:
        return list(TENSOR_FILES)
    listed = sorted(found.state["files"])
    if not listed or any(Path(f).parent != Path(SHARDS) or not f.endswith(".safetensors") for f in listed):
        raise CheckpointError(
            f"{found.path / 'state.json'} lists files outside {SHARDS}/; the checkpoint is damaged"
        )
    on_disk = sorted(f"{SHARDS}/{p.name}" for p in found.tensor_folder.glob("*.safetensors"))
    extra = sorted(set(on_disk) - set(listed))
    if extra:
        raise CheckpointError(
            f"checkpoint {found.path} holds {extra[0]}, which its state.json does not list: remove it"
        )
    return listed


def verify_file(found: Checkpoint, fname: str) -> None:
    """The file's sha256 is the one state.json records."""
    if io.sha256_file(found.path / fname) != found.state["files"][fname].get("sha256"):
        raise CheckpointError(f"{found.path / fname} does not match its checksum: it was altered or damaged")


def _check_state(state: dict[str, Any], path: Path) -> None:
    """The fields the loaders use have the types they expect (state.json is not covered by the checksums)."""

    def bad(what: str) -> CheckpointError:
        return CheckpointError(
            f"{path / 'state.json'}: {what}; the checkpoint is damaged or not from smallinit"
        )

    step = state.get("step")
    if type(step) is not int or step < 0:
        raise bad(f"step {step!r} is not a step number")
    if path.name.startswith("step_") and path.name[5:].isdigit() and int(path.name[5:]) != step:
        raise bad(f"it records step {step} but the folder is {path.name} (copied from another checkpoint?)")
    if not isinstance(state.get("config"), dict):
        raise bad("it has no config table")
    aliases = state.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise bad("its aliases are not a table of tensor names")
    skipped = state.get("skipped", 0)
    if type(skipped) is not int or skipped < 0:
        raise bad(f"skipped {skipped!r} is not a count")


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies; damaged newer ones are skipped (they are never deleted)."""
    return _first_intact(reversed(list_checkpoints(run_dir)))


def _first_intact(paths) -> Checkpoint | None:
    for path in paths:
        try:
            return read_checkpoint(path)
        except CheckpointError:
            continue
    return None


def newest_checkpoint(run_dir: Path, *, verify: bool = True) -> Checkpoint | None:
    """The newest checkpoint, verified; None if there is none. What resume and load_model use.

    A damaged newest checkpoint is refused, never skipped in silence (that would drop the steps since the
    older one): the error names the newest intact checkpoint and how to continue from it (``refused``).
    """
    done = list_checkpoints(run_dir)
    if not done:
        return None
    try:
        return read_checkpoint(done[-1], verify=verify)
    except CheckpointError as e:
        raise refused(done[-1], e) from None


def refused(path: Path, e: CheckpointError) -> CheckpointError:
    """The error for a damaged newest checkpoint ``path``, naming the newest intact one before it."""
    older = _first_intact(p for p in reversed(list_checkpoints(path.parent.parent)) if p.name < path.name)
    fallback = (
        f"to continue from {older.path.name}, the newest intact one, move {path.name} out of {path.parent}"
        if older
        else "no older intact checkpoint exists"
    )
    return CheckpointError(f"{e}; {fallback}")


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


def optimizer_tensors(optimizer, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """Optimizer state keyed by parameter name: AdamW's ``{name}.exp_avg``, ``{name}.exp_avg_sq``,
    ``{name}.step``, Muon's ``{name}.momentum_buffer``."""
    out = {}
    for p, st in optimizer.state.items():
        for k, v in st.items():
            out[f"{names[id(p)]}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def held_state(optimizer, names: dict[int, str]) -> dict[str, tuple[str, ...]]:
    """The state each parameter's optimizer keeps, by parameter name (an AdamW, or MuonAdamW's two)."""
    parts = (optimizer,) if isinstance(optimizer, torch.optim.Optimizer) else tuple(optimizer)
    return {
        names[id(p)]: MUON_STATE if isinstance(opt, torch.optim.Muon) else ADAM_STATE
        for opt in parts
        for g in opt.param_groups
        for p in g["params"]
    }


Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]  # tensor name → (global shape, dtype)


def tensor_spec(tensors: dict[str, torch.Tensor]) -> Spec:
    return {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}  # DTensor shapes are global


def check_model_tensors(tensors: dict[str, torch.Tensor], spec: Spec, source: Path | str) -> None:
    """Refuse missing, unexpected, misshapen or mistyped tensors: a checksum only says the file is whole."""
    missing, unexpected = sorted(set(spec) - set(tensors)), sorted(set(tensors) - set(spec))
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise CheckpointError(f"{source} does not match the model ({what}); check the config or the file")
    for k, (shape, dtype) in spec.items():
        _check_tensor(f"{source}: {k}", tensors[k], shape, dtype, "the model expects")


def check_optimizer_tensors(
    tensors: dict[str, torch.Tensor], params: Spec, held: dict[str, tuple[str, ...]] | None = None
) -> dict[str, dict[str, torch.Tensor]]:
    """Optimizer state grouped by parameter name; a parameter has all of its state or none (an expert that
    never got a gradient): ``held`` names the state its optimizer keeps (AdamW's, unless it says Muon's),
    with its parameter's shape and dtype and, for AdamW, a single fp32 step count."""
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        name, _, k = key.rpartition(".")
        if name not in params or k not in (held or {}).get(name, ADAM_STATE):
            raise CheckpointError(
                f"optimizer state {key} matches no parameter: the checkpoint is from another model"
                + (" or another train.optimizer" if name in params and k in ADAM_STATE + MUON_STATE else "")
            )
        state.setdefault(name, {})[k] = t
    for name, st in state.items():
        keys = (held or {}).get(name, ADAM_STATE)
        missing = [k for k in keys if k not in st]
        if missing:
            raise CheckpointError(
                f"optimizer state {name}.{missing[0]} is missing: the checkpoint is incomplete"
            )
        shape, dtype = params[name]
        if "step" in keys:
            _check_tensor(f"optimizer state {name}.step", st["step"], (), torch.float32, "AdamW keeps")
        for k in keys:
            if k != "step":
                _check_tensor(f"optimizer state {name}.{k}", st[k], shape, dtype, "the model has")
    return state


def _check_tensor(
    what: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, expects: str
) -> None:
    if tuple(t.shape) != shape:
        raise CheckpointError(
            f"{what} has shape {tuple(t.shape)}, {expects} {shape}: the checkpoint is from "
            "another model or damaged"
        )
    if t.dtype != dtype:
        raise CheckpointError(
            f"{what} is {str(t.dtype)[6:]}, {expects} {str(dtype)[6:]}: the checkpoint was "
            "altered or is from another program"
        )


def load_optimizer_tensors(optimizer, tensors: dict[str, torch.Tensor], names: dict[int, str]) -> None:
    """Restore optimizer state (see check_optimizer_tensors) through PyTorch's own ``load_state_dict``, which
    places each tensor as the optimizer needs it (the fused and capturable kernels read ``step`` on the
    parameter's device)."""
    parts = (optimizer,) if isinstance(optimizer, torch.optim.Optimizer) else tuple(optimizer)
    params = [p for opt in parts for g in opt.param_groups for p in g["params"]]
    spec = {names[id(p)]: (tuple(p.shape), p.dtype) for p in params}
    state = check_optimizer_tensors(tensors, spec, held_state(optimizer, names))
    for opt in parts:
        mine = [p for g in opt.param_groups for p in g["params"]]
        saved = opt.state_dict()  # the param groups, with parameters numbered in this order
        saved["state"] = {i: state[names[id(p)]] for i, p in enumerate(mine) if names[id(p)] in state}
        opt.load_state_dict(saved)


def read_tensors(
    found: Checkpoint, *, optimizer: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A checkpoint's whole tensors in this process, keyed as in its files: the model's (tied weights once)
    and, if ``optimizer``, AdamW's. A distributed run's shards are joined by DCP's reader."""
    if not found.sharded:
        model = load_tensors(found.path / "model.safetensors")
        return model, load_tensors(found.path / "optim.safetensors") if optimizer else {}
    from torch.distributed.checkpoint import HuggingFaceStorageReader, load

    reader = HuggingFaceStorageReader(str(found.tensor_folder))
    spec = stored_spec(reader)
    parts = model, optim = {}, {}
    for k, v in spec.items():
        if optimizer or not is_optimizer_key(k, spec):
            parts[is_optimizer_key(k, spec)][k] = torch.empty(v.size, dtype=v.properties.dtype)
    with warnings.catch_warnings():  # DCP warns that it reads in one process, which is what we ask
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        load({**model, **optim}, storage_reader=reader, no_dist=True)
    return model, optim


def stored_spec(reader) -> dict[str, Any]:
    """Each tensor's global shape and dtype, from the safetensors headers a DCP reader reads (JSON)."""
    try:
        return reader.read_metadata().state_dict_metadata
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{reader.path} holds an unreadable safetensors file ({e})") from None


def is_optimizer_key(key: str, keys) -> bool:
    """Whether ``key`` names optimizer state (``{name}.exp_avg``, ...) of a parameter among ``keys``."""
    name, _, k = key.rpartition(".")
    return k in ADAM_STATE + MUON_STATE and name in keys


def model_digest(found: Checkpoint) -> str:
    """A sha256 that names the checkpoint's weights (of model.safetensors, or of the shards' checksums)."""
    if not found.sharded:
        return found.state["files"]["model.safetensors"]["sha256"]
    sums = "".join(found.state["files"][f]["sha256"] for f in sorted(found.state["files"]))
    return hashlib.sha256(sums.encode()).hexdigest()


def load_state(model: torch.nn.Module, optimizer, names: dict[int, str], found: Checkpoint) -> None:
    """Model and optimizer state from a checkpoint of any layout, in one process (a distributed run: sharded.py)."""
    tensors, optim = read_tensors(found)
    load_weights(model, found, tensors)
    load_optimizer_tensors(optimizer, optim, names)


def load_weights(
    model: torch.nn.Module, found: Checkpoint, tensors: dict[str, torch.Tensor] | None = None
) -> None:
    """The checkpoint's model tensors (read unless given) into ``model``, after check_model_tensors (tied
    weights from its aliases)."""
    tensors = read_tensors(found, optimizer=False)[0] if tensors is None else tensors
    for alias, target in (found.state.get("aliases") or {}).items():
        if target in tensors:
            tensors[alias] = tensors[target]
    check_model_tensors(tensors, tensor_spec(model.state_dict()), found.path)
    model.load_state_dict(tensors)


def check_config(found: Checkpoint, config: dict[str, Any], source: Path) -> None:
    """A checkpoint belongs to a run only if it was written under the run's own config (a resolved
    ``Config.to_dict()``; keys added to the config since the checkpoint was written count as their defaults)."""
    if Config.from_dict(found.state["config"]).to_dict() != config:
        raise CheckpointError(
            f"{found.path} was written by a different config than {source}: "
            "it does not belong to this run; restore the run's own checkpoint"
        )


def resolve_checkpoint(path: str | Path) -> Checkpoint:
    """A checkpoint folder, or a run folder (its newest complete checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a run folder or a checkpoint folder")
    if (path / "state.json").is_file():
        return read_checkpoint(path)
    found = newest_checkpoint(path)
    if found is None:
        raise CheckpointError(
            f"{path} holds no complete checkpoint; pass a run folder that finished a checkpoint"
        )
    return found


def load_model(path: str | Path | Checkpoint, *, device: str | torch.device = "cpu"):
    """The model (eval mode) from a run folder, a checkpoint folder or an already verified Checkpoint."""
    found = path if isinstance(path, Checkpoint) else resolve_checkpoint(path)
    run_config = found.path.parent.parent / "config.json"
    if run_config.is_file():
        check_config(found, Config.from_json_file(run_config).to_dict(), run_config)
    cfg = Config.from_dict(found.state["config"])
    model = Transformer(cfg.model, init=False)
    load_weights(model, found)
    return model.to(device).eval()
