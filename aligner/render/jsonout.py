"""JSON output, the one way: non-finite floats become the strings "nan", "inf", "-inf" (JSON has no Infinity).
Strings stay exact: json's default ensure_ascii writes a lone surrogate from a name as its \\ud800 escape, which
reads back as the same string (raw, no UTF-8 writer could encode it)."""
from __future__ import annotations

import enum
import json
import math
import sys
from typing import IO, Any

from aligner.core.atomic import atomic_open


def jsonable(value: Any) -> Any:
    """`value` with every non-finite float replaced by its string and enums by their value, recursively (`Words` are
    a str holding their sentence: json writes that text)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def dumps(data: Any, indent: int | None = 1) -> str:
    """Strict JSON text of `data` (allow_nan=False proves no Infinity/NaN slipped through)."""
    return json.dumps(jsonable(data), indent=indent, allow_nan=False)


def write_nested(fh: IO[str], data: dict[str, Any], deep: dict[str, int]) -> None:
    """`dumps(data)` byte for byte, written a piece at a time: the value of each key in `deep` an item at a time,
    `deep[key]` levels down (a report's findings, a series per layer), so a long report is never one string nor one
    jsonable copy of itself."""
    fh.write("{")
    for n, (key, value) in enumerate(data.items()):
        fh.write(("," if n else "") + "\n " + json.dumps(str(key)) + ": ")
        _write_item(fh, value, 1, deep.get(key, 0))
    fh.write("\n}" if data else "}")


def _write_item(fh: IO[str], value: Any, level: int, depth: int) -> None:
    """One value as `dumps` writes it at nesting `level` (indent 1), its items one by one `depth` levels down."""
    if depth <= 0 or not isinstance(value, (dict, list, tuple)) or not value:
        fh.write(dumps(value).replace("\n", "\n" + " " * level))  # json escapes a newline inside a string
        return
    inner = "\n" + " " * (level + 1)
    if isinstance(value, dict):
        fh.write("{")
        for n, (key, item) in enumerate(value.items()):
            fh.write(("," if n else "") + inner + json.dumps(str(key)) + ": ")
            _write_item(fh, item, level + 1, depth - 1)
        fh.write("\n" + " " * level + "}")
        return
    fh.write("[")
    for n, item in enumerate(value):
        fh.write(("," if n else "") + inner)
        _write_item(fh, item, level + 1, depth - 1)
    fh.write("\n" + " " * level + "]")


def write_json(data: Any, path: str, writer: Any = None) -> None:
    """Write `data` to `path` atomically, or to stdout for '-'; `writer(data, fh)` overrides the formatting."""
    def emit(fh: IO[str]) -> None:
        if writer is None:
            fh.write(dumps(data) + "\n")
        else:
            writer(data, fh)

    if path == "-":
        emit(sys.stdout)
        sys.stdout.flush()
        return
    with atomic_open(path, "w") as fh:
        emit(fh)
