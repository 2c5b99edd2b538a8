"""Text from the data (tensor names, paths, file contents) made safe to show: what a hostile name could otherwise
do to a terminal (colours, window titles, cursor moves, right-to-left overrides) or to a UTF-8 file (a lone
surrogate, which no UTF-8 writer can encode); and the short forms of numbers, step ranges and code values that
messages at every layer share (one owner, so the same number reads the same everywhere)."""
from __future__ import annotations

import re
from typing import Any, Sequence

# C0 controls but newline and tab, DEL, C1 controls, the bidirectional overrides/isolates that reorder what a
# terminal shows (a name can make "ok" read as "ko"), and lone surrogates (a "\ud800" JSON escape, or a file name's
# undecodable byte under surrogateescape): they cannot be written as UTF-8
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

# what a spreadsheet reads as the start of a formula (OWASP's CSV injection list)
_FORMULA_LEADERS = ("=", "+", "-", "@", "\t", "\r")


def printable(text: str) -> str:
    """`text` with every control, bidi-override or lone surrogate character shown as its escape (\\x1b, \\u202e,
    \\ud800) instead of acted on: what a hostile tensor name or path could otherwise do to a terminal or a file."""
    return UNPRINTABLE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def one_line(text: str) -> str:
    """`printable(text)` with line breaks shown as \\n: an error message stays one line whatever a name holds."""
    return printable(text).replace("\n", "\\n").replace("\t", " ")


def spreadsheet_text(text: str) -> str:
    """`printable(text)` with a leading ' where a spreadsheet would read a formula (=, +, -, @, tab, CR first): a
    name such as =HYPERLINK(...) in a CSV cell stays text when the file is opened in Excel or LibreOffice."""
    return "'" + printable(text) if text.startswith(_FORMULA_LEADERS) else printable(text)


def short_number(value: float | None) -> str:
    """`value` to 3 significant digits for a message ('1.23e-05', '0.0909'); '-' for None."""
    return "-" if value is None else f"{value:.3g}"


def span(values: Sequence[int]) -> str:
    """'1-40' for ascending steps from 1 to 40, '7' for one."""
    return f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])


def code_literal(value: Any) -> str:
    """`value` as it is written in code: floats to 6 digits (0.1, not 0.09999999999999998), a tuple's items so too,
    a 1-tuple as its item (an argument that takes a number or a tuple)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return code_literal(value[0]) if len(value) == 1 else "(" + ", ".join(map(code_literal, value)) + ")"
    return repr(value)
