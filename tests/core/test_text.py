"""core/text.py owns the short forms of numbers, step ranges and code values (issue 29 item 6): what they write, and
that no other module grows its own copy again."""
from __future__ import annotations

import ast
from pathlib import Path

from aligner.core.text import code_literal, short_number, span
from tests.support.paths import ROOT

PACKAGE = ROOT / "aligner"


def test_short_number() -> None:
    assert [short_number(x) for x in (1.2345e-5, 0.09090909, 191000.0, 0.0, float("nan"), float("inf"), None)] == \
        ["1.23e-05", "0.0909", "1.91e+05", "0", "nan", "inf", "-"]


def test_span() -> None:
    assert (span((7,)), span((1, 2, 40)), span(range(10, 31, 10))) == ("7", "1-40", "10-30")


def test_code_literal() -> None:
    assert [code_literal(v) for v in (0.1 + 0.2, 1.0, 1e-8, (0.9, 0.999), (3,), ((1, 1), (2, 2)), True, "same", None)] \
        == ["0.3", "1", "1e-08", "(0.9, 0.999)", "3", "((1, 1), (2, 2))", "True", "'same'", "None"]


def _formatters(path: Path) -> list[str]:
    """'name:line' of the functions of one argument that format it with .3g or .6g and little else: copies of
    core/text.py's."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef) or len(node.args.args) != 1:
            continue
        body = node.body[1:] if ast.get_docstring(node) else node.body
        arg = node.args.args[0].arg
        specs = {ast.unparse(v.format_spec) for v in ast.walk(node) if isinstance(v, ast.FormattedValue)
                 and v.format_spec is not None and isinstance(v.value, ast.Name) and v.value.id == arg}
        if len(body) <= 4 and specs & {"f'.3g'", "f'.6g'"}:
            found.append(f"{node.name}:{node.lineno}")
    return found


# copies kept on purpose, with why (the list only shrinks)
KEPT = {"render/compare.py: lit": "a setting's tuple as repr, so a restored 1-tuple attribute reads (768,) and "
                                  "compare's words stay byte for byte those of the zoo corpus"}


def test_no_module_keeps_its_own_number_formatter() -> None:
    found = {f"{path.relative_to(PACKAGE)}: {hit.split(':')[0]}" for path in sorted(PACKAGE.rglob("*.py"))
             if path != PACKAGE / "core" / "text.py" for hit in _formatters(path)}
    assert found == set(KEPT), found


def test_the_scan_finds_a_copy(tmp_path) -> None:
    """The guard above can fail: the two shapes the copies had (before core/text.py owned them) are found."""
    copy = tmp_path / "copy.py"
    copy.write_text('def _g(x):\n    return f"{x:.3g}"\n\n\ndef _lit(value):\n    """doc"""\n'
                    '    if isinstance(value, float):\n        return f"{value:.6g}"\n    return repr(value)\n')
    assert _formatters(copy) == ["_g:1", "_lit:5"]
    assert [hit.split(":")[0] for hit in _formatters(PACKAGE / "core" / "text.py")] == ["short_number", "code_literal"]
