"""The one place that builds a rich Console: terminal width on a terminal, no wrapping when piped or redirected, and
no control character from the data (a tensor name, a path) ever reaching the terminal raw."""
from __future__ import annotations

import sys
from typing import IO, Any

from rich.console import Console
from rich.text import Text

from aligner.core.text import printable

PIPE_WIDTH = 240  # columns when output is a pipe or a file: wide enough that rows are never folded at 80


class SafeConsole(Console):
    """A Console that escapes control characters in every string it renders (printed text and table cells alike);
    rich's own styling is emitted after this, so colours still work. Emoji codes stay text: a name such as
    `step:100:` is data, not `:100:`."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)


def make_console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A Console for stdout (or `file`/stderr); off a terminal it is wide and colourless, so lines stay whole."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    tty = hasattr(stream, "isatty") and stream.isatty()
    return SafeConsole(file=stream, width=None if tty else PIPE_WIDTH, soft_wrap=not tty, highlight=False,
                       no_color=not tty or None, emoji=False)
