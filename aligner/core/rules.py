"""The rules files shipped in `aligner.mappings` (the top-level mappings/ folder, inside the wheel), read one way.

`load_rules(name, schema)` parses a file once and checks it against the schema its reader declares beside the types
it builds (one schema per file, in one place). A schema is plain data:

* a type (`str`, `int`, `float`, `bool`; `float` takes an int too), `None`, `ANY`, an Enum class (its values) or a
  literal (`"uniform"`: that value);
* `{key: schema}`: a mapping with exactly these keys, `Opt(schema)` marking the optional ones;
* `MapOf(schema, keys=schema)`: a mapping of any keys; `ListOf(schema)`: a list; `OneOf(a, b, ...)`: the first match.

Every file spells the same things the same way: the two sides as `pytorch:` / `mindspore:` (Framework's values), an
explanation as `why:`. A file that breaks its schema (an edit that misspells a key) is one AlignerError line naming
the file and the place (`audit_layers.yaml: rules[3].why: expected str, got 1`).
"""
from __future__ import annotations

import dataclasses
import enum
from importlib import resources
from typing import Any

from aligner.core.errors import AlignerError
from aligner.core.nesting import yaml_loads

PACKAGE = "aligner.mappings"   # mappings/ in a checkout, aligner/mappings in a wheel (setup.py package_dir)
ANY = object()                 # any value


@dataclasses.dataclass(frozen=True)
class Opt:
    """An optional key of a `{key: schema}` mapping (absent, or null when `schema` allows None)."""

    schema: Any


@dataclasses.dataclass(frozen=True)
class MapOf:
    """A mapping of any keys (each matching `keys`) to values matching `values`."""

    values: Any
    keys: Any = str


@dataclasses.dataclass(frozen=True)
class ListOf:
    """A list whose items match `items`."""

    items: Any


class OneOf:
    """The first of several schemas that matches."""

    def __init__(self, *options: Any) -> None:
        self.options = options


class SchemaError(ValueError):
    """Data that breaks a schema: the place (`rules[3].why`) and what was expected."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where or 'top level'}: {message}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _scalar(schema: Any, value: Any) -> bool | None:
    """Whether a scalar schema accepts `value` (None: `schema` is not a scalar schema)."""
    if schema is ANY:
        return True
    if isinstance(schema, (str, int, float)):   # a literal: that value (bool is an int)
        return type(value) is type(schema) and value == schema
    if schema is None:
        return value is None
    if isinstance(schema, type) and issubclass(schema, enum.Enum):
        return any(value == member.value for member in schema)
    if schema is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if schema is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(schema, type):
        return isinstance(value, schema)
    return None


def _describe(schema: Any) -> str:
    if isinstance(schema, (str, int, float)):
        return repr(schema)
    if isinstance(schema, type) and issubclass(schema, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in schema)
    if isinstance(schema, type):
        return schema.__name__
    if isinstance(schema, OneOf):
        return " or ".join(_describe(o) for o in schema.options)
    if isinstance(schema, (dict, MapOf)):
        return "a mapping"
    if isinstance(schema, ListOf):
        return "a list"
    return "null" if schema is None else "any value"


def validate(schema: Any, value: Any, where: str = "") -> None:
    """Raise SchemaError at the first place `value` breaks `schema`."""
    accepted = _scalar(schema, value)
    if accepted is not None:
        if not accepted:
            raise SchemaError(where, f"expected {_describe(schema)}, got {_show(value)}")
        return
    if isinstance(schema, OneOf):
        for option in schema.options:
            try:
                validate(option, value, where)
                return
            except SchemaError:
                continue
        raise SchemaError(where, f"expected {_describe(schema)}, got {_show(value)}")
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, got {_show(value)}")
        for i, item in enumerate(value):
            validate(schema.items, item, f"{where}[{i}]")
        return
    if not isinstance(value, dict):
        raise SchemaError(where, f"expected a mapping, got {_show(value)}")
    prefix = f"{where}." if where else ""
    if isinstance(schema, MapOf):
        for key, item in value.items():
            validate(schema.keys, key, f"{prefix}{key}")
            validate(schema.values, item, f"{prefix}{key}")
        return
    unknown = [str(k) for k in value if k not in schema]
    if unknown:
        raise SchemaError(where, f"unknown key {unknown[0]!r} (expected {', '.join(map(str, schema))})")
    for key, sub in schema.items():
        optional = isinstance(sub, Opt)
        if key not in value:
            if not optional:
                raise SchemaError(where, f"missing key {key!r}")
            continue
        validate(sub.schema if optional else sub, value[key], f"{prefix}{key}")


_LOADED: dict[str, Any] = {}


def load_rules(name: str, schema: Any) -> Any:
    """The rules file `name` of the installed `aligner.mappings` package, parsed once and checked against `schema`
    (AlignerError naming the file and the place when it cannot be read or breaks the schema)."""
    if name not in _LOADED:
        import yaml  # here, not at import: most commands never parse a rules file (their start time)

        try:
            data = yaml_loads(resources.files(PACKAGE).joinpath(name).read_text(encoding="utf-8"))
            validate(schema, data)
        except (OSError, ValueError, yaml.YAMLError) as exc:   # SchemaError and NestingError are ValueErrors
            raise AlignerError(f"{name}: cannot read the rules: {' '.join(str(exc).split())}") from None
        _LOADED[name] = data
    return _LOADED[name]
