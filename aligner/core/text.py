"""Text from the data (tensor names, paths, file contents) made safe to show: what a hostile name could otherwise
do to a terminal (colours, window titles, cursor moves, right-to-left overrides)."""
from __future__ import annotations

import re

# C0 controls but newline and tab, DEL, C1 controls, and the bidirectional overrides/isolates that reorder what a
# terminal shows (a name can make "ok" read as "ko")
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control or bidi-override character shown as its escape (\\x1b, \\u202e) instead of
    acted on: what a hostile tensor name or path could otherwise do to a terminal (colours, titles, cursor moves)."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def one_line(text: str) -> str:
    """`printable(text)` with line breaks shown as \\n: an error message stays one line whatever a name holds."""
    return printable(text).replace("\n", "\\n").replace("\t", " ")
