"""The contract every pipeline result keeps: an exit code, `passed` (and `bool(result)`), plain data out (`to_dict`)
and back in (`from_dict`), so a saved result re-renders without running its pipeline again (`align report`).

A result's dict is what its `--json` writes, before render/ turns non-finite floats into the strings "nan", "inf"
and "-inf" (`number` turns them back). A saved result may carry `"schema"`: results without one are schema 1; each
kind reads its own version (`SCHEMAS`) and refuses any other in `check_schema`, as a dict that is no result of the
kind asked is.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Protocol, TypeVar, runtime_checkable

from aligner.core.errors import ExitCode

SCHEMA = 1  # the version of a result's dict unless SCHEMAS says otherwise
# The kinds whose dict changed since schema 1 (bump one where a field changes meaning or goes away), as check_schema
# names them. 2: a comparison's sides are "migrated" and "reference" (were "side_a" and "reference"); rank by rank,
# "first" and "second" (the arguments, were "side_a" and "side_b").
SCHEMAS = {"compare": 2, "multi-rank compare": 2}

T = TypeVar("T")


@runtime_checkable
class Result(Protocol):
    """What `align` and library users get back from every pipeline."""

    @property
    def exit_code(self) -> ExitCode:
        """0 passed, 1 found something, 2 bad or unreadable input."""

    @property
    def passed(self) -> bool:
        """Nothing was found and everything could be read (exit code 0)."""

    def __bool__(self) -> bool: ...

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain data (enums as their values; a sentence as `Words`, a `str` holding its text)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """The result `to_dict` gave, back (ValueError, KeyError or TypeError for data that is not one)."""


class PassedByExitCode:
    """Mixin for a result whose `passed` and truth are its exit code 0, as the `Result` protocol says (a result whose
    `passed` means something else defines its own and says what)."""

    __slots__ = ()

    @property
    def exit_code(self) -> ExitCode:
        raise NotImplementedError

    @property
    def passed(self) -> bool:
        """Nothing was found and everything could be read (exit code 0)."""
        return self.exit_code is ExitCode.OK

    def __bool__(self) -> bool:
        return self.passed


class NotAResultError(ValueError):
    """Data that is not a saved result of the kind asked for (the message says what is wrong, without a path)."""


def check_schema(data: Any, what: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """`data` as a saved `what` result: a JSON object holding `keys`, of the schema `what` is written in (none: 1);
    NotAResultError else."""
    if not isinstance(data, Mapping):
        raise NotAResultError(f"not a saved {what} result (a JSON {type(data).__name__}, not an object)")
    missing = [k for k in keys if k not in data]
    if missing:
        raise NotAResultError(f"not a saved {what} result (no {', '.join(map(repr, missing[:3]))})")
    schema, current = data.get("schema", SCHEMA), SCHEMAS.get(what, SCHEMA)
    if schema != current or isinstance(schema, bool):
        raise NotAResultError(f"saved {what} result of schema {json.dumps(schema)[:20]}; this aligner reads schema "
                              f"{current} (run the command again to write it)")
    return data


def number(value: Any) -> float | None:
    """A float a result's JSON holds: a number, the string "nan", "inf" or "-inf", or None; ValueError else."""
    if value is None or isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if value in ("nan", "inf", "-inf"):
        return float(value)
    raise ValueError(f"expected a number, got {str(value)[:40]!r}")


def required_number(value: Any, what: str) -> float:
    """`number` where null has no place: ValueError "`what` is missing" for None."""
    found = number(value)
    if found is None:
        raise ValueError(f"{what} is missing")
    return found


def typed(value: Any, kind: type[T], what: str) -> T:
    """`value` when it is a `kind` (an int is no bool here); ValueError naming `what` else."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise ValueError(f"{what}: expected {kind.__name__}, got {type(value).__name__}")

