"""Present `align check` of a multi-rank dump: one row per rank, the cross-rank findings, the verdict, JSON."""
from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.table import Table

from aligner.core.errors import ExitCode
from aligner.core.findings import Severity
from aligner.pipelines.check.ranks import RankedCheckReport
from aligner.render.check import verdict_line
from aligner.render.jsonout import dumps
from aligner.render.severity import SEVERITY_ORDER, SEVERITY_STYLE
from aligner.render.words import say


def ranks_verdict(report: RankedCheckReport) -> str:
    """The last line: cross-rank errors, ranks with errors of their own, missing and unreadable ranks."""
    cross = sum(f.severity is Severity.ERROR for f in report.findings)
    own = [r for r, rep in report.ranks.items() if rep.errors]
    head = {ExitCode.FOUND: "FAILED", ExitCode.USAGE: "INCOMPLETE", ExitCode.OK: "NO ERRORS"}[report.exit_code]
    parts = [f"{cross} cross-rank error(s)", f"ranks with errors of their own: {', '.join(map(str, own)) or 'none'}"]
    if report.missing:
        parts.append(f"missing rank(s) {', '.join(map(str, report.missing))}")
    if report.unreadable:
        parts.append(f"unreadable rank(s) {', '.join(map(str, report.unreadable))}")
    ev = report.evaluation
    return f"{head}: {'; '.join(parts)}; {len(ev.checked)} cross-rank rules checked, {len(ev.skipped)} skipped"


def print_check_ranks(report: RankedCheckReport, console: Console) -> None:
    """Header, the rank table, the cross-rank findings, skipped rules and notes, verdict."""
    groups = " ".join(str(g) for g in report.dp_groups)
    console.print(f"check: {report.directory} ({report.world_size} ranks; data-parallel groups {groups}"
                  f"{'' if report.dp_named else ', the whole world: no header names them'})", style="bold",
                  markup=False, highlight=False)
    table = Table(title="per rank", title_justify="left", header_style="bold")
    for col in ("rank", "own check", "first error"):
        table.add_column(col, overflow="fold")
    for rank in range(report.world_size):
        if rank in report.missing:
            table.add_row(str(rank), "MISSING: no folder, the rank did not dump (a failed run)", "-", style="yellow")
        elif rank in report.unreadable:
            table.add_row(str(rank), f"not read: {report.unreadable[rank]}", "-", style="yellow")
        else:
            own = report.ranks[rank]
            first = own.errors[0] if own.errors else None
            table.add_row(str(rank), verdict_line(own), "-" if first is None else f"{first.rule}: {say(first.message)}",
                          style="red" if first else "")
    console.print(table)
    for severity in SEVERITY_ORDER:
        group = [f for f in report.findings if f.severity == severity]
        if not group:
            continue
        found = Table(title=f"across ranks: {severity.value.upper()} ({len(group)})", title_justify="left",
                      title_style=f"bold {SEVERITY_STYLE[severity]}")
        for col in ("rule", "where", "step", "finding", "next thing to try"):
            found.add_column(col, overflow="fold")
        for f in group:
            found.add_row(f.rule, f.where[0] if f.where and f.where[0] else "-", "-" if f.step is None else str(f.step),
                          say(f.message), say(f.fix), style=SEVERITY_STYLE[severity])
        console.print(found)
    for rule, why in report.evaluation.skipped.items():
        console.print(f"skipped {rule}: {why}", style="dim", markup=False, highlight=False)
    for note in report.evaluation.notes:
        console.print(f"note: {note}", style="dim", markup=False, highlight=False)
    style = {ExitCode.FOUND: "bold red", ExitCode.USAGE: "bold yellow", ExitCode.OK: "bold green"}
    console.print(ranks_verdict(report), style=style[report.exit_code], markup=False, highlight=False)


def write_check_ranks_json(report: RankedCheckReport, fh: IO[str]) -> None:
    fh.write(dumps(report.to_dict() | {"verdict": ranks_verdict(report)}) + "\n")
