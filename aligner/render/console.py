"""The one place that builds a rich Console: terminal width on a terminal, no wrapping when piped or redirected, and
no control character from the data (a tensor name, a path) ever reaching the terminal raw."""
from __future__ import annotations

import re
import sys
from typing import IO, Any

from rich.console import Console
from rich.text import Text

PIPE_WIDTH = 240  # columns when output is a pipe or a file: wide enough that rows are never folded at 80
# C0 controls but newline and tab, DEL, C1 controls, and the bidirectional overrides/isolates that reorder what a
# terminal shows (a name can make "ok" read as "ko")
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control or bidi-override character shown as its escape (\\x1b, \\u202e) instead of
    acted on: what a hostile tensor name or path could otherwise do to a terminal (colours, titles, cursor moves)."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


class SafeConsole(Console):
    """A Console that escapes control characters in every string it renders (printed text and table cells alike);
    rich's own styling is emitted after this, so colours still work."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)


def make_console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A Console for stdout (or `file`/stderr); off a terminal it is wide and colourless, so lines stay whole."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    tty = hasattr(stream, "isatty") and stream.isatty()
    return SafeConsole(file=stream, width=None if tty else PIPE_WIDTH, soft_wrap=not tty, highlight=False,
                       no_color=not tty or None)
