"""The suite itself: it mirrors the source tree, every module pytest collects holds tests, and helpers are not named
like test modules.

Where a test goes: a test of `aligner/<room>/<module>.py` lives in `tests/<room>/` (`aligner/pipelines/compare/` ->
`tests/pipelines/compare/`); the property suites that cut across rooms keep folders of their own (SUITES); checks of
the package as a whole (layers, install, demo, README) stay at the top; shared helpers live in `tests/support/`."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT, TESTS

SUITES = {"hostile", "fuzz", "faults", "zoo"}  # inputs built to break things, and code none of us wrote
HELPERS = {"support", "data"}                   # shared builders and fixture files: no test modules


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "data" not in p.relative_to(TESTS).parts)


def test_every_collected_module_defines_tests() -> None:
    empty = []
    for path in _test_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if not any(n.startswith(("test_", "Test")) for n in names):
            empty.append(str(path.relative_to(TESTS)))
    assert not empty, f"helper modules named like tests (pytest collects them): {empty}"


def test_the_tree_mirrors_the_package() -> None:
    """Each test folder is a room of aligner/ (or a folder inside one), a property suite, or the top level."""
    stray = []
    for path in _test_modules():
        folder = path.parent.relative_to(TESTS)
        if folder == Path("."):
            continue
        top = folder.parts[0]
        if top in SUITES:
            continue
        if top in HELPERS or not (ROOT / "aligner" / folder).is_dir():
            stray.append(str(path.relative_to(TESTS)))
    assert not stray, f"test modules in a folder that mirrors no aligner/ package and is no suite: {stray}"


def test_every_test_folder_is_a_package() -> None:
    """Packages give every test module a unique dotted name (tests.pipelines.compare.test_cli): two `test_cli.py` in
    different folders cannot collide, and no folder (tests/io) shadows a standard module of the same name."""
    folders = {p.parent for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"test folders without __init__.py: {missing}"
