"""JSON output: `write_nested` writes what `dumps` writes, byte for byte, a piece at a time."""
from __future__ import annotations

import enum
import io
import math

from aligner.render.jsonout import dumps, write_nested


class Colour(enum.Enum):
    RED = "red"


def test_write_nested_is_dumps_byte_for_byte() -> None:
    data = {
        "findings": [{"rule": "x", "message": "two\nlines", "values": [math.inf, -math.inf, math.nan, 1.5]},
                     {"rule": "é\ud800", "where": [], "more": {}}, {}],
        "empty": [], "none": {}, "colour": Colour.RED, "n": 0,
        "series": {"grad_norms": {"a.weight": {0: 1.0, 1: math.nan}, "b": {}}, "loss": {3: 2.0}, "exact": True},
        "nested": {"deep": [[1, [2, {"k": []}]]]},
    }
    for deep in ({}, {"findings": 1}, {"findings": 3, "series": 2, "nested": 5, "empty": 1, "none": 2, "n": 1}):
        out = io.StringIO()
        write_nested(out, data, deep)
        assert out.getvalue() == dumps(data), deep
    out = io.StringIO()
    write_nested(out, {}, {"x": 1})
    assert out.getvalue() == dumps({})
