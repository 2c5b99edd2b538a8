"""Lazy package facades (PEP 562): a package names what it exports and where each name lives, and the module holding
it is imported on first use, so importing the package (`import aligner`, `align --help`) stays cheap."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def attributes(package: str, table: Mapping[str, str | tuple[str, str]]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: each name maps to the module holding it under the same name, or to
    (module, its name there)."""
    def module_getattr(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = (where, name) if isinstance(where, str) else where
        return getattr(importlib.import_module(module), attribute)

    return module_getattr
