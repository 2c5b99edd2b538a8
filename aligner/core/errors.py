"""User-facing errors: one clear line, a specific exit code, never a traceback."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FOUND = 1   # the command ran and found a problem (divergence, unfilled keys, ...)
EXIT_USAGE = 2   # bad input, usage or I/O error


class AlignerError(Exception):
    """An error caused by the user's input; the CLI prints its message on one line and exits."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
