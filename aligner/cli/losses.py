"""`align losses RUN_A RUN_B`: compare two training loss curves and say where and why they part."""
from __future__ import annotations

from pathlib import Path

import click

from aligner.cli.options import check_outputs, json_option, tolerance_options, tolerance_spec
from aligner.core.errors import AlignerError
from aligner.core.tolerance import Tolerance, parse_nonnegative
from aligner.pipelines.losses import DEFAULT_TOLERANCE, compare_losses
from aligner.pipelines.losses.parse import compile_pattern
from aligner.render.console import make_console
from aligner.render.losses import print_report, print_warnings, write_report_json
from aligner.render.losses_plot import check_plot_suffix, plot_report

SHOW = 10  # rows of the step table by default (align report shows a saved report with as many)


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
        compile_pattern(value, "--" + param.name.replace("_", "-"))
    return value


def _tolerance(rtol: tuple[str, ...], atol: tuple[str, ...]) -> Tolerance:
    """--rtol/--atol together or not at all; one value each (losses have no names for GLOB:X overrides)."""
    spec = tolerance_spec(rtol, atol, symmetric=True)
    if spec.overrides:
        raise AlignerError(f"--rtol/--atol: per-name values ({spec.overrides[0][0]}:...) do not apply to losses; "
                           "give one number each")
    return spec.default or DEFAULT_TOLERANCE


@click.command(name="losses")
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--pattern", callback=_pattern, metavar="REGEX",
              help="Regex for text logs with a named group (?P<loss>...) and optional (?P<step>...), (?P<epoch>...).")
@click.option("--pattern-a", callback=_pattern, metavar="REGEX", help="Regex for RUN_A only (overrides --pattern).")
@click.option("--pattern-b", callback=_pattern, metavar="REGEX", help="Regex for RUN_B only (overrides --pattern).")
@tolerance_options
@click.option("--noise", metavar="X", help="Run-to-run noise of the loss (an absolute difference) instead of the "
              "float32 estimate; a step differs above 4x it.")
@click.option("--repeat-a", metavar="LOG", help="A second run of RUN_A's side: the noise is measured from the two.")
@click.option("--repeat-b", metavar="LOG", help="A second run of RUN_B's side (with --repeat-a, the larger noise).")
@click.option("--show", default=str(SHOW), callback=_rows, show_default=True, metavar="N",
              help="Rows of the step table (0: no table).")
@json_option
@click.option("--plot", "plot_path", metavar="FILE", help="Draw both curves and their difference (.png, .svg, .pdf).")
@click.option("--force", is_flag=True, help="Overwrite existing --json/--plot files.")
def command(run_a: str, run_b: str, pattern: str | None, pattern_a: str | None, pattern_b: str | None,
            rtol: tuple[str, ...], atol: tuple[str, ...], noise: str | None, repeat_a: str | None,
            repeat_b: str | None, show: int, json_out: str | None, plot_path: str | None, force: bool) -> int:
    """Compare two loss curves step by step and diagnose where training parts ways.

    \b
    Step 1 differs            -> the forward pass differs      (next: align compare)
    step 1 equal, 2 differs   -> backward or optimizer differs (next: align diff)
    later                     -> where and how the curves part
    A step agrees when |A-B| <= 4 x noise and <= atol + rtol*max(|A|,|B|) (default rtol=1e-4, atol=1e-6), both
    widened by half the last printed digit of the logs ('loss 0.1235' -> 5e-5). The noise is 4*eps32*|loss|
    unless --noise or --repeat-a/--repeat-b give it. When the rounding of the logs hides differences of that size,
    the verdict is 'cannot decide'.

    \b
    RUN_A, RUN_B: text logs (MindSpore LossMonitor 'epoch: 1 step: 3, loss is 0.12', 'step 3 | loss 0.12',
    'loss = 0.12', or --pattern), CSV with a header, JSON or JSONL records with loss and optional step/epoch
    fields. Per-epoch step counters become global steps; a log counting from step 0 is shifted to start at 1.
    Logs of different lengths are compared on their common steps, with a warning.
    Exit status: 0 curves agree, 1 they part, a loss is NaN/inf or the logs cannot decide, 2 bad input.
    """
    tolerance = _tolerance(rtol, atol)
    noise_value = parse_nonnegative("--noise", noise) if noise is not None else None
    if noise_value is not None and (repeat_a or repeat_b):
        raise AlignerError("give --noise or --repeat-a/--repeat-b, not both: a repeat measures the noise")
    check_outputs(force, json=json_out, plot=plot_path)
    if plot_path is not None:
        check_plot_suffix(Path(plot_path))
    report = compare_losses(run_a, run_b, tolerance=tolerance, noise=noise_value, repeat_a=repeat_a,
                            repeat_b=repeat_b, pattern=pattern, pattern_a=pattern_a, pattern_b=pattern_b)
    if plot_path is not None:
        plot_report(report, Path(plot_path))
    print_warnings(make_console(stderr=True), report)
    if json_out is not None:
        write_report_json(report, json_out)
    if json_out != "-":
        print_report(make_console(), report, show)
    return report.exit_code
