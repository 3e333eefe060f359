"""fields.py: one way a record goes to and from JSON, tolerant or strict of a field of the wrong kind."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from smallinit.fields import Fields, to_json


@dataclass(frozen=True)
class Inner:
    x: int

    def to_dict(self) -> dict:
        return {"x": self.x, "twice": 2 * self.x}


@dataclass(frozen=True)
class Outer:
    b: float
    a: tuple[tuple[float, ...], ...] = ()
    share: dict[float, float] = field(default_factory=dict)
    inner: tuple[Inner, ...] = ()
    n: object = None


def test_to_json_keeps_the_declared_order_and_writes_plain_json():
    rec = Outer(np.float64(0.1), ((1.0, 2.0), ()), {0.3: 0.5}, (Inner(2),), np.int64(7))
    out = to_json(rec)
    assert list(out) == ["b", "a", "share", "inner", "n"]  # declared order, not sorted
    assert out == {
        "b": 0.1,
        "a": [[1.0, 2.0], []],
        "share": {"0.3": 0.5},
        "inner": [{"x": 2, "twice": 4}],
        "n": 7,
    }
    assert type(out["b"]) is float and type(out["n"]) is int  # numpy numbers become Python's
    assert json.loads(json.dumps(out)) == out


RAW = {"step": 3, "loss": "high", "lr": 1, "flag": True, "table": {"a": 1.5, "b": "x"}, "list": [1, "2"]}


def test_a_tolerant_reader_reads_a_field_of_the_wrong_kind_as_absent():
    f = Fields(RAW, strict=False)
    assert f.integer("step") == 3 and f.integer("loss") is None and f.integer("flag") is None
    assert f.number("loss") is None and f.number("lr") == 1.0 and type(f.number("lr")) is float
    assert f.number("flag") is None  # a bool is no number
    assert f.table("table") == {"a": 1.5} and f.table("loss") == {} and f.table("absent") == {}
    assert f.numbers("list") == (1.0,) and f.numbers("step") == ()
    assert f.text("step") == "3" and f.text("absent") is None


def test_a_strict_reader_names_the_field_of_the_wrong_kind():
    f = Fields(RAW, strict=True, where="sink.")
    for read, key, kind in (
        (f.number, "loss", "a number"),
        (f.integer, "flag", "an integer"),
        (f.table, "loss", "a table"),
        (f.numbers, "step", "a list"),
        (f.numbers, "list", "a number"),
    ):
        with pytest.raises(TypeError, match=f"sink.{key} is .*, not {kind}"):
            read(key)
    with pytest.raises(TypeError, match=r"sink.table\[b\] is 'x', not a number"):
        f.table("table")
    with pytest.raises(TypeError, match="sink.absent is missing"):
        f.number("absent", required=True)
    # absent or null reads as None or empty, strict or not
    assert f.number("absent") is None and f.integer("absent") is None and f.numbers("absent") == ()
    assert f.rows("absent") == () and Fields({"r": [[1], [2, 3]]}, strict=True).rows("r") == (
        (1.0,),
        (2.0, 3.0),
    )
    with pytest.raises(TypeError, match="sink is 3, not a table"):
        Fields(3, strict=True, where="sink.")
