"""Options shared by every command, declared once so the same flag means the same thing everywhere."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import click

from aligner.core.atomic import check_output
from aligner.core.errors import AlignerError
from aligner.core.tolerance import ToleranceSpec

F = Callable[..., Any]

TOLERANCE_HELP = ("'X' for every record, 'GLOB:X' for matching names (repeatable; the last match wins). Give "
                  "--rtol and --atol together, as torch.testing requires (default: the command's, e.g. per dtype "
                  "as torch.testing for compare and diff).")


def tolerance_options(func: F) -> F:
    """--rtol/--atol, parsed by `tolerance_spec`: both or neither, per-name overrides as in Polygraphy."""
    func = click.option("--atol", "atol", metavar="X|GLOB:X", multiple=True,
                        help="Absolute tolerance. " + TOLERANCE_HELP)(func)
    return click.option("--rtol", "rtol", metavar="X|GLOB:X", multiple=True,
                        help="Relative tolerance. " + TOLERANCE_HELP)(func)


def tolerance_spec(rtol: Sequence[str], atol: Sequence[str], *, symmetric: bool = False) -> ToleranceSpec:
    """The ToleranceSpec of the --rtol/--atol texts (one clear error for a bad or unpaired value)."""
    return ToleranceSpec.parse(list(rtol) or None, list(atol) or None, symmetric=symmetric)


def trust_pickle_option(func: F) -> F:
    """--trust-pickle (and the hidden old spelling --allow-pickle): the one opt-in for code inside pickles."""
    func = click.option("--allow-pickle", "trust_pickle_alias", is_flag=True, hidden=True)(func)
    return click.option("--trust-pickle", "trust_pickle", is_flag=True,
                        help="Allow .pth files that need arbitrary code to unpickle (runs code from the file: "
                             "trusted files only).")(func)


def json_option(func: F) -> F:
    """--json PATH, '-' for stdout."""
    return click.option("--json", "json_out", metavar="PATH",
                        help="Write the full result as JSON ('-' for stdout, which replaces the text output).")(func)


def strict_option(func: F) -> F:
    """--strict: records or keys present on one side only fail the command (exit 1)."""
    return click.option("--strict", is_flag=True,
                        help="Fail (exit 1) when records or keys exist on one side only; by default they are "
                             "reported but do not fail.")(func)


def check_outputs(force: bool, **paths: str | None) -> None:
    """Refuse bad output paths before any work: '-' (stdout) at most once, distinct files, no silent overwrite."""
    given = {opt: p for opt, p in paths.items() if p}
    dashes = [opt for opt, p in given.items() if p == "-"]
    if len(dashes) > 1:
        raise AlignerError(f"{' and '.join('--' + d for d in dashes)} cannot both write to stdout")
    files = [p for p in given.values() if p != "-"]
    if len(set(files)) != len(files):
        raise AlignerError(f"{', '.join('--' + o for o in given)} must name different files")
    for p in files:
        check_output(p, force)


def positive_int(option: str, text: str | None) -> int | None:
    """A whole number >= 1 from an option's text, or None."""
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise AlignerError(f"{option} must be a whole number >= 1, got {text!r}")
    return int(text)


def whole_number(option: str, text: str | None) -> int | None:
    """A whole number >= 0 from an option's text, or None."""
    if text is None:
        return None
    if not text.isdigit():
        raise AlignerError(f"{option} must be a whole number >= 0, got {text!r}")
    return int(text)


def input_shape(text: str) -> tuple[int, ...]:
    """The shape `--input-shape 1,3,224,224` gives (align audit, align doctor): positive whole numbers."""
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise AlignerError(f"--input-shape {text!r}: expected comma-separated integers such as 1,3,224,224") from None
    if not shape or any(d <= 0 for d in shape):
        raise AlignerError(f"--input-shape {text!r}: every dimension must be positive")
    return shape
