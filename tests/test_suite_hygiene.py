"""The suite itself: every module pytest collects holds tests, and helpers are not named like test modules."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_collected_module_defines_tests() -> None:
    empty = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if not any(n.startswith(("test_", "Test")) for n in names):
            empty.append(path.name)
    assert not empty, f"helper modules named like tests (pytest collects them): {empty}"
