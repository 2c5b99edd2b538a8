"""Present `align check`: findings grouped by severity (rich), the skipped rules with their reasons, JSON, and an HTML
page with per-layer gradient-norm and update-ratio charts over steps (plotly inlined: works offline)."""
from __future__ import annotations

import math
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from aligner.core.findings import Severity
from aligner.pipelines.check import CheckReport, Verdict
from aligner.render.htmltext import page_text as _e
from aligner.render.htmltext import plotly_text
from aligner.render.jsonout import write_nested
from aligner.render.plotlyjs import plotly_loader
from aligner.render.severity import SEVERITY_ORDER, SEVERITY_STYLE
from aligner.render.words import say


def verdict_line(report: CheckReport) -> str:
    """The last line: the verdict, counts, and how many rules were checked and skipped."""
    counts = {s: sum(f.severity == s for f in report.findings) for s in SEVERITY_ORDER}
    ran = f"{len(report.evaluation.checked)} rules checked, {len(report.skipped)} skipped"
    head = {Verdict.ERRORS: "FAILED", Verdict.WARNINGS: "WARNINGS", Verdict.CLEAN: "NO FINDINGS"}[report.verdict]
    tail = "" if report.verdict != Verdict.CLEAN else " (from the rules checked; skipped rules are not known healthy)"
    return (f"{head}: {counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), "
            f"{counts[Severity.INFO]} info; {ran}{tail}")


def print_check(report: CheckReport, console: Console) -> None:
    """The terminal report: header, one table per severity, skipped rules, notes, verdict."""
    steps = report.evaluation.steps
    span = f"steps {steps[0]}..{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}" if steps else "no steps"
    console.print(f"check: {report.directory} ({report.framework}, {report.mode} dump, {report.records} records, "
                  f"{span})", style="bold", markup=False, highlight=False)
    for severity in SEVERITY_ORDER:
        group = [f for f in report.findings if f.severity == severity]
        if not group:
            continue
        table = Table(title=f"{severity.value.upper()} ({len(group)})", title_style=f"bold {SEVERITY_STYLE[severity]}",
                      title_justify="left", show_lines=False)
        for col in ("rule", "where", "step", "finding", "next thing to try"):
            table.add_column(col, overflow="fold")
        for f in group:
            table.add_row(f.rule, f.where[0] if f.where and f.where[0] else "-", "-" if f.step is None else str(f.step),
                          say(f.message), say(f.fix), style=SEVERITY_STYLE[severity])
        console.print(table)
    for rule, why in report.skipped.items():
        console.print(f"skipped {rule}: {why}", style="dim", markup=False, highlight=False)
    for note in report.evaluation.notes + [f"unparsable manifest line: {p}" for p in report.problems[:5]]:
        console.print(f"note: {note}", style="dim", markup=False, highlight=False)
    style = {Verdict.ERRORS: "bold red", Verdict.WARNINGS: "bold yellow", Verdict.CLEAN: "bold green"}
    console.print(verdict_line(report), style=style[report.verdict], markup=False, highlight=False)


def write_check_json(report: CheckReport, fh: IO[str]) -> None:
    """The report as JSON (`dumps(report.to_dict())`), written a finding and a series' layer at a time."""
    write_nested(fh, report.to_dict(), {"findings": 1, "series": 2})
    fh.write("\n")


def _series_figure(series: dict[str, dict[int, float]], title: str, ytitle: str,
                   band: tuple[float, float] | None = None) -> dict[str, Any]:
    """A plotly figure (plain dict): one log-scale line per layer over steps; non-finite and zero points left out.
    The layer's name is plotly text, escaped, and reaches the hover as point text, never inside the template (where
    a name holding %{...} would be read as a field)."""
    data = []
    for name, points in series.items():
        xs = [s for s, v in sorted(points.items()) if math.isfinite(v) and v > 0]
        label = plotly_text(name)
        data.append({"type": "scatter", "mode": "lines+markers", "name": label, "x": xs,
                     "y": [points[s] for s in xs], "text": [label] * len(xs),
                     "hovertemplate": "%{text}<br>step %{x}: %{y:.3g}<extra></extra>"})
    shapes = []
    if band is not None:
        shapes = [{"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": band[0], "y1": band[1],
                   "fillcolor": "rgba(46,125,50,0.08)", "line": {"width": 0}}]
    layout = {"title": {"text": title}, "xaxis": {"title": {"text": "step"}, "dtick": 1},
              "yaxis": {"title": {"text": ytitle}, "type": "log"}, "shapes": shapes,
              "legend": {"orientation": "h", "y": -0.2}, "margin": {"t": 50}}
    return {"data": data, "layout": layout}


def write_check_html(report: CheckReport, fh: IO[str]) -> None:
    """A standalone page: verdict, findings, skipped rules, and the gradient-norm / update-ratio / loss charts."""
    import plotly.io  # lazily: only --html needs plotly

    ev = report.evaluation
    bad = report.verdict == Verdict.ERRORS
    cls = "bad" if bad else "warn" if report.verdict == Verdict.WARNINGS else "good"
    fh.write('<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>align check</title><style>'
             "body{font-family:system-ui,sans-serif;margin:0;color:#222}main{max-width:1400px;margin:0 auto;"
             "padding:1.2em 1.5em 3em}header{border-left:10px solid #999;background:#f6f6f6;padding:1em 1.4em}"
             "header.bad{border-color:#c62828;background:#fdecea}header.warn{border-color:#ef6c00;background:#fff4e5}"
             "header.good{border-color:#2e7d32;background:#edf7ed}table{border-collapse:collapse;font-size:13px;"
             "width:100%}td,th{border:1px solid #ddd;padding:3px 6px;vertical-align:top}th{background:#eee}"
             "tr.error{color:#b00}tr.warning{color:#8a5300}tr.info{color:#666}.note{color:#555;font-size:.9em}"
             "td.name{white-space:nowrap}"
             "</style></head><body><main>\n")
    fh.write(f'<header class="{cls}"><h1>align check</h1><p>{_e(report.directory)}: {_e(report.framework)}, '
             f"{_e(report.mode)} dump, steps {_e(', '.join(map(str, ev.steps)))}</p>"
             f"<p><b>{_e(verdict_line(report))}</b></p></header>\n")
    fh.write('<section id="findings"><h2>Findings</h2><table><tr><th>severity</th><th>rule</th><th>where</th>'
             "<th>step</th><th>finding</th><th>next thing to try</th></tr>")
    for f in report.findings:
        fh.write(f'<tr class="{f.severity.value}"><td>{f.severity.value}</td><td class="name">{_e(f.rule)}</td>'
                 f"<td>{_e(f.where[0] if f.where and f.where[0] else '-')}</td>"
                 f"<td>{'-' if f.step is None else f.step}</td><td>{_e(say(f.message))}</td>"
                 f"<td>{_e(say(f.fix))}</td></tr>")
    if not report.findings:
        fh.write('<tr><td colspan="6">No findings from the rules checked (the skipped rules below were not checked).'
                 "</td></tr>")
    fh.write("</table>")
    if report.skipped:
        fh.write("<h3>Skipped rules (not checked)</h3><ul>" + "".join(
            f"<li><b>{_e(r)}</b>: {_e(w)}</li>" for r, w in report.skipped.items()) + "</ul>")
    fh.write("".join(f'<p class="note">{_e(n)}</p>' for n in ev.notes) + "</section>\n")
    low = report.thresholds.get("update-ratio", {}).get("low", 1e-5)
    high = report.thresholds.get("update-ratio", {}).get("high", 1e-1)
    charts = [("grad-norms", _series_figure(ev.grad_norms, "Weight gradient norm per layer", "||grad||"))]
    ratio_title = "Update ratio ||w(t+1) - w(t)|| / ||w(t)|| per layer (green band: healthy)" + (
        "" if ev.exact_updates else " — lower bounds from statistics")
    charts.append(("update-ratios", _series_figure(ev.update_ratios, ratio_title, "update ratio", (low, high))))
    if ev.loss:
        charts.append(("loss", _series_figure({"loss": ev.loss}, "Loss (probe 'loss')", "loss")))
    fh.write('<section id="charts"><h2>Over steps</h2>\n')
    if any(figure["data"] for _, figure in charts):
        fh.write(plotly_loader())  # plotly.js once, before the first chart
    for div_id, figure in charts:
        if not figure["data"]:
            fh.write(f'<p class="note">{_e(figure["layout"]["title"]["text"])}: no data in this dump.</p>')
            continue
        fh.write(plotly.io.to_html(figure, include_plotlyjs=False, full_html=False, validate=False,
                                   div_id=div_id, config={"displaylogo": False}, default_height="420px"))
    fh.write("</section></main></body></html>\n")
