"""Option parsers shared by several commands (each turns bad text into one clear AlignerError)."""
from __future__ import annotations

from aligner.core.errors import AlignerError


def parse_tolerance(name: str, text: str | None) -> float | None:
    """A non-negative finite float from an option's text (one clear error otherwise)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise AlignerError(f"{name} must be a number, got {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise AlignerError(f"{name} must be a finite number >= 0, got {text!r}")
    return value
