"""Present `align data`: each finding's sentence and fix from its rule's templates (mappings/data_rules.yaml) filled
with its evidence, per-field agreement, the first differing sample; as terminal tables, JSON and a static HTML page.
Names and values read from the dumps are data: rich Text on the terminal, escaped in HTML."""
from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from aligner.core.findings import Severity
from aligner.pipelines.data import DataCheckResult, DataCompareResult, DataFinding
from aligner.render.htmltext import page_text as _e
from aligner.render.jsonout import dumps
from aligner.render.severity import SEVERITY_ORDER, SEVERITY_STYLE


def finding_text(finding: DataFinding) -> tuple[str, str]:
    """The sentence and the fix of a finding: its rule's templates filled with its evidence (and its field)."""
    values: dict[str, Any] = {"field": finding.field or "", **finding.evidence}
    text = finding.text
    return text.says.format(**values), text.fix.format(**values)


def _sorted(findings: tuple[DataFinding, ...]) -> list[DataFinding]:
    return sorted(findings, key=lambda f: SEVERITY_ORDER.index(f.severity))


def _findings_table(findings: list[DataFinding], title: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for col in ("severity", "rule", "checklist", "finding", "fix"):
        table.add_column(col, overflow="fold")
    for f in findings:
        says, fix = finding_text(f)
        table.add_row(f.severity.value, f.rule.value, f.text.checklist, Text(says), Text(fix),
                      style=SEVERITY_STYLE[f.severity])
    return table


def _verdict(findings: tuple[DataFinding, ...], passed: bool) -> tuple[str, str]:
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITY_ORDER}
    head = "PASSED" if passed else "FAILED"
    return (f"{head}: {counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), "
            f"{counts[Severity.INFO]} info"), "bold green" if passed else "bold red"


def print_data_compare(result: DataCompareResult, console: Console) -> None:
    """The terminal report of two data dumps compared."""
    console.print(Text(f"data: {result.a} ({result.framework_a}, {result.samples_a} samples recorded) vs {result.b} "
                       f"({result.framework_b}, {result.samples_b} samples recorded)", style="bold"))
    _print_compare_body(result, console)
    for rank, sub in result.ranks:
        console.print(Text(f"rank {rank}:", style="bold"))
        _print_compare_body(sub, console)
    line, style = _verdict(result.all_findings, result.passed)
    console.print(Text(line, style=style))


def _print_compare_body(result: DataCompareResult, console: Console) -> None:
    if result.fields:
        console.print(Text(f"paired by {result.pairing.value}: {result.identical} samples identical in every field"))
        table = Table(title="fields", title_justify="left")
        for col in ("field", "kind", "identical", "median PSNR (dB)", "max error / range"):
            table.add_column(col, overflow="fold")
        for f in result.fields:
            kind = f.kind_a if f.kind_a == f.kind_b else f"{f.kind_a} / {f.kind_b}"
            table.add_row(Text(f.name), kind, f"{f.same}/{f.paired}", "-" if f.psnr is None else f"{f.psnr:.1f}",
                          "-" if f.max_error is None else f"{f.max_error:.3g}")
        console.print(table)
    if result.first_difference is not None:
        d = result.first_difference
        console.print(Text(f"first difference: field {d.field!r}, side A sample {d.a.index} (epoch {d.a.epoch} "
                           f"batch {d.a.batch} row {d.a.row}), side B sample {d.b.index} (epoch {d.b.epoch} batch "
                           f"{d.b.batch} row {d.b.row})"))
    if result.findings:
        console.print(_findings_table(_sorted(result.findings), f"findings ({len(result.findings)})"))


def print_data_check(result: DataCheckResult, console: Console) -> None:
    """The terminal report of one data dump checked."""
    console.print(Text(f"data check: {result.directory} ({result.framework}, {result.samples} samples)",
                       style="bold"))
    _print_check_body(result, console)
    for rank, sub in result.ranks:
        console.print(Text(f"rank {rank}:", style="bold"))
        _print_check_body(sub, console)
    line, style = _verdict(result.all_findings, result.passed)
    console.print(Text(line, style=style))


def _print_check_body(result: DataCheckResult, console: Console) -> None:
    for f in result.fields:
        shown = ", ".join(f"{c}: {n}" for c, n in f.histogram[:12]) + (" ..." if len(f.histogram) > 12 else "")
        console.print(Text(f"  {f.name} ({f.kind})" + (f": classes {shown}" if shown else "")))
    if result.findings:
        console.print(_findings_table(_sorted(result.findings), f"findings ({len(result.findings)})"))


def _with_text(data: dict[str, Any], findings: tuple[DataFinding, ...]) -> dict[str, Any]:
    """A result's dict with each finding's sentence and fix added (JSON readers need no templates)."""
    for entry, f in zip(data["findings"], findings):
        entry["says"], entry["fix"] = finding_text(f)
    return data


def _compare_dict(result: DataCompareResult) -> dict[str, Any]:
    data = _with_text(result.to_dict(), result.findings)
    data["ranks"] = {str(r): _compare_dict(sub) for r, sub in result.ranks}
    return data


def _check_dict(result: DataCheckResult) -> dict[str, Any]:
    data = _with_text(result.to_dict(), result.findings)
    data["ranks"] = {str(r): _check_dict(sub) for r, sub in result.ranks}
    return data


def write_data_json(result: DataCompareResult | DataCheckResult, fh: IO[str]) -> None:
    """The result as JSON, findings with their sentences."""
    data = _compare_dict(result) if isinstance(result, DataCompareResult) else _check_dict(result)
    fh.write(dumps(data) + "\n")


_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
          "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
          ".error{color:#b71c1c}.warning{color:#e65100}.info{color:#555}")


def _html_findings(findings: tuple[DataFinding, ...]) -> str:
    if not findings:
        return "<p>No finding.</p>"
    rows = []
    for f in _sorted(findings):
        says, fix = finding_text(f)
        rows.append(f"<tr class='{f.severity.value}'><td>{f.severity.value}</td><td>{_e(f.rule.value)}</td>"
                    f"<td>{_e(f.text.checklist)}</td><td>{_e(says)}</td><td>{_e(fix)}</td></tr>")
    return ("<table><tr><th>severity</th><th>rule</th><th>checklist</th><th>finding</th><th>fix</th></tr>"
            + "".join(rows) + "</table>")


def write_data_html(result: DataCompareResult | DataCheckResult, fh: IO[str]) -> None:
    """A static page (no script) with the findings and, for a comparison, the per-field agreement."""
    if isinstance(result, DataCompareResult):
        title = f"align data: {result.a} vs {result.b}"
        parts = [f"<p>{_e(result.framework_a)}, {result.samples_a} samples against {_e(result.framework_b)}, "
                 f"{result.samples_b} samples; paired by {result.pairing.value}.</p>"]
        for label, sub in [("", result)] + [(f"rank {r}", s) for r, s in result.ranks]:
            if label:
                parts.append(f"<h2>{_e(label)}</h2>")
            if sub.fields:
                parts.append("<table><tr><th>field</th><th>kind</th><th>identical</th><th>median PSNR (dB)</th>"
                             "<th>max error / range</th></tr>" + "".join(
                                 f"<tr><td>{_e(f.name)}</td><td>{_e(f.kind_a)} / {_e(f.kind_b)}</td>"
                                 f"<td>{f.same}/{f.paired}</td><td>{'-' if f.psnr is None else f'{f.psnr:.1f}'}</td>"
                                 f"<td>{'-' if f.max_error is None else f'{f.max_error:.3g}'}</td></tr>"
                                 for f in sub.fields) + "</table>")
            parts.append(_html_findings(sub.findings))
    else:
        title = f"align data check: {result.directory}"
        parts = []
        for label, checked in [("", result)] + [(f"rank {r}", s) for r, s in result.ranks]:
            if label:
                parts.append(f"<h2>{_e(label)}</h2>")
            parts.append(_html_findings(checked.findings))
    line, _ = _verdict(result.all_findings, result.passed)
    fh.write(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{_STYLE}</style>"
             f"</head><body><h1>{_e(title)}</h1>{''.join(parts)}<p><b>{_e(line)}</b></p></body></html>\n")
