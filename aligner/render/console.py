"""The one place that builds a rich Console: terminal width on a terminal, no wrapping when piped or redirected."""
from __future__ import annotations

import sys
from typing import IO

from rich.console import Console

PIPE_WIDTH = 240  # columns when output is a pipe or a file: wide enough that rows are never folded at 80


def make_console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A Console for stdout (or `file`/stderr); off a terminal it is wide and colourless, so lines stay whole."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(file=stream, width=None if tty else PIPE_WIDTH, soft_wrap=not tty, highlight=False,
                   no_color=not tty or None)
