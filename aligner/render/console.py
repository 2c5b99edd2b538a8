"""The one place that builds a rich Console: terminal width on a terminal, no wrapping when piped or redirected, and
no string from the data (a tensor name, a path) ever acting on the terminal: never parsed as rich markup, and no
control character, bidi override or lone surrogate reaching it raw."""
from __future__ import annotations

import sys
from typing import IO, Any

from rich.console import Console
from rich.text import Text

from aligner.core.text import printable

PIPE_WIDTH = 240  # columns when output is a pipe or a file: wide enough that rows are never folded at 80


class SafeConsole(Console):
    """A Console that renders every string (printed text, table cells and titles alike) as plain text: never rich
    markup (a name holding `[/x]` or `[link=...]` is data, not a tag) and with control characters escaped. Styles
    are given as `style=` or as `styled(...)` Text, so colours still work. Emoji codes stay text: a name such as
    `step:100:` is data, not `:100:`."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs["markup"] = False
        return super().render_str(printable(text), **kwargs)


def styled(*parts: str | tuple[str, str]) -> Text:
    """One line from parts, each plain text or (text, style): our colours around data shown as it is (no markup,
    control characters escaped), for lines whose parts differ in style."""
    return Text.assemble(*((printable(p), "") if isinstance(p, str) else (printable(p[0]), p[1]) for p in parts))


def make_console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A Console for stdout (or `file`/stderr); off a terminal it is wide and colourless, so lines stay whole."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    tty = hasattr(stream, "isatty") and stream.isatty()
    return SafeConsole(file=stream, width=None if tty else PIPE_WIDTH, soft_wrap=not tty, highlight=False,
                       no_color=not tty or None, emoji=False)
