"""Present a LossReport: a rich table and diagnosis for people, strict JSON for scripts, warnings on stderr."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from aligner.pipelines.losses import LossCurve, LossReport, NoiseSource, StepStatus, Verdict
from aligner.render.console import styled
from aligner.render.jsonout import write_json

_MARKS = {StepStatus.OK: ("ok", "green"), StepStatus.UNRESOLVED: ("unresolved", "yellow"),
          StepStatus.ABOVE_NOISE: ("differs (above noise)", "red"), StepStatus.DIFFERS: ("differs", "red")}


def print_report(console: Console, report: LossReport, show: int) -> None:
    """Sources, bounds, the first `show` steps (plus the step where the curves part) and the diagnosis."""
    for label, curve in (("A", report.a), ("B", report.b)):
        console.print(styled((label, "bold"), f": {curve.path} ({_describe(curve)})"))
    console.print(f"tolerance: |A-B| <= atol + rtol*max(|A|,|B|), {report.tolerance}", highlight=False)
    console.print(f"noise: {_describe_noise(report)}", highlight=False)
    if show:
        console.print(_table(report, show))
    style = {Verdict.AGREE: "green", Verdict.UNDECIDED: "yellow"}.get(report.verdict, "red")
    console.print(report.summary, style=f"bold {style}")
    console.print(report.advice, highlight=False)
    if report.next_command:
        console.print(styled("  ", (report.next_command, "bold")), highlight=False)


def print_warnings(console: Console, report: LossReport) -> None:
    """One `align: warning:` line per warning (the console is stderr's)."""
    for warning in report.warnings:
        console.print(f"align: warning: {warning}", markup=False, highlight=False)


def write_report_json(report: LossReport, path: str) -> None:
    """The report as strict JSON to `path` ('-' for stdout); NaN/inf become 'nan', 'inf', '-inf'."""
    write_json(report.to_dict(), path)


def _describe_noise(report: LossReport) -> str:
    """One line: where sigma comes from and the bound it sets at the first step."""
    noise, first = report.noise, report.steps[0]
    if noise.source is NoiseSource.GIVEN:
        source = f"given noise sigma = {noise.given:g}"
    elif noise.source is NoiseSource.REPEAT:
        source = "noise sigma measured from " + ", ".join(noise.repeats)
    else:
        source = f"estimated float32 noise sigma = {noise.to_dict()['rule']}"
    return (f"{source}; a step differs above {noise.factor:g} sigma + half the print rounding "
            f"(step {first.step}: sigma {first.noise:.2g}, bound {first.noise_bound:.2g})")


def _table(report: LossReport, show: int) -> Table:
    """The first `show` common steps; the first parting step is appended when it lies beyond them."""
    table = Table(box=None, header_style="bold")
    for name in ("step", "A", "B", "|A-B|", "rel", "x noise", ""):
        table.add_column(name, justify="right" if name else "left")
    rows = list(range(min(show, len(report.steps))))
    part = next((i for i, row in enumerate(report.steps) if row.step == report.first_part), None)
    if part is not None and part >= len(rows):
        rows += [-1, part]  # -1: an ellipsis row
    for i in rows:
        if i < 0:
            table.add_row("...", "", "", "", "", "", "")
            continue
        row = report.steps[i]
        table.add_row(str(row.step), f"{row.a:.8g}", f"{row.b:.8g}", f"{row.abs_diff:.2e}", f"{row.rel_diff:.2e}",
                      f"{row.noise_ratio:.3g}", Text(*_MARKS[row.status]))
    return table


def _describe(curve: LossCurve) -> str:
    """'text, 40 losses, pattern MindSpore LossMonitor ...' for the header line."""
    parts = [curve.format, f"{len(curve.losses)} losses"]
    if curve.pattern_name:
        parts.append(f"pattern {curve.pattern_name}")
    if curve.resolution:
        parts.append(f"printed to {curve.resolution:g}")
    return ", ".join(parts)
