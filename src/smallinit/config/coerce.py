"""A config dataclass built from a plain dict: unknown keys refused and each value checked against its field's
type (int, float, bool, str, a ``Literal`` of choices, an optional nested section) by the one coercer."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from smallinit.config.files import toml_literal
from smallinit.errors import ConfigError, did_you_mean


def from_dict(cls: type, raw: Any, where: str) -> Any:
    """Build dataclass ``cls`` from a dict, checking names and types; ``where`` names the section."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config section [{where}] must be a table, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        key = f"{where}." if where else ""
        key += unknown[0]
        hint = did_you_mean(unknown[0], fields, f"{where}." if where else "")
        raise ConfigError(  # repr() for keys with control characters: the message stays one line
            f"unknown config key {key if key.isprintable() else repr(key)}{hint}; known keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in raw.items():
        key = f"{where}.{name}" if where else name
        _refuse(fields[name], value, key)
        kwargs[name] = _coerce(hints[name], value, key)
    return cls(**kwargs)


def check_choices(obj: Any, section: str) -> None:
    """Check the ``Literal`` fields of dataclass ``obj`` as from_dict does: values given to the constructor in
    code never pass through from_dict."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if typing.get_origin(hints[f.name]) is typing.Literal:
            value, where = getattr(obj, f.name), f"{section}.{f.name}"
            _refuse(f, value, where)
            _one_of(hints[f.name], value, where)


def _refuse(f: dataclasses.Field, value: Any, where: str) -> None:
    """A value the field's ``refused`` metadata names fails with its reason, not as one more wrong choice."""
    for bad, reason in f.metadata.get("refused", {}).items():
        if value == bad:
            raise ConfigError(f"{where}={value} is refused: {reason}")


def spelled(value: Any) -> str:
    """A value as it is written in a TOML file or after --set (true, "text", 1e-12), for messages."""
    try:
        return toml_literal(value)
    except (ConfigError, TypeError, ValueError):
        return repr(value)


def _one_of(tp: Any, value: Any, where: str) -> Any:
    choices = typing.get_args(tp)
    if value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ConfigError(
            f"{where} must be one of {', '.join(map(spelled, choices))}, got {spelled(value)}{hint}"
        )
    return value


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and len(args) == 1):
            return None
        if len(args) == 1:
            return _coerce(args[0], value, where)
        for arg in args:  # bool | str: the first type the value is
            try:
                return _coerce(arg, value, where)
            except ConfigError:
                pass
        raise ConfigError(
            f"config key {where} must be {' or '.join(a.__name__ for a in args)}, got {spelled(value)}"
        )
    if origin is typing.Literal:  # a value of the wrong type gets the choices too, as they are spelled
        return _one_of(tp, value, where)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # nan slips through every range check, and is not valid JSON
                raise ConfigError(f"config key {where} must be a finite number, got {spelled(value)}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"config key {where} must be {_KIND.get(tp, tp.__name__)}, got {spelled(value)}")


_KIND = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string (in quotes in a TOML file)",
}
