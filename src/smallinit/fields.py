"""One way to write a record to and from JSON.

:func:`to_json` writes a dataclass record as its fields in the order they are declared, as plain JSON values.
:class:`Fields` reads one record's fields back from parsed JSON, and its ``strict`` says what a field of the
wrong kind does: a tolerant reader (metrics.jsonl, which outlives the code that wrote it) reads it as absent,
a strict one (analysis.json) raises TypeError naming it. Absent or null reads as None (or empty) either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


def to_json(record: Any) -> dict[str, Any]:
    """A dataclass record's fields, in declared order, as JSON values (see :func:`plain`)."""
    return {f.name: plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def plain(value: Any) -> Any:
    """A value as JSON holds it: a record by its own ``to_dict()``, a tuple as a list, a table with string keys
    (a float key ε as ``str(ε)``), a numpy number or array as Python's."""
    if dataclasses.is_dataclass(value) and hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Fields:
    """The fields of one record as parsed from JSON, each read as the kind the record declares."""

    def __init__(self, raw: Mapping[str, Any], *, strict: bool, where: str = ""):
        if not isinstance(raw, Mapping):
            raise TypeError(f"{where.rstrip('.') or 'a record'} is {raw!r}, not a table")
        self.raw, self.strict, self.where = raw, strict, where

    def _wrong(self, key: str, v: Any, kind: str) -> None:
        if self.strict:
            raise TypeError(f"{self.where}{key} is {v!r}, not {kind}")

    def number(self, key: str, *, required: bool = False) -> float | None:
        """A number; ``required``: absent or null raises TypeError too."""
        v = self.raw.get(key)
        if v is None and required:
            raise TypeError(f"{self.where}{key} is missing, not a number")
        if v is None or _is_number(v):
            return None if v is None else float(v)
        return self._wrong(key, v, "a number")

    def integer(self, key: str) -> int | None:
        v = self.raw.get(key)
        if v is None or (isinstance(v, int) and not isinstance(v, bool)):
            return v
        return self._wrong(key, v, "an integer")

    def text(self, key: str) -> str | None:
        v = self.raw.get(key)
        return None if v is None else str(v)

    def numbers(self, key: str) -> tuple[float, ...]:
        """A list of numbers (empty where the file has none)."""
        return self._numbers(key, self.raw.get(key))

    def rows(self, key: str) -> tuple[tuple[float, ...], ...]:
        """A list of lists of numbers (empty where the file has none)."""
        v = self.raw.get(key) or ()
        if not isinstance(v, Sequence):
            self._wrong(key, v, "a list")
            return ()
        return tuple(self._numbers(key, row) for row in v)

    def _numbers(self, key: str, v: Any) -> tuple[float, ...]:
        if v is None:
            return ()
        if not isinstance(v, Sequence) or isinstance(v, str):
            self._wrong(key, v, "a list")
            return ()
        out = []
        for x in v:
            if _is_number(x):
                out.append(float(x))
            else:
                self._wrong(key, x, "a number")
        return tuple(out)

    def table(self, key: str, kind: type = float) -> dict[str, Any]:
        """A name → value table in the file's order (empty where the file has none). Tolerant, an entry of the
        wrong kind is left out; strict, it raises."""
        v = self.raw.get(key)
        if not isinstance(v, Mapping):
            if v is not None:
                self._wrong(key, v, "a table")
            return {}
        if kind is str:
            return {str(k): str(x) for k, x in v.items()}
        out = {}
        for k, x in v.items():
            if _is_number(x):
                out[str(k)] = float(x)
            else:
                self._wrong(f"{key}[{k}]", x, "a number")
        return out
