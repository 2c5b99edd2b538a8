"""Present an audit: findings grouped by severity, one line each with its fix, then unpaired layers and a verdict."""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from rich.console import Console

from aligner.core.findings import Finding
from aligner.core.words import Text
from aligner.pipelines.audit.optimizers import OptimizerAudit
from aligner.pipelines.audit.report import AuditReport, FindingGroup
from aligner.render.jsonout import write_json
from aligner.render.severity import SEVERITY_ORDER, SEVERITY_STYLE
from aligner.render.words import say


def finding_line(f: Finding) -> str:
    """One line: the message, then the fix."""
    return say(f.message) + (f"  fix: {say(f.fix)}" if f.fix else "")


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
    lines += [(f"note: {say(n)}", "dim") for n in report.notes]
    for severity in SEVERITY_ORDER:
        count = sum(1 for f in report.findings if f.severity == severity)
        if count:
            lines.append((f"{severity.value.upper()} ({count})", f"bold {SEVERITY_STYLE[severity]}"))
            lines += [(f"  {group_line(g)}", SEVERITY_STYLE[severity]) for g in _groups(report)
                      if g.severity == severity]
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
    if report.not_audited:
        lines.append((f"NOT AUDITED ({len(report.not_audited)}): layers of kinds the rules cover that nothing "
                      "checked", "bold red"))
        lines += [(f"  {n.torch_path or '-'} / {n.ms_path or '-'} ({n.kind}, {n.class_name}): {say(n.why)}", "red")
                  for n in report.not_audited]
    counts = Counter(f.severity for f in report.findings)
    verdict = ", ".join(f"{counts[s]} {s.value}{'s' if counts[s] != 1 else ''}" for s in SEVERITY_ORDER)
    verdict += f", {len(report.not_audited)} layer{'s' if len(report.not_audited) != 1 else ''} not audited"
    word = "FAILED" if report.errors else "INCOMPLETE (not a pass)" if report.not_audited else "PASSED"
    lines.append((f"{word}: {verdict}", "bold green" if word == "PASSED" else "bold red"))
    return lines


def _groups(report: AuditReport) -> tuple[FindingGroup, ...]:
    """The report's groups; a report read back from an older JSON has none: one group per finding then."""
    if report.groups or not report.findings:
        return report.groups
    return tuple(FindingGroup(f.rule, f.severity, f.message, f.fix, ()) for f in report.findings)


def group_line(g: FindingGroup) -> str:
    """One line: the finding (alone) or what the group shares and every place, then the fix."""
    if len(g.where) > 1:
        text = f"{say(g.text)} [{len(g.where)} places: {', '.join(g.where)}]"
    else:
        text = say(g.text)
    return text + (f"  fix: {say(g.fix)}" if g.fix else "")


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


def source_lines(findings: Sequence[Finding], skipped: Sequence[Text]) -> list[tuple[str, str | None]]:
    """The source audit's findings (file:line in `where`), one line each with its fix, then the skipped files."""
    lines: list[tuple[str, str | None]] = []
    for severity in SEVERITY_ORDER:
        lines += [(f"  {f.where[0] + ': ' if f.where and f.where[0] else ''}{f.severity.value}: {finding_line(f)}",
                   SEVERITY_STYLE[severity]) for f in findings if f.severity == severity]
    lines += [(f"skipped: {say(s)}", "dim") for s in skipped]
    return lines


def assumed_lines(assumed: Sequence[tuple[str, Text]]) -> list[tuple[str, str | None]]:
    """What the scan took the torch reference to be, one line per assumption with every call that relies on it."""
    places: dict[str, list[str]] = {}
    for where, text in assumed:
        places.setdefault(say(text), []).append(where)
    return [(f"assumed ({len(w)} call{'s' if len(w) != 1 else ''}): {text}: {', '.join(w)}", "dim")
            for text, w in places.items()]


def print_source(report: Any, console: Console) -> None:
    """A SourceAuditReport (`.findings`, `.skipped`)."""
    console.print(f"source audit: {len(report.findings)} finding(s)", style="bold", markup=False)
    for text, style in source_lines(report.findings, report.skipped) + assumed_lines(report.assumed):
        console.print(text, style=style, markup=False, highlight=False)
