"""Config files: a TOML file or a run's config.json read into a plain dict, and a config dict written back as
TOML with each key under a comment."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import tomllib

from smallinit import io
from smallinit.errors import ConfigError


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML config file, or a run's resolved config: its config.json, the run folder or one of its
    checkpoint folders (RUN/checkpoints/step_N)."""
    p = Path(path)
    if p.is_dir():
        run = p.parent.parent if p.parent.name == "checkpoints" else p
        p = run / "config.json" if (run / "config.json").is_file() else p
    if p.suffix == ".json" and p.is_file():
        return read_config_json(p)
    return read_toml(p)


def read_config_json(p: Path) -> Any:
    """A run's config.json; unreadable or not JSON is a damaged run folder."""
    raw = io.read_json(p)
    if raw is None:
        raise ConfigError(f"{p} is not valid JSON or cannot be read; the run folder is damaged")
    return raw


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"config file {str(p)!r} not found; pass an existing .toml file, or a run folder or its "
            "config.json"
        )
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (
        tomllib.TOMLDecodeError,
        UnicodeDecodeError,
        RecursionError,
    ) as e:  # RecursionError: nested too deep
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None


def commented_toml(sections: dict[str, dict[str, Any]], docs: dict[str, str]) -> str:
    """``sections`` as TOML that tomllib reads back equal, each key under ``# docs[dotted key]``; a None value
    is an absent optional section, named in a comment."""
    lines: list[str] = []
    for section, table in sections.items():
        _toml_section(lines, section, table, docs)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_section(lines: list[str], name: str, table: dict[str, Any], docs: dict[str, str]) -> None:
    lines += ["", f"[{name}]"]
    nested = []
    for key, value in table.items():
        if isinstance(value, dict):
            nested.append((key, value))
            continue
        if value is None:
            lines.append(f"# [{name}.{key}] (absent): {docs[f'{name}.{key}']}")
            continue
        lines += [f"# {docs[f'{name}.{key}']}", f"{key} = {toml_literal(value)}"]
    for key, value in nested:
        _toml_section(lines, f"{name}.{key}", value, docs)


def toml_literal(value: Any) -> str:
    """A value as the TOML literal that reads back to the same value (also what ``--set key=<literal>`` takes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"value {value!r} is not finite; use a finite number")
        return repr(value)  # Python's shortest round-trip form is valid TOML (1e-12, 0.003, 10000.0)
    if isinstance(value, str):  # JSON's escapes are TOML's; DEL is the one control character JSON leaves raw
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"value {value!r} has unsupported type {type(value).__name__}")
