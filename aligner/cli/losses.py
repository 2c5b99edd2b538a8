"""`align losses RUN_A RUN_B`: compare two training loss curves and say where and why they part."""
from __future__ import annotations

import math

import click

from aligner.core.errors import AlignerError
from aligner.pipelines.losses import DEFAULT_ATOL, DEFAULT_RTOL


def _tolerance(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """A finite, non-negative float; bad values are one-line errors."""
    try:
        number = float(value)
    except ValueError:
        raise AlignerError(f"--{param.name}: {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise AlignerError(f"--{param.name}: {value!r} must be a finite number >= 0")
    return number


def _rows(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A whole number >= 0."""
    try:
        number = int(value)
    except ValueError:
        raise AlignerError(f"--show: {value!r} is not a whole number") from None
    if number < 0:
        raise AlignerError(f"--show: {value!r} must be >= 0")
    return number


def _pattern(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Check a regex (compiles, has a `loss` group) before any file is read."""
    if value is not None:
        from aligner.pipelines.losses.parse import compile_pattern

        compile_pattern(value, "--" + param.name.replace("_", "-"))
    return value


@click.command(name="losses")
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--pattern", callback=_pattern, metavar="REGEX",
              help="Regex for text logs with a named group (?P<loss>...) and optional (?P<step>...), (?P<epoch>...).")
@click.option("--pattern-a", callback=_pattern, metavar="REGEX", help="Regex for RUN_A only (overrides --pattern).")
@click.option("--pattern-b", callback=_pattern, metavar="REGEX", help="Regex for RUN_B only (overrides --pattern).")
@click.option("--rtol", default=str(DEFAULT_RTOL), callback=_tolerance, show_default=True, metavar="FLOAT",
              help="Relative tolerance per step.")
@click.option("--atol", default=str(DEFAULT_ATOL), callback=_tolerance, show_default=True, metavar="FLOAT",
              help="Absolute tolerance per step.")
@click.option("--show", default="10", callback=_rows, show_default=True, metavar="N",
              help="Rows of the step table (0: no table).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON instead of the report.")
@click.option("--plot", "plot_path", metavar="FILE", help="Draw both curves and their difference (.png, .svg, .pdf).")
@click.option("--force", is_flag=True, help="Overwrite an existing --plot file.")
def command(run_a: str, run_b: str, pattern: str | None, pattern_a: str | None, pattern_b: str | None,
            rtol: float, atol: float, show: int, as_json: bool, plot_path: str | None, force: bool) -> int:
    """Compare two loss curves step by step and diagnose where training parts ways.

    \b
    Step 1 differs            -> the forward pass differs      (next: align compare)
    step 1 equal, 2 differs   -> backward or optimizer differs (next: align diff)
    later                     -> where and how the curves part
    A step passes when |A-B| <= atol + rtol*max(|A|,|B|), widened by half the last printed digit of each log
    ('loss 0.1235' -> 5e-5).

    \b
    RUN_A, RUN_B: text logs (MindSpore LossMonitor 'epoch: 1 step: 3, loss is 0.12', 'step 3 | loss 0.12',
    'loss = 0.12', or --pattern), CSV with a header, JSON or JSONL records with loss and optional step/epoch
    fields. Per-epoch step counters become global steps; a log counting from step 0 is shifted to start at 1.
    Logs of different lengths are compared on their common steps, with a warning.
    Exit status: 0 curves agree, 1 they part or a loss is NaN/inf, 2 bad input.
    """
    import json
    from pathlib import Path

    from aligner.core.atomic import check_output
    from aligner.pipelines.losses.diagnose import compare_curves, diagnose
    from aligner.pipelines.losses.parse import read_losses

    plot_file = None
    if plot_path is not None:
        from aligner.render.losses_plot import check_plot_suffix, plot_comparison

        plot_file = check_output(plot_path, force)
        check_plot_suffix(plot_file)
    # a side's own pattern must fit a text log; the shared --pattern is ignored by a CSV/JSON side
    curve_a = read_losses(run_a, pattern_a or pattern, "--pattern-a" if pattern_a else "--pattern",
                          require_text=pattern_a is not None)
    curve_b = read_losses(run_b, pattern_b or pattern, "--pattern-b" if pattern_b else "--pattern",
                          require_text=pattern_b is not None)
    if pattern is not None and "text" not in (curve_a.format, curve_b.format):
        raise AlignerError("--pattern applies to text logs, but neither RUN_A nor RUN_B is a text log")
    comparison = compare_curves(curve_a, curve_b, rtol=rtol, atol=atol)
    diagnosis = diagnose(comparison)
    if plot_file is not None:
        plot_comparison(comparison, Path(plot_file))
    for warning in diagnosis.warnings:
        click.echo(f"align: warning: {warning}", err=True)
    if as_json:
        from aligner.render.losses import to_dict

        click.echo(json.dumps(to_dict(comparison, diagnosis), indent=2))
    else:
        from rich.console import Console

        from aligner.render.losses import print_report

        print_report(Console(highlight=False, soft_wrap=True), comparison, diagnosis, show)
    return diagnosis.exit_code

