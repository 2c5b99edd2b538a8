"""Present a LossReport: a rich table and diagnosis for people, strict JSON for scripts, warnings on stderr.

Every sentence `align losses` shows is written here, from the report's evidence (its verdict, `Diagnosis`, rows and
`LossWarning`s): the terminal and the JSON's summary, advice, next_command and warnings read the same words.
"""
from __future__ import annotations

import dataclasses
import math
import shlex
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from aligner.core.text import short_number, span
from aligner.pipelines.losses import (
    NOISE_ROUNDINGS,
    Cause,
    LossCurve,
    LossReport,
    LossWarning,
    NoiseSource,
    Side,
    StepRow,
    StepStatus,
    Verdict,
    WarningKind,
)
from aligner.pipelines.losses.parse import MAX_LINE
from aligner.render.console import styled
from aligner.render.jsonout import write_json

_MARKS = {StepStatus.OK: ("ok", "green"), StepStatus.UNRESOLVED: ("unresolved", "yellow"),
          StepStatus.ABOVE_NOISE: ("differs (above noise)", "red"), StepStatus.DIFFERS: ("differs", "red")}
_NOISE_NAMES = {NoiseSource.FLOAT32: "estimated float32 noise", NoiseSource.GIVEN: "given noise (--noise)",
                NoiseSource.REPEAT: "measured run-to-run noise"}
_NOISE_RULES = {
    NoiseSource.FLOAT32: f"{NOISE_ROUNDINGS:g} * eps32 * max(|A|,|B|)",
    NoiseSource.GIVEN: "the --noise value at every step",
    NoiseSource.REPEAT: "running max of |X - repeat of X| up to the step, at least the float32 estimate",
}
_FORWARD_ADVICE = ("Before the first update both runs hold the same weights, so a different step-1 loss means the "
                   "forward computation differs (or the inputs, the initial weights or the loss function). Dump the "
                   "forward pass of step 1 on both sides and find the first layer that differs:")
_UPDATE_ADVICE = ("The forward pass matches but the first update does not: compare gradients and the optimizer "
                  "(learning rate and its schedule, weight decay, momentum/betas/eps, a parameter missing from the "
                  "optimizer or frozen on one side, gradient clipping, loss scaling). Save the weights after step 1 "
                  "on both sides and diff them; the parameters that differ point at the cause:")
_UPDATE_HEADS = {
    Cause.UPDATE: "Step 1 agrees, step 2 differs: the backward pass or the optimizer update differs.",
    Cause.UPDATE_OR_HIDDEN: "Step 1 is within the rounding of the logs, step 2 differs: the backward pass or the "
                            "optimizer update differs, or the forward pass by less than the rounding lets step 1 show.",
}
_UNDECIDED_ADVICE = ("No step differs by more than the rounding of the logs, but the rounding is larger than the "
                     "smallest difference that would be a real one, so a small bug (an approximate GELU, a LayerNorm "
                     "epsilon, a small weight decay) would look the same. Log the loss with more digits (Python's "
                     "repr of the float, or '%.8g'); if you know the noise is larger than the float32 estimate, pass "
                     "--noise or a rerun of one side with --repeat-a.")
_UNSTABLE_WHY = ("Both runs reach NaN/inf at the same step: the migration reproduces an unstable training (learning "
                 "rate, loss scaling, bad data), it does not cause it.")


@dataclasses.dataclass(frozen=True)
class ReportText:
    """A report's sentences: the diagnosis (summary, advice, the next command's line) and one line per warning."""

    summary: str
    advice: str
    next_command: str | None
    warnings: tuple[str, ...]


def report_text(report: LossReport) -> ReportText:
    """The words for a report's evidence, the same for the terminal and the JSON."""
    summary, advice = _diagnosis(report)
    command = report.diagnosis.next_command
    return ReportText(summary, advice, shlex.join(command.argv) if command else None,
                      tuple(_warning(report, warning) for warning in report.warnings))


def report_json(report: LossReport) -> dict[str, Any]:
    """`report.to_dict()` with its evidence in words: the `--json` keys summary, advice, next_command, warnings (as
    sentences) and the noise rule, where the data has its diagnosis and warnings; that data last, as `evidence`
    (what `align report` reads back)."""
    text = report_text(report)
    out: dict[str, Any] = {}
    evidence: dict[str, Any] = {}
    for key, value in report.to_dict().items():
        if key == "diagnosis":
            out.update(summary=text.summary, advice=text.advice, next_command=text.next_command)
            evidence[key] = value
        elif key == "warnings":
            out[key] = list(text.warnings)
            evidence[key] = value
        elif key == "noise":
            out[key] = {**value, "rule": _NOISE_RULES[report.noise.source]}
        else:
            out[key] = value
    out["evidence"] = evidence
    return out


def print_report(console: Console, report: LossReport, show: int) -> None:
    """Sources, bounds, the first `show` steps (plus the step where the curves part) and the diagnosis."""
    for label, curve in (("A", report.a), ("B", report.b)):
        console.print(styled((label, "bold"), f": {curve.path} ({_describe(curve)})"))
    console.print(f"tolerance: |A-B| <= atol + rtol*max(|A|,|B|), {report.tolerance}", highlight=False)
    console.print(f"noise: {_describe_noise(report)}", highlight=False)
    if show:
        console.print(_table(report, show))
    text = report_text(report)
    style = {Verdict.AGREE: "green", Verdict.UNDECIDED: "yellow"}.get(report.verdict, "red")
    console.print(text.summary, style=f"bold {style}")
    console.print(text.advice, highlight=False)
    if text.next_command:
        console.print(styled("  ", (text.next_command, "bold")), highlight=False)


def print_warnings(console: Console, report: LossReport) -> None:
    """One `align: warning:` line per warning (the console is stderr's)."""
    for warning in report_text(report).warnings:
        console.print(f"align: warning: {warning}", markup=False, highlight=False)


def write_report_json(report: LossReport, path: str) -> None:
    """The report as strict JSON to `path` ('-' for stdout); NaN/inf become 'nan', 'inf', '-inf'."""
    write_json(report_json(report), path)


def _diagnosis(report: LossReport) -> tuple[str, str]:
    """(summary, advice): one sentence on what the curves do, then why and what to look at."""
    d, rows, noise, tolerance = report.diagnosis, report.steps, report.noise, report.tolerance
    name = _NOISE_NAMES[noise.source]
    if report.verdict is Verdict.AGREE:
        worst = _row(report, d.step)
        largest = max((row.rel_diff for row in rows if not math.isnan(row.rel_diff)), default=math.nan)
        return (f"The curves agree on all {len(rows)} common steps (max relative difference {short_number(largest)}, "
                f"at most {short_number(worst.noise_ratio)}x the {name}).",
                f"Forward, backward and optimizer match to within {noise.factor:g}x the {name} and the tolerance, "
                f"{tolerance}.")
    if report.verdict is Verdict.UNSTABLE:
        why = _UNSTABLE_WHY if d.cause is Cause.NONFINITE_SAME_STEP else \
            (f"Step {d.step} lies beyond the other log's last step ({rows[-1].step}): log that run further to see "
             "whether it blows up too.")
        return (f"The curves agree where both are logged, but {_nan_note(report)}.",
                f"{why} To find the first non-finite tensor, dump step {d.step} on both sides and compare:")
    if report.verdict is Verdict.UNDECIDED:
        return _undecided_summary(report), _UNDECIDED_ADVICE
    nan_note = _nan_note(report)
    tail = f" {_evidence(report, _row(report, d.step))}" + (f" Note: {nan_note}." if nan_note else "")
    if report.verdict is Verdict.FORWARD:
        return f"Step 1 differs: the forward pass differs.{tail}", _FORWARD_ADVICE
    if report.verdict is Verdict.UPDATE:
        return f"{_UPDATE_HEADS[d.cause]}{tail}", _UPDATE_ADVICE
    first, before = rows[0].step, d.before if d.before is not None else d.step - 1
    agreed = f"Steps {first}-{before} agree" if before > first else f"Step {first} agrees"
    if d.step == first:
        agreed = f"The first common step ({first}) already differs"
    return f"{agreed}; the curves part at step {d.step}.{tail}", _later_advice(report, before)


def _evidence(report: LossReport, row: StepRow) -> str:
    """'The difference at step 1 is 1.2e-05, 47x the estimated float32 noise of 2.6e-07: likely a real ...'."""
    if not (math.isfinite(row.a) and math.isfinite(row.b)):
        return ""
    ratio = f"{short_number(row.noise_ratio)}x the {_NOISE_NAMES[report.noise.source]} of {short_number(row.noise)}"
    if row.status is StepStatus.ABOVE_NOISE:
        return (f"The difference at step {row.step} is {short_number(row.abs_diff)}, {ratio}: likely a real "
                f"difference, although within the tolerance, {report.tolerance}.")
    return (f"The difference at step {row.step} is {short_number(row.abs_diff)} ({short_number(row.rel_diff)} "
            f"relative, {ratio}), beyond the tolerance, {report.tolerance}.")


def _undecided_summary(report: LossReport) -> str:
    """'Cannot decide: B prints 4 decimals, so differences below 5e-05 are invisible ...'."""
    noise, rows = report.noise, report.steps
    coarse = [f"{label} prints losses rounded to {short_number(c.resolution)}"
              for label, c in (("A", report.a), ("B", report.b)) if c.resolution > 0]
    row = _row(report, report.diagnosis.step)
    rounding = row.noise_bound - noise.factor * row.noise
    hidden = sum(r.status is StepStatus.UNRESOLVED for r in rows)
    where = "every common step" if hidden == len(rows) else f"{hidden} of {len(rows)} common steps"
    return (f"Cannot decide: {' and '.join(coarse)}, so differences below {short_number(rounding)} are invisible, "
            f"while a real difference can be as small as {short_number(noise.factor * row.noise)} ({noise.factor:g}x "
            f"the {_NOISE_NAMES[noise.source]} of {short_number(row.noise)} at step {row.step}); this holds at "
            f"{where}.")


def _later_advice(report: LossReport, before: int) -> str:
    """Explain a divergence after step 2: drift, a jump at an epoch boundary, or a jump elsewhere."""
    d, first = report.diagnosis, report.steps[0].step
    row, k = _row(report, d.step), d.step
    parts = []
    if first > 1:
        parts.append(f"The logs start at step {first}, so the step-1/step-2 test cannot be made: log the loss of "
                     "every step from step 1 to tell a forward difference from an update difference.")
    if d.cause is Cause.NONFINITE:
        parts.append(f"The curves part because one loss becomes NaN/inf at step {k}: usual causes are an overflow "
                     "(float16, loss scaling) or log/exp/division of 0 on that side. Dump step "
                     f"{k} on both sides and find the first non-finite tensor:")
        return " ".join(parts)
    if d.cause is Cause.EPOCH_START:
        parts.append(f"Step {k} starts a new epoch: compare the data order (shuffling, sampler seed) and per-epoch "
                     "learning-rate schedules.")
    elif d.cause is Cause.DRIFT:
        parts.append(f"The difference is just over the bound ({short_number(row.rel_diff)} relative): rounding "
                     f"differences accumulated over {k - 1} updates can look like this, and the "
                     f"{_NOISE_NAMES[report.noise.source]} does not model how noise grows through training; measure "
                     "it with a rerun of one side (--repeat-a) or give --noise, and if the curves stay close "
                     "afterwards, a looser bound may be right.")
    else:
        parts.append(f"The difference jumps at step {k} ({short_number(row.rel_diff)} relative): something changes "
                     "at that step on one side (learning-rate schedule or warmup end, data, loss scaling, a layer "
                     "frozen or unfrozen).")
    parts.append(f"Save the weights after step {before} on both sides and diff them:")
    return " ".join(parts)


def _nan_note(report: LossReport) -> str:
    """Say where each side's loss first becomes NaN/inf, or '' when neither does."""
    first_a, first_b = report.first_nan_a, report.first_nan_b
    notes = [f"{label}'s loss is first NaN/inf at step {step}"
             for label, step in (("A", first_a), ("B", first_b)) if step is not None]
    if notes and (first_a is None or first_b is None):
        notes.append(f"{'B' if first_b is None else 'A'}'s loss stays finite")
    return ", ".join(notes)


def _warning(report: LossReport, warning: LossWarning) -> str:
    """One warning's line (without the `align: warning:` prefix)."""
    label = warning.side.value if warning.side else ""
    curve = report.a if warning.side is Side.A else report.b
    if warning.kind is WarningKind.LONG_LINES:
        return (f"{label} ({curve.path}): skipped {curve.long_lines} line(s) longer than {MAX_LINE} characters "
                f"(first: line {curve.first_long_line}); no log line is that long")
    if warning.kind is WarningKind.LENGTHS_DIFFER:
        a, b = report.a.steps, report.b.steps
        return (f"A has {len(a)} losses (steps {span(a)}), B has {len(b)} (steps {span(b)}): compared only the "
                f"{len(report.steps)} common steps")
    if warning.kind is WarningKind.COARSE_PRINT:
        return (f"{label} prints losses rounded to {short_number(curve.resolution)}: differences below "
                f"{short_number(curve.resolution / 2)} cannot be seen (the bounds are widened by that); log more "
                "digits")
    return (f"the repeat of {label} ({warning.repeat}) is identical to {label} on every common step: a deterministic "
            "rerun measures no noise, so the float32 estimate is used (a rerun with another thread count, device or "
            "kernel choice measures it)")


def _row(report: LossReport, step: int) -> StepRow:
    """The common step `step`'s row."""
    return next(row for row in report.steps if row.step == step)


def _describe_noise(report: LossReport) -> str:
    """One line: where sigma comes from and the bound it sets at the first step."""
    noise, first = report.noise, report.steps[0]
    if noise.source is NoiseSource.GIVEN:
        source = f"given noise sigma = {noise.given:g}"
    elif noise.source is NoiseSource.REPEAT:
        source = "noise sigma measured from " + ", ".join(noise.repeats)
    else:
        source = f"estimated float32 noise sigma = {_NOISE_RULES[noise.source]}"
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
                      short_number(row.noise_ratio), Text(*_MARKS[row.status]))
    return table


def _describe(curve: LossCurve) -> str:
    """'text, 40 losses, pattern MindSpore LossMonitor ...' for the header line."""
    parts = [curve.format, f"{len(curve.losses)} losses"]
    if curve.pattern_name:
        parts.append(f"pattern {curve.pattern_name}")
    if curve.resolution:
        parts.append(f"printed to {curve.resolution:g}")
    return ", ".join(parts)
