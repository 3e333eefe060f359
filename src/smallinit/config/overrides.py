"""Dotted keys (``train.steps``): ``--set key=value`` overrides parsed and set into a nested config dict, and a
nested dict flattened back to dotted keys."""

from __future__ import annotations

from typing import Any

import tomllib

from smallinit.errors import ConfigError


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value``: the value is read as a TOML literal (1e-12, true, "x", [1, 2]) or else kept as text."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.isidentifier() for part in key.split(".")):
        raise ConfigError(f"--set {item!r} is not of the form section.key=value (e.g. train.steps=200)")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    except RecursionError:
        raise ConfigError(f"--set {key}: the value nests too deeply; pass a plain value") from None
    return key, value


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part!r} is a value, not a section")
        node = child
    node[last] = value


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"steps": 1}, "model.gamma": 1}`` → ``{"train.steps": 1, "model.gamma": 1}``."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{full}."))
        else:
            out[full] = value
    return out
