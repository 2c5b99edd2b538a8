"""User-facing errors: one clear line, a specific exit code, never a traceback; and the exit codes themselves."""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """One table for every command (README): 0 agree / healthy, 1 found a problem, 2 usage or input error."""

    OK = 0
    FOUND = 1    # a numeric divergence, an error-severity finding, unfilled keys, ...
    USAGE = 2    # bad input, usage or I/O error


EXIT_OK, EXIT_FOUND, EXIT_USAGE = ExitCode.OK, ExitCode.FOUND, ExitCode.USAGE


class AlignerError(Exception):
    """An error caused by the user's input; the CLI prints its message on one line and exits."""

    exit_code: int = ExitCode.USAGE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
