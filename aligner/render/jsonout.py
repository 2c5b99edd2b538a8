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
from aligner.core.words import Words
from aligner.render.words import say


def jsonable(value: Any) -> Any:
    """`value` with every non-finite float replaced by its string, enums by their value and `Words` by their sentence
    (the `message` a saved result keeps), recursively."""
    if isinstance(value, Words):
        return say(value)
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
