"""Every pipeline package exposes its entry points one way: its __init__ is a lazy facade (aligner.core.lazy) naming
each public name and the module holding it, and the pipeline lives in a module, never in __init__ itself."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import aligner.pipelines

PIPELINES = Path(aligner.pipelines.__file__).resolve().parent
PACKAGES = sorted(p.parent.name for p in PIPELINES.glob("*/__init__.py"))


def test_there_are_pipeline_packages() -> None:
    assert {"audit", "check", "compare", "convert", "diff", "losses", "replay", "repro"} <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_init_is_a_lazy_facade(name: str) -> None:
    tree = ast.parse((PIPELINES / name / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):   # module level: only what a facade needs
            assert node.module in ("__future__", "typing", "aligner.core"), (name, node.module)
        assert not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Import)), (name, ast.dump(node)[:80])
    package = importlib.import_module(f"aligner.pipelines.{name}")
    table = package._LAZY
    assert sorted(package.__all__) == sorted(table), name
    for public, where in table.items():
        module, attribute = (where, public) if isinstance(where, str) else where
        assert getattr(importlib.import_module(module), attribute) is getattr(package, public), (name, public)
