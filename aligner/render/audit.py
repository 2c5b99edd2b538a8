"""Present an audit: findings grouped by severity, one line each with its fix, then unpaired layers and a verdict."""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from rich.console import Console

from aligner.core.findings import Finding
from aligner.pipelines.audit.optimizers import OptimizerAudit
from aligner.pipelines.audit.report import AuditReport
from aligner.render.jsonout import write_json
from aligner.render.severity import SEVERITY_ORDER, SEVERITY_STYLE


def finding_line(f: Finding) -> str:
    """One line: the message, then the fix."""
    return f"{f.message}" + (f"  fix: {f.fix}" if f.fix else "")


def audit_lines(report: AuditReport) -> list[tuple[str, str | None]]:
    """(text, style) lines of the human report."""
    side = "MindSpore" if report.migrated.value == "mindspore" else "PyTorch"
    lines: list[tuple[str, str | None]] = [
        (f"audit: torch {report.torch_model} vs MindSpore {report.ms_model}; {len(report.pairs)} layer pairs; "
         f"fixes are for the {side} side", "bold")]
    if report.inputs:
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in report.inputs.items())
        lines.append((f"example inputs: {shapes}", None))
    if report.optimizer is not None:
        lines.append((optimizer_line(report.optimizer), None))
    lines += [(f"note: {n}", "dim") for n in report.notes]
    for severity in SEVERITY_ORDER:
        group = [f for f in report.findings if f.severity == severity]
        if group:
            lines.append((f"{severity.value.upper()} ({len(group)})", f"bold {SEVERITY_STYLE[severity]}"))
            lines += [(f"  {finding_line(f)}", SEVERITY_STYLE[severity]) for f in group]
    if report.accepted:
        lines.append((f"accepted by the baseline ({len(report.accepted)}): "
                      + ", ".join(sorted(Counter(f.rule for f in report.accepted))), "dim"))
    for framework in ("pytorch", "mindspore"):
        lone = [u for u in report.unpaired if u.framework.value == framework]
        if lone:
            names = ", ".join(f"{u.path} ({u.kind})" for u in lone[:12]) + \
                (f" and {len(lone) - 12} more" if len(lone) > 12 else "")
            lines.append((f"unpaired {'torch' if framework == 'pytorch' else 'MindSpore'} layers ({len(lone)}): "
                          f"{names}", "dim"))
    counts = Counter(f.severity for f in report.findings)
    verdict = ", ".join(f"{counts[s]} {s.value}{'s' if counts[s] != 1 else ''}" for s in SEVERITY_ORDER)
    lines.append((f"{'FAILED' if report.errors else 'PASSED'}: {verdict}",
                  "bold red" if report.errors else "bold green"))
    return lines


def optimizer_line(o: OptimizerAudit) -> str:
    """What the optimizer audit compared: both classes, the parameter pairs, both schedules' sources."""
    def source(name: str | None, rates: tuple[float, ...]) -> str:
        return name or ("dynamic lr" if len(set(rates)) > 1 else "constant lr")

    return (f"optimizers: {o.torch_optimizer} vs {o.ms_optimizer}; {o.paired} parameter pairs; learning rates over "
            f"{o.steps} steps (torch {source(o.torch_scheduler, o.torch_rates)}, MindSpore "
            f"{source(o.ms_scheduler, o.ms_rates)})")


def print_audit(report: AuditReport, console: Console) -> None:
    for text, style in audit_lines(report):
        console.print(text, style=style, markup=False, highlight=False)


def write_audit_json(report: AuditReport, path: str) -> None:
    write_json(report.to_dict(), path)


def source_lines(findings: Sequence[Finding], skipped: Sequence[str]) -> list[tuple[str, str | None]]:
    """The source audit's findings (file:line in `where`), one line each with its fix, then the skipped files."""
    lines: list[tuple[str, str | None]] = []
    for severity in SEVERITY_ORDER:
        lines += [(f"  {f.where[0] + ': ' if f.where and f.where[0] else ''}{f.severity.value}: {finding_line(f)}",
                   SEVERITY_STYLE[severity]) for f in findings if f.severity == severity]
    lines += [(f"skipped: {s}", "dim") for s in skipped]
    return lines


def print_source(report: Any, console: Console) -> None:
    """A SourceAuditReport (`.findings`, `.skipped`)."""
    console.print(f"source audit: {len(report.findings)} finding(s)", style="bold", markup=False)
    for text, style in source_lines(report.findings, report.skipped):
        console.print(text, style=style, markup=False, highlight=False)
