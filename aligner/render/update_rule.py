"""Present the update step explained: each side's fitted rule per parameter group, then the terms that differ."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from aligner.pipelines.diff import SideFit, UpdateReport
from aligner.pipelines.diff.checkpoints import DiffResult
from aligner.pipelines.diff.side import ClipKind
from aligner.render.jsonout import write_json
from aligner.render.words import say


def _side_name(side: SideFit) -> str:
    return f"{side.label} ({side.framework})" if side.framework else side.label


def rules_table(report: UpdateReport) -> Table:
    """One row per side and parameter group: the rule it applied and which parameters follow it."""
    steps = report.a.steps
    source = "per-step values" if report.a.trajectory and report.b.trajectory else "weights at init and after"
    table = Table(title=f"Update rules fitted over {steps} steps ({source} + dumped gradients)", title_justify="left")
    for col in ("side", "rule", "parameters"):
        table.add_column(col)
    for side in (report.a, report.b):
        for group in side.groups:
            table.add_row(_side_name(side), group.rule.describe(), group.description)
        for fit in side.unfitted:
            table.add_row(_side_name(side), Text("no rule fits", style="red"), fit.name)
    return table


def _side_notes(side: SideFit) -> list[str]:
    notes = []
    if side.clipping.kind is not ClipKind.NONE:
        norm = "unknown" if side.clipping.max_norm is None else f"{side.clipping.max_norm:.3g}"
        notes.append(f"{_side_name(side)}: gradients clipped by global norm (max_norm {norm}"
                     f"{', assumed' if side.clipping.assumed else ''}).")
    if side.grad_scale != 1.0:
        notes.append(f"{_side_name(side)}: dumped gradients divided by the loss scale {side.grad_scale:g} before "
                     f"fitting.")
    if side.still:
        notes.append(f"{_side_name(side)}: {len(side.still)} parameter(s) did not move (frozen): "
                     f"{', '.join(side.still[:6])}.")
    if side.too_small:
        notes.append(f"{_side_name(side)}: {len(side.too_small)} parameter(s) moved too little above float32 rounding "
                     f"to resolve their rule: {', '.join(side.too_small[:6])}.")
    return notes


def finding_lines(report: UpdateReport) -> list[str]:
    """One line per finding (with its fix), then the verdict."""
    lines = []
    for f in report.findings:
        lines.append(f"{f.severity.value}: {say(f.message)}." + (f" Fix: {say(f.fix)}." if f.fix else ""))
    if not report.differences:
        lines.append(f"The two sides apply the same update rule on all {len(report.pairs)} paired parameters.")
    return lines


def print_update_report(report: UpdateReport, console: Console) -> None:
    """The rules table, side notes and findings."""
    console.print(rules_table(report))
    for line in _side_notes(report.a) + _side_notes(report.b) + finding_lines(report):
        style = "red" if line.startswith("error") else "yellow" if line.startswith("warning") else None
        console.print(line, style=style, soft_wrap=True)


def write_update_json(diff: DiffResult, report: UpdateReport, path: str) -> None:
    """The diff's JSON with the update report under "update_rule", to `path` or stdout for '-'."""
    data: dict[str, Any] = {**diff.to_dict(), "update_rule": report.to_dict()}
    write_json(data, path)
