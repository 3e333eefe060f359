"""One way to write a record to and from JSON.

:func:`to_json` writes a dataclass record as its fields in the order they are declared, as plain JSON values;
:func:`from_json` reads them back, each field as the kind its annotation declares, so a field added to a record
is written and read with no further edit. :class:`Fields` reads one field, and its ``strict`` says what a field
of the wrong kind does: a tolerant reader (metrics.jsonl, which outlives the code that wrote it) reads it as
absent, a strict one (analysis.json) raises TypeError naming it. Absent or null reads as the field's default
(None or empty) either way; keys that are not fields (derived values written for readers) are ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

R = TypeVar("R")


def to_json(record: Any) -> dict[str, Any]:
    """A dataclass record's fields, in declared order, as JSON values (see :func:`plain`)."""
    return {f.name: plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def plain(value: Any) -> Any:
    """A value as JSON holds it: a record by its own ``to_dict()`` (else its fields), a tuple as a list, a table with string keys
    (a float key ε as ``str(ε)``), a numpy number or array as Python's."""
    if dataclasses.is_dataclass(value):
        return value.to_dict() if hasattr(value, "to_dict") else to_json(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def from_json(cls: type[R], raw: Mapping[str, Any], *, strict: bool, where: str = "") -> R:
    """The dataclass record ``cls`` that :func:`to_json` wrote as ``raw``."""
    f = Fields(raw, strict=strict, where=where)
    hints = typing.get_type_hints(cls)
    return cls(
        **{
            fld.name: f.of(fld.name, hints[fld.name])
            for fld in dataclasses.fields(cls)
            if fld.init and (raw.get(fld.name) is not None or _required(fld))
        }
    )


def _required(fld: dataclasses.Field) -> bool:
    return fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING


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

    def of(self, key: str, kind: Any) -> Any:
        """The field ``key`` read as ``kind``, a type annotation: a number, an integer, text, a record, or a
        tuple or table of them (``X | None`` reads as X, null as None)."""
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            return self.of(key, args[0])
        if kind is Any:
            return self.raw.get(key)
        if dataclasses.is_dataclass(kind):
            v = self.raw.get(key)
            if v == {} or not (isinstance(v, Mapping) or self.strict):  # an empty record is none
                return None
            return from_json(kind, v, strict=self.strict, where=f"{self.where}{key}.")
        origin = typing.get_origin(kind)
        if origin is tuple:
            item = args[0]
            if item is float:
                return self.numbers(key)
            if typing.get_origin(item) is tuple:
                return self.rows(key)
            return tuple(self._items(key, item))
        if origin is dict:
            keys, values = args
            if values is Any:  # a document of its own (a config), kept as written
                v = self.raw.get(key)
                return dict(v) if isinstance(v, Mapping) else self._wrong(key, v, "a table")
            table = self.table(key, str if values is str else float)
            return {float(k): v for k, v in table.items()} if keys is float else table
        return {float: self.number, int: self.integer, str: self.text, bool: self.flag}[kind](key)

    def _items(self, key: str, kind: Any) -> list[Any]:
        v = self.raw.get(key) or ()
        if not isinstance(v, Sequence) or isinstance(v, str):
            self._wrong(key, v, "a list")
            return []
        if dataclasses.is_dataclass(kind):
            return [from_json(kind, x, strict=self.strict, where=f"{self.where}{key}.") for x in v]
        if kind is int:
            return [int(x) for x in v]
        return [str(x) for x in v]

    def flag(self, key: str) -> bool | None:
        v = self.raw.get(key)
        if v is None or isinstance(v, bool):
            return v
        return self._wrong(key, v, "true or false")

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
