"""How deep JSON and YAML read from a file may nest: one limit and one check for every parser that reads user data.

Python's json and PyYAML decoders (and msgspec) recurse once per level and raise RecursionError near Python's limit
of 1000, not their own decode error, and whatever walks a decoded value recursively later would do the same: a file
nested deeper than `MAX_NESTING` is refused as a `NestingError` (a ValueError), whichever of the two happens first.
"""
from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

# How deep a file may nest lists and objects: dump indices, maps, baselines and configs use a few levels (a call's
# `args`, msprobe's nested outputs, an audit report's findings: under 10).
MAX_NESTING = 64
TOO_DEEP = f"nested more than {MAX_NESTING} lists or objects deep"

T = TypeVar("T")


class NestingError(ValueError):
    """Decoded data nested deeper than MAX_NESTING."""


def too_deep(value: Any) -> bool:
    """Whether decoded JSON or YAML nests lists and objects more than MAX_NESTING deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_NESTING:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def bounded(parse: Callable[[], T]) -> T:
    """`parse()`'s value, NestingError when it recursed too deep to finish or returned data nested too deep."""
    try:
        value = parse()
    except RecursionError:
        raise NestingError(TOO_DEEP) from None
    if too_deep(value):
        raise NestingError(TOO_DEEP)
    return value


def json_loads(text: str | bytes | bytearray, **options: Any) -> Any:
    """`json.loads(text, **options)` within MAX_NESTING: json.JSONDecodeError or NestingError (both ValueError)."""
    return bounded(lambda: json.loads(text, **options))


def yaml_loads(text: str) -> Any:
    """`yaml.safe_load(text)` within MAX_NESTING: yaml.YAMLError or NestingError."""
    import yaml  # here, not at import: most commands never parse YAML (their start time)

    return bounded(lambda: yaml.safe_load(text))
