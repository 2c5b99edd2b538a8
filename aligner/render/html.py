"""The HTML page of `align compare --html`: the page a user sends to a colleague.

One self-contained file that works offline (plotly.js is inlined once, compressed: `render.plotlyjs`; nothing is
fetched):

1. a headline: the verdict (divergence / NaN origin / records on one side only under --strict / unreadable records /
   no divergence), the origin module in big text with the reason the error starts there, the tolerance the verdict
   used in words, and the next command to run (zoom into the origin module; or, when everything matches, compare the
   weights after one optimizer step);
2. the plain-words summary (`render.compare.summary`);
3. one interactive plotly chart: relative L2 error ||a-b||/||b|| per record in execution order, log scale, forward and
   backward as separate traces (each line broken between runs of one step and phase, so it never crosses the other
   phase's records), records outside tolerance drawn over them in red, each origin marked, and the tolerance
   band the verdict used. Its lower edge is the row's rtol; its upper edge is rtol + atol*sqrt(n)/||b||, the largest
   relative L2 error an elementwise-matching tensor can have (|a_i-b_i| <= atol + rtol*|b_i| for every i implies
   ||a-b|| <= atol*sqrt(n) + rtol*||b||), so every matching record lies below the band's top;
4. the full table of rows, module names escaped, origin rows highlighted and linked from the headline.

Near-zero references. A record whose reference has ||b|| <= atol*sqrt(n) (its RMS is within the absolute tolerance,
e.g. the gradient of a zero-initialised bias) is judged by atol alone, and its relative error is noise divided by
almost nothing: 1e-9 of float noise on a 1e-9 tensor plots as a 100% error. Such records that *matched* are moved to
their own grey trace, hidden by default (`visible: "legendonly"`, one click on the legend shows it), kept out of the
tolerance band, counted in a note under the chart and marked in the table. A near-zero record that diverged stays in
its phase's trace: the verdict says it is wrong, so the chart must show it. Values off the axis (inf, or beyond
`_CAP`) are drawn at its edge as triangles, exact zeros at the bottom edge; the hover always shows the true value.

A long comparison (streamed, rows let go of: `long_report`; past compare/stream.py's WINDOW rows) holds only some
rows, so its page differs in two places: the chart draws `render.html_profile.ErrorProfile`'s buckets, taken row by row
as the comparison streamed (each bucket's largest error at the row where it occurs, so one divergent row among a
million shows; its worst row outside tolerance; the band), and the table shows the kept rows around each finding, at
most `_TABLE_ROWS`, a line for each gap, and where every row is: the --csv report linked, or the command that writes
it. The headline's tolerance counts come from the profile too. Every other comparison gets the page described above.

Speed: each row's text is formatted once (shared by the hover and the table), the figure is a plain dict handed to
plotly with validation off, and the table is one string join: 10,000 rows take about 0.4 s of CPU, 0.15 s of it
compressing plotly.js (once a process). Size: 200 rows make a 2.1 MB page, 1.96 MB of it the compressed plotly.js.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import shlex
import urllib.parse
from typing import IO, Any, Callable, NamedTuple, Sequence

from aligner.pipelines.compare.evaluate import Row, RowStatus
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.verdict import Culprit, Divergence, Phase, Verdict, error_level, phase_of
from aligner.render.compare import (
    _SHORT,
    NO_ZOOM,
    _describe,
    _fmt,
    _kind_io,
    _where,
    argument_words,
    settings_text,
    summary,
    zoomed,
    zoomed_text,
)
from aligner.render.html_profile import (
    BACKWARD_PEAK,
    FORWARD_PEAK,
    NEAR_ZERO_PEAK,
    Bucket,
    ErrorProfile,
    Peak,
    ToleranceGroups,
    near_zero,
)
from aligner.render.htmltext import page_text as _e
from aligner.render.htmltext import plotly_text as _pe
from aligner.render.plotlyjs import plotly_loader
from aligner.render.words import say
from aligner.render.zoom import scoped_zoom, side_path, zoom_code, zoom_hint

_CAP = 1e3            # relative errors above this (and inf) are drawn at the top edge of the chart
_MIN_FLOOR = 1e-16    # the chart's bottom edge never goes below this
_LABEL_ROW = 18       # px between the rows of origin labels above the chart (12 px text, 17 px boxes)
_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "diverged": "#d62728", "nearzero": "#9e9e9e",
           "band": "rgba(120,120,120,0.18)"}
_HOVER = ("<b>%{customdata[0]}</b><br>%{customdata[1]} · %{customdata[2]}<br>"
          "rel L2 err %{customdata[3]}<br>max abs err %{customdata[4]}<br>cosine %{customdata[5]}<br>"
          "tolerance %{customdata[6]}<br>%{customdata[7]}<extra>#%{x}</extra>")

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; }
main { max-width: 1400px; margin: 0 auto; padding: 1.2em 1.5em 3em; }
header.verdict { border-left: 10px solid #999; background: #f6f6f6; padding: 1em 1.4em; margin-bottom: 1.2em; }
header.bad { border-color: #c62828; background: #fdecea; } header.good { border-color: #2e7d32; background: #edf7ed; }
header.warn { border-color: #ef6c00; background: #fff4e5; }
.label { font-size: 1.05em; text-transform: uppercase; letter-spacing: .06em; font-weight: 600; }
header .origin { font-size: 2.4em; font-weight: 700; font-family: ui-monospace, Menlo, Consolas, monospace;
                 overflow-wrap: break-word; margin: .15em 0; }
header .origin a { color: inherit; text-decoration: none; }
.where { color: #444; } .reason { margin: .4em 0; } .extra { margin: .3em 0; color: #333; }
.next { margin-top: .8em; } .next pre { background: #272822; color: #f8f8f2; padding: .7em 1em; overflow-x: auto;
        border-radius: 4px; font-size: 13px; }
.tol { color: #333; font-size: .95em; }
.note { color: #555; font-size: .9em; }
#chart { width: 100%; height: 440px; }
table { border-collapse: collapse; font-size: 12px; width: 100%; }
th { position: sticky; top: 0; background: #eee; } td, th { border: 1px solid #ddd; padding: 2px 6px; }
td.num { text-align: right; font-family: ui-monospace, Menlo, Consolas, monospace; }
td.mod { font-family: ui-monospace, Menlo, Consolas, monospace; overflow-wrap: break-word; }
tr.diverged { color: #b00; } tr.error, tr.unmatched, tr.skipped { background: #fff8d6; } tr.unread { color: #999; }
tr.nearzero { color: #888; }
tr.origin { background: #c62828; color: white; font-weight: bold; } tr.origin:target { outline: 3px solid #000; }
"""


def _tol_text(row: Row) -> str:
    m = row.metrics
    return "-" if m is None else f"rtol {m.rtol:.2g}, atol {m.atol:.2g}"


def tolerance_words(result: CompareResult, counted: ToleranceGroups | None = None) -> str:
    """The tolerance the verdict used, in words: the rule, what was asked for, then each (rtol, atol) actually applied
    with how many records and where it came from (`counted`: the rows' tolerances, counted as they streamed; else
    counted over `result.rows`)."""
    spec = result.tolerance
    symmetric = any(t.symmetric for t in ([spec.default] if spec.default else []) + [t for _, t in spec.overrides])
    rule = ("Tolerance: an element matches when |a − b| ≤ atol + rtol·" + ("max(|a|, |b|)" if symmetric else "|b|")
            + ", b being the reference" + ("" if spec.is_default else f"; asked for: {spec.describe()}") + ".")
    if counted is None:
        counted = ToleranceGroups(spec)
        for row in result.rows:
            counted.add(row)
    groups, calibrated = counted.groups(), counted.calibrated
    if not groups and not calibrated:
        return rule + " No record was compared."
    parts = []
    if calibrated:
        (rtol_lo, rtol_hi), (atol_lo, atol_hi) = counted.rtols, counted.atols
        k = spec.calibration_k or 0.0
        parts.append(f"calibrated per record, {k:g}x the reference's own error against float64: rtol "
                     f"{rtol_lo:.2g} to {rtol_hi:.2g}, atol {atol_lo:.2g} to {atol_hi:.2g} "
                     f"({calibrated} record{'s' if calibrated != 1 else ''}, each in the table)")
    for (rtol, atol), (count, dtypes, default) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:4]:
        why = f"torch.testing's default for {', '.join(sorted(dtypes))}" if default else "from --rtol/--atol"
        parts.append(f"rtol = {rtol:.3g}, atol = {atol:.3g} ({why}; {count} record{'s' if count != 1 else ''})")
    more = f"; and {len(groups) - 4} other tolerance(s), see the table" if len(groups) > 4 else ""
    return rule + " Used here: " + "; ".join(parts) + more + "."


def _path(label: str) -> str:
    """The directory of a side label such as "dumps_ms/ (mindspore)", quoted for the command the report suggests."""
    return side_path(label)


def _nan_scope(row: Row) -> str:
    """Side A's path of the module producing the first NaN/Inf (the reference's when A has no twin)."""
    return (row.pair.a or row.pair.ref).record.module


def next_step(result: CompareResult, backward: bool | None = None) -> tuple[str, str]:
    """(what to do next in words, the code or command for it) for this verdict (`backward`: whether a backward record
    was compared, when `result.rows` holds only some rows)."""
    v, rows = result.verdict, result.rows
    finding = _main_finding(result)
    if finding is not None and finding.culprit not in NO_ZOOM and not zoomed(result, finding):
        return zoom_hint(result, finding), zoom_code(result, finding) + " --html zoom.html"
    if finding is not None:
        a, b = _path(result.migrated), _path(result.reference)
        fix = ("Fix the op named above (its source line is in the headline), then compare again."
               if finding.culprit is Culprit.OP else
               "Give both models the same input, then compare again." if finding.culprit is Culprit.MODEL_INPUT else
               f"Fix which tensor the forward of {finding.blame or 'the model'} hands over (see the headline), then "
               f"compare again." if finding.culprit is Culprit.WIRING else
               f"Pass the same arguments in the forward of {finding.blame or 'the model'} (see the headline), then "
               f"compare again." if finding.culprit is Culprit.ARGUMENT else zoomed_text(result, finding))
        return fix, f"align compare {a} {b}"
    a, b = _path(result.migrated), _path(result.reference)
    if result.strict and result.unmatched:
        return ("Pair the records: write a name map (rename/regex rules from the first side's module paths to the "
                "reference's) and compare again.",
                f"align compare {a} {b} --strict --map map.yaml\n"
                "# map.yaml:  regex: [['^old_prefix\\.', 'new_prefix.']]")
    if v.nan_origin is not None:
        rec = rows[v.nan_origin.row].pair.ref.record
        return (f"Zoom in: dump every tensor operation inside {rec.module or 'the whole model'} to find the "
                f"operation that produces the first NaN/Inf.",
                scoped_zoom(result, _nan_scope(rows[v.nan_origin.row]), rec.module,
                            phase_of(rows[v.nan_origin.row]) == Phase.BACKWARD) + " --html zoom.html")
    if result.errors or result.problems:
        return ("Re-dump the records that could not be read (marked in the table) and compare again.",
                f"align compare {a} {b}")
    if not result.compared:
        return ("Pair the records: check both dumps are of the same model and step, or write a name map (rename/regex "
                "rules from the first side's module paths to the reference's) and compare again.",
                f"align compare {a} {b} --map map.yaml\n# map.yaml:  regex: [['^old_prefix\\.', 'new_prefix.']]")
    if backward if backward is not None else any(r.metrics is not None and phase_of(r) == Phase.BACKWARD
                                                 for r in rows):
        return ("Forward and backward match. Next, compare the weights after one optimizer step: a difference there is "
                "in the update itself (learning rate, weight decay, momentum, clipping).",
                "align diff step1_ms.ckpt step1_pt.pth --init init.pth")
    return ("The forward pass matches. Next, dump a training step (loss.backward() inside aligner.dump) to compare "
            "gradients, then compare the weights after one optimizer step.",
            "align diff step1_ms.ckpt step1_pt.pth --init init.pth")


def _main_finding(result: CompareResult) -> Divergence | None:
    """The finding to headline: the forward one when there is one (a backward divergence follows from it)."""
    found = result.verdict.findings
    return next((f for f in found if f.phase == Phase.FORWARD), found[0] if found else None)


def _link(rows: Sequence[Row], i: int) -> str:
    return f'<a href="#row-{i}">{_e(_where(rows[i]))}</a>'


def _culprit_words(f: Divergence) -> str:
    if f.culprit is Culprit.WIRING:
        return f"the forward of {f.blame or 'the model'}, which hands a call another module's output (wiring)"
    if f.culprit is Culprit.ARGUMENT and f.argument is not None:
        return argument_words(f)
    if f.culprit is Culprit.PARENT_CODE:
        return f"the code in the forward of {f.blame or 'the model'} between its module calls, not a module"
    if f.culprit is Culprit.OP:
        return f"one op in the forward of {f.blame or 'the model'}" + (f", at {f.source}" if f.source else "")
    return "the data given to the model (its own input differs), not its code"


def _headline(result: CompareResult, profile: ErrorProfile | None = None) -> str:
    """The verdict's header (`profile`: what was counted over every row of a long comparison)."""
    v, rows = result.verdict, result.rows
    finding = _main_finding(result)
    extra: list[str] = []
    origin: int | None
    if finding is not None:
        cls, label, origin = "bad", f"{finding.phase.value} divergence", finding.origin
        first = rows[finding.first]
        reason = f"The error is introduced here: {say(finding.reason)}."
        if finding.first != finding.origin:
            reason += (f" It first exceeds the tolerance later, at {_where(first)} ({_describe(first)}), carried "
                       f"there from this record.")
        else:
            described = _describe(first)
            reason += f" {described[:1].upper()}{described[1:]}."
        for other in v.findings:
            if other is not finding:
                extra.append(f"Also a {_e(other.phase.value)} divergence, introduced at {_link(rows, other.origin)}: "
                             f"{_e(say(other.reason))}.")
    elif result.strict and (result.unmatched or result.skipped):
        origin = min(result.unmatched[:1] + result.skipped[:1])
        cls, label = "bad", "records on one side only"
        reason = (f"{len(result.unmatched) + len(result.skipped)} record(s) have no partner on the other side, or no "
                  f"numbers to compare with it (a failure under --strict); the first is shown. Every compared record "
                  f"agrees within tolerance.")
    elif v.nan_origin is not None:
        cls, label, origin = "warn", "no divergence, but NaN/Inf", v.nan_origin.row
        side = result.migrated if v.nan_origin.side == "a" else result.reference
        reason = (f"Both sides agree, NaN/Inf included; this is the first record producing non-finite values from "
                  f"finite inputs: {v.nan_origin.count} on {side}.")
    elif result.errors and result.compared:
        cls, label, origin = "warn", "could not compare every record", result.errors[0]
        reason = (f"{len(result.errors)} record(s) could not be read, the first shown: {rows[origin].error}. "
                  f"Every record that was read agrees within tolerance.")
    elif not result.compared:
        cls, label = "bad", "nothing compared"
        origin = result.errors[0] if result.errors else None
        reason = (f"No paired record could be read ({len(result.errors)}; the first shown: "
                  f"{rows[result.errors[0]].error}), so this is not a pass." if result.errors else
                  "No record has a twin on the other side with numbers to compare, so this is not a pass: are both "
                  "dumps of the same model and step? A --map file pairs names that differ.")
    else:
        cls, label, origin = "good", "verdict", None
        reason = f"All {result.compared} compared records match within tolerance."
    if finding is not None and v.nan_origin is not None:
        extra.append(f"First NaN/Inf at {_link(rows, v.nan_origin.row)}.")
    if result.unmatched and not result.strict:
        extra.append(f"{len(result.unmatched)} record(s) exist on one side only (listed in the table; they fail the "
                     f"comparison only with --strict).")
    if result.skipped and not result.strict:
        extra.append(f"{len(result.skipped)} record(s) could not be compared: {_e(rows[result.skipped[0]].skipped)} "
                     f"(listed in the table; they fail the comparison only with --strict).")
    if result.problems:
        extra.append(f"{len(result.problems)} manifest line(s) were skipped (first: {_e(result.problems[0])}).")
    if origin is not None:
        rec = rows[origin].pair.ref.record
        shown = rec.module
        if finding is not None and finding.culprit is not Culprit.MODULE:
            shown = finding.blame
            reason += f" At fault: {_culprit_words(finding)}."
        if finding is not None:
            reason += settings_text(finding)
        big = f'<div class="origin"><a href="#row-{origin}">{_e(shown or "(root)")}</a></div>'
        where = (f'<div class="where">{_e(rec.type or "-")} · {_e(rec.kind)} {_e(rec.io)}'
                 + (f" #{rec.index}" if rec.index else "") + f" · record #{origin} · step {rec.step}</div>")
    else:
        big, where = '<div class="origin">No divergence</div>', ""
    words, code = next_step(result, None if profile is None else profile.backward)
    return (f'<header class="verdict {cls}" id="headline"><div class="label">{_e(label)}</div>{big}{where}'
            f'<p class="reason">{_e(reason)}</p>' + "".join(f'<p class="extra">{x}</p>' for x in extra)
            + f'<p class="tol">{_e(tolerance_words(result, None if profile is None else profile.tolerances))}</p>'
            f'<div class="next"><b>Next step.</b> {_e(words)}<pre><code>{_e(code)}</code></pre></div></header>')


class _Text(NamedTuple):
    """One row's table cells, computed once for the chart's hover and the table (HTML-escaped where text)."""

    module: str        # HTML-escaped
    cells: str         # the table's <td> cells after the module
    status: RowStatus
    verdict: str       # in words, not escaped
    plot: list[str]    # the chart's hover fields (plotly's escaping)


def _texts(result: CompareResult) -> list[_Text]:
    return [_text(i, row, result.verdict) for i, row in enumerate(result.rows)]


def _text(i: int, row: Row, v: Verdict) -> _Text:
    """Row i's table cells and hover fields."""
    rec, m, status = row.pair.ref.record, row.metrics, row.status
    if status is RowStatus.DIVERGED:
        verdict = str(v.labels.get(i, "diverged"))
    elif status is RowStatus.UNMATCHED:
        verdict = "only in reference" if row.pair.a is None else "only in first"
    elif status is RowStatus.ERROR:
        verdict = f"error: {row.error}"
    elif status is RowStatus.SKIPPED:
        verdict = f"not compared: {row.skipped}"
    else:
        verdict = status.value
    if status is RowStatus.OK and near_zero(row):
        verdict += " (reference ≈ 0)"
    kind_io = f"{rec.kind}/{rec.io}" + (f" #{rec.index}" if rec.index else "")
    tol = _tol_text(row)
    if m is None:
        nums = ["-"] * 6
        max_abs = cosine = "-"
    else:
        frac = m.mismatch_fraction
        max_abs, cosine = _fmt(m.max_abs_err), _fmt(m.cosine, ".6f")
        nums = [max_abs, _fmt(m.max_rel_err), _fmt(m.rel_l2_err), cosine, _fmt(m.sqnr_db, ".1f"),
                "-" if frac is None else f"{100 * frac:.2f}"]
    dtype = rec.dtype if m is None or m.dtype_match else f"{m.dtype_a}/{m.dtype_b}"
    cells = (f"<td>{_e(rec.type)}</td><td>{_e(kind_io)}</td><td>{'x'.join(map(str, rec.shape)) or 'scalar'}</td>"
             f"<td>{_e(dtype)}</td>" + "".join(f'<td class="num">{n}</td>' for n in nums)
             + f"<td>{tol}</td>")
    module = rec.module or "(root)"
    note = (f"outside tolerance ({verdict})" if status is RowStatus.DIVERGED else
            "within tolerance" if status is RowStatus.OK else verdict)
    return _Text(_e(module), cells, status, verdict,
                 [_pe(module), _pe(rec.type or "-"), _pe(_kind_io(row)), "", max_abs, cosine, tol, _pe(note)])


def _floor(low: float) -> float:
    """The chart's bottom edge: a decade below the smallest positive error or rtol drawn (`low`, inf: none)."""
    floor = max(low / 10, _MIN_FLOOR) if low < math.inf else 1e-8
    return 10 ** math.floor(math.log10(floor))


def _y(level: float, floor: float) -> float:
    """Where an error level is drawn: within the axis (off it: at its edge)."""
    return floor if level <= floor else min(level, _CAP)


def _symbol(level: float, floor: float) -> str:
    return "triangle-up" if level > _CAP else ("triangle-down" if level < floor else "circle")


def _origins(v: Verdict) -> list[tuple[int, str]]:
    """The rows the chart marks, with their labels: each finding's origin and the first NaN/Inf."""
    marks = [(f.origin, f"{f.phase.value} origin") for f in v.findings]
    if v.nan_origin is not None:
        marks.append((v.nan_origin.row, "first NaN/Inf"))
    return marks


def _layout(floor: float, top: float, shapes: list[dict], notes: list[dict]) -> dict[str, Any]:
    """The chart's axes (a log error axis from `floor` to `top`), its origin lines and their labels, with room above
    the plot for a row of labels each."""
    return {
        "margin": {"l": 70, "r": 20, "t": 25 + _LABEL_ROW * len(notes), "b": 50}, "hovermode": "closest",
        "xaxis": {"title": {"text": "record (execution order)"}, "zeroline": False},
        "yaxis": {"title": {"text": "relative L2 error ‖a−b‖ / ‖b‖"}, "type": "log", "exponentformat": "e",
                  "range": [math.log10(floor) - 0.2, math.log10(top) + 0.3]},
        "legend": {"orientation": "h", "y": -0.18}, "shapes": shapes, "annotations": notes,
    }


def _origin_lines(marks: list[tuple[int, str]], rows: Sequence[Row]) -> tuple[list[dict], list[dict]]:
    """A dotted line at each marked row and its label above the plot, each label on a row of its own (the labels of
    near origins would overlap)."""
    shapes, notes = [], []
    for row, (i, text) in enumerate(marks):
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": i, "x1": i, "y0": 0, "y1": 1,
                       "line": {"color": _COLORS["diverged"], "width": 1, "dash": "dot"}})
        notes.append({"x": i, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom", "showarrow": False,
                      "yshift": _LABEL_ROW * row, "font": {"color": _COLORS["diverged"], "size": 12},
                      "text": f"{text}: {_pe(rows[i].pair.ref.record.module or '(root)')}"})
    return shapes, notes


def _figure(result: CompareResult, texts: Sequence[_Text]) -> tuple[dict[str, Any], int]:
    """The plotly figure as a plain dict, and the number of near-zero records hidden by default."""
    rows, v = result.rows, result.verdict
    metrics = {i: r.metrics for i, r in enumerate(rows) if r.metrics is not None}
    levels = {i: error_level(rows[i]) for i in metrics}
    hidden = {i for i in levels if texts[i].status is RowStatus.OK and near_zero(rows[i])}
    shown = [i for i in levels if i not in hidden]
    positive = [levels[i] for i in shown if 0 < levels[i] < math.inf]
    positive += [metrics[i].rtol for i in shown if metrics[i].rtol > 0]
    floor = _floor(min(positive) if positive else math.inf)

    def bounds(i: int) -> tuple[float, float]:
        m = metrics[i]
        hi = m.rtol + (m.atol * math.sqrt(m.numel) / m.norm_b if m.norm_b else math.inf)
        return max(m.rtol, floor), min(max(hi, floor), _CAP)

    def y(level: float) -> float:
        return _y(level, floor)

    def symbol(level: float) -> str:
        return _symbol(level, floor)

    def custom(i: int) -> list[str]:
        fields = list(texts[i].plot)
        fields[3] = _fmt(levels[i])
        if i in hidden:
            fields[7] += "; reference near zero: relative error not meaningful"
        return fields

    def trace(uid: str, name: str, idx: Sequence[int | None], **kw: Any) -> dict[str, Any]:
        def each(field: Callable[[int], Any]) -> list[Any]:  # None (a break in the line) stays None
            return [None if i is None else field(i) for i in idx]

        return {"type": "scatter", "uid": uid, "name": name, "x": list(idx), "y": each(lambda i: y(levels[i])),
                "customdata": each(custom), "hovertemplate": _HOVER,
                "marker": {"symbol": each(lambda i: symbol(levels[i])), **kw.pop("marker", {})}, **kw}

    data: list[dict[str, Any]] = []
    band = sorted(shown)
    if band:
        b = [bounds(i) for i in band]
        data.append({"type": "scatter", "uid": "tol-lo", "name": "tolerance band", "legendgroup": "tol",
                     "x": band, "y": [lo for lo, _ in b], "mode": "lines", "line": {"width": 0.5, "color": "#888",
                                                                                       "shape": "hvh"},
                     "hoverinfo": "skip", "showlegend": False})
        data.append({"type": "scatter", "uid": "tol-hi", "name": "tolerance band (rtol … rtol + atol·√n/‖b‖)",
                     "legendgroup": "tol", "x": band, "y": [hi for _, hi in b], "mode": "lines", "fill": "tonexty",
                     "fillcolor": _COLORS["band"], "line": {"width": 0.5, "color": "#888", "shape": "hvh"},
                     "hoverinfo": "skip"})
    # one line per run of records of one step and phase in execution order, None between runs (plotly breaks the
    # line there): joined, step 2's first forward record was drawn from step 1's last, across step 1's backward
    keys = [(rows[i].pair.ref.record.step, phase_of(rows[i])) for i in shown]
    run_of = dict(zip(shown, itertools.accumulate(int(k != before) for k, before in zip(keys, [None, *keys]))))
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        line: list[int | None] = []
        run = None
        for i in (i for i in shown if phase_of(rows[i]) is phase):
            if run is not None and run != run_of[i]:
                line.append(None)
            line.append(i)
            run = run_of[i]
        if line:
            color = _COLORS[phase.value]
            data.append(trace(phase.value, phase.value, line, mode="lines+markers", line={"width": 1, "color": color},
                              marker={"size": 5, "color": color}))
    bad = [i for i in shown if texts[i].status is RowStatus.DIVERGED]
    if bad:
        data.append(trace("diverged", "outside tolerance", bad, mode="markers",
                          marker={"size": 7, "color": _COLORS["diverged"]}))
    if hidden:
        idx = sorted(hidden)
        data.append(trace("nearzero", f"near-zero reference ({len(idx)}, hidden)", idx, mode="markers",
                          visible="legendonly", marker={"size": 5, "color": _COLORS["nearzero"]}))
    marks = [(i, text) for i, text in _origins(v) if i in levels]
    shapes, notes = _origin_lines(marks, rows)
    if marks:
        data.append(trace("origin", "origin", [i for i, _ in marks], mode="markers",
                          marker={"size": 18, "color": _COLORS["diverged"], "line": {"width": 2.5}}))
        data[-1]["marker"]["symbol"] = "circle-open"
    top = max([y(levels[i]) for i in shown] + [hi for _, hi in (bounds(i) for i in shown)] + [floor * 10])
    layout = _layout(floor, top, shapes, notes)
    return {"data": data, "layout": layout}, len(hidden)


def _chart(figure: dict[str, Any], notes: Sequence[str]) -> str:
    import plotly.io  # lazily: every `align compare` imports this module, only --html needs plotly

    div = plotly_loader() + plotly.io.to_html(figure, include_plotlyjs=False, full_html=False, validate=False,
                                              div_id="chart", config={"responsive": True, "displaylogo": False},
                                              default_height="440px")
    return div + "".join(f'<p class="note">{_e(n)}</p>' for n in notes)


def _notes(hidden: int) -> list[str]:
    """The lines under the chart: how to read it, and the near-zero records it hides."""
    notes = ["Hover a point for the layer, its error and the tolerance used; click a legend entry to show or hide it. "
             "The grey band runs from the record's rtol to rtol + atol·√n/‖b‖, the most a matching record can reach. "
             "Errors beyond the axis (and exact zeros) are drawn at its edges as triangles."]
    if hidden:
        notes.append(f"{hidden} record(s) whose reference is near zero (‖b‖ ≤ atol·√n, e.g. gradients of "
                     f"zero-initialised biases) matched within the absolute tolerance; their relative error is not "
                     f"meaningful, so they are hidden (legend: “near-zero reference”) and greyed in the table.")
    return notes


_HEAD = ["#", "module", "type", "kind/io", "shape", "dtype", "max abs err", "max rel err", "rel L2 err", "cosine",
         "SQNR dB", "off %", "tolerance", "verdict"]


def _table(result: CompareResult, shown: Sequence[tuple[int, _Text]]) -> str:
    """The table of the rows `shown`, (index, text) in order; a line in each gap between them (a long comparison's
    table shows some rows)."""
    v, total = result.verdict, len(result.rows)
    origins = {f.origin for f in v.findings}
    if v.nan_origin is not None:
        origins.add(v.nan_origin.row)
    out = ["<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in _HEAD) + "</tr></thead><tbody>"]
    before = -1
    for i, t in shown:
        if i > before + 1:
            out.append(_gap(before + 1, i - 1))
        before = i
        cls, verdict = t.status.value, t.verdict
        if verdict.endswith("≈ 0)"):
            cls += " nearzero"
        if i in origins:
            cls += " origin"
            verdict = "ORIGIN " + verdict
        out.append(f'<tr id="row-{i}" class="{cls}"><td class="num">{i}</td><td class="mod">{t.module}</td>{t.cells}'
                   f"<td>{_e(verdict)}</td></tr>")
    if total > before + 1:
        out.append(_gap(before + 1, total - 1))
    out.append("</tbody></table>")
    return "\n".join(out)


def _gap(first: int, last: int) -> str:
    n = last - first + 1
    return (f'<tr class="gap"><td colspan="{len(_HEAD)}">… {n:,} record{"s" if n != 1 else ""} not shown (#{first:,} '
            f"to #{last:,}) …</td></tr>")


# ---- a long comparison (streamed, rows let go): the chart from an ErrorProfile, the table around the findings ------

_TABLE_ROWS = 1000   # rows a long comparison's table shows at most (every row: the CSV report)
_TABLE_CONTEXT = 40  # rows shown before and after each row the verdict names, where kept
_TABLE_FIRSTS = 5    # of the first errors, skipped and reordered rows, each shown with its context
_LONG_CSS = """tr.gap td { text-align: center; color: #555; font-style: italic; background: #f4f4f4; }
.full pre { background: #272822; color: #f8f8f2; padding: .7em 1em; overflow-x: auto; border-radius: 4px;
            font-size: 13px; }
"""
_BUCKET_HOVER = _HOVER.replace("<extra>", "<br>%{customdata[8]}<extra>")


@dataclasses.dataclass(frozen=True)
class FullTable:
    """Where a long report's reader finds every row: the CSV report written with it (`csv`, its path relative to the
    page), else the command that writes one (`command`, its words)."""

    csv: str | None = None
    command: tuple[str, ...] = ()


def long_report(result: CompareResult) -> bool:
    """Whether the page is a long comparison's: streamed with rows let go, so the rows are not all at hand."""
    return result.streamed is not None and bool(result.streamed.evicted)


def _table_rows(result: CompareResult) -> list[int]:
    """The kept rows a long comparison's table shows: nearest first to each row the verdict names (each finding's
    origin, first and previous rows; the first NaN/Inf; the first errors, skipped and reordered rows), then to the
    first and the last row; at most _TABLE_ROWS."""
    v, n = result.verdict, len(result.rows)
    anchors = [i for f in v.findings for i in (f.origin, f.first, f.previous) if i is not None]
    if v.nan_origin is not None:
        anchors.append(v.nan_origin.row)
    anchors += [*result.errors[:_TABLE_FIRSTS], *result.skipped[:_TABLE_FIRSTS], *result.reordered[:_TABLE_FIRSTS],
                0, n - 1]
    chosen: set[int] = set()
    for anchor in anchors:
        for i in sorted(range(anchor - _TABLE_CONTEXT, anchor + _TABLE_CONTEXT + 1), key=lambda k: abs(k - anchor)):
            if len(chosen) >= _TABLE_ROWS:
                return sorted(chosen)
            if 0 <= i < n and i not in chosen and result.holds(i):
                chosen.add(i)
    return sorted(chosen)


def _profile_figure(result: CompareResult, profile: ErrorProfile) -> dict[str, Any]:
    """The chart of a long comparison: each bucket's peaks (html_profile.py), the band, the origins marked."""
    v, rows, buckets = result.verdict, result.rows, profile.buckets
    floor = _floor(profile.low)

    def custom(p: Peak, b: Bucket | None, hidden: bool = False) -> list[str]:
        kind_io = f"{_SHORT.get(p.kind, p.kind)} {_SHORT.get(p.io, p.io)}" + (f"#{p.nth}" if p.nth else "")
        note = (f"outside tolerance ({v.labels.get(p.row, 'diverged')})" if p.status is RowStatus.DIVERGED else
                "within tolerance" + ("; reference near zero: relative error not meaningful" if hidden else ""))
        where = "" if b is None else (
            f"the largest of records #{b.first:,} to #{b.last:,}: {b.compared:,} compared, {b.diverged:,} outside "
            f"tolerance" + (f", smallest cosine {_fmt(b.cosine[0], '.6f')} at #{b.cosine[1]:,}" if b.cosine else ""))
        return [_pe(p.module or "(root)"), _pe(p.type or "-"), _pe(kind_io), _fmt(p.level), _fmt(p.max_abs_err),
                _fmt(p.cosine, ".6f"), f"rtol {p.rtol:.2g}, atol {p.atol:.2g}", _pe(note), where]

    def trace(uid: str, name: str, points: Sequence[tuple[Peak, Bucket | None] | None], hidden: bool = False,
              **kw: Any) -> dict[str, Any]:
        def each(field: Callable[[Peak, Bucket | None], Any]) -> list[Any]:  # None (a break in the line) stays None
            return [None if q is None else field(*q) for q in points]

        return {"type": "scatter", "uid": uid, "name": name, "x": each(lambda p, b: p.row),
                "y": each(lambda p, b: _y(p.level, floor)), "customdata": each(lambda p, b: custom(p, b, hidden)),
                "hovertemplate": _BUCKET_HOVER,
                "marker": {"symbol": each(lambda p, b: _symbol(p.level, floor)), **kw.pop("marker", {})}, **kw}

    data: list[dict[str, Any]] = []
    band = [b for b in buckets if b.lo < math.inf]
    if band:
        xs = [x for b in band for x in (b.first, b.last)]
        lo = [max(b.lo, floor) for b in band for _ in (0, 1)]
        hi = [min(max(b.hi, floor), _CAP) for b in band for _ in (0, 1)]
        data.append({"type": "scatter", "uid": "tol-lo", "name": "tolerance band", "legendgroup": "tol", "x": xs,
                     "y": lo, "mode": "lines", "line": {"width": 0.5, "color": "#888"}, "hoverinfo": "skip",
                     "showlegend": False})
        data.append({"type": "scatter", "uid": "tol-hi", "name": "tolerance band (rtol … rtol + atol·√n/‖b‖)",
                     "legendgroup": "tol", "x": xs, "y": hi, "mode": "lines", "fill": "tonexty",
                     "fillcolor": _COLORS["band"], "line": {"width": 0.5, "color": "#888"}, "hoverinfo": "skip"})
    for k, phase in ((FORWARD_PEAK, Phase.FORWARD), (BACKWARD_PEAK, Phase.BACKWARD)):
        line: list[tuple[Peak, Bucket | None] | None] = []
        run = None
        for b in buckets:
            peak = b.peaks[k]
            if peak is None:
                continue
            if run is not None and run != b.runs[k][0]:  # another step or phase ran in between: the line stops
                line.append(None)
            line.append((peak, b))
            run = b.runs[k][1]
        if line:
            color = _COLORS[phase.value]
            data.append(trace(phase.value, phase.value, line, mode="lines+markers", line={"width": 1, "color": color},
                              marker={"size": 5, "color": color}))
    bad = [(b.worst, b) for b in buckets if b.worst is not None]
    if bad:
        data.append(trace("diverged", "outside tolerance (each bucket's worst)", bad, mode="markers",
                          marker={"size": 7, "color": _COLORS["diverged"]}))
    near = [(b.peaks[NEAR_ZERO_PEAK], b) for b in buckets if b.peaks[NEAR_ZERO_PEAK] is not None]
    if near:
        data.append(trace("nearzero", f"near-zero reference ({profile.hidden}, hidden)", near, hidden=True,
                          mode="markers", visible="legendonly", marker={"size": 5, "color": _COLORS["nearzero"]}))
    marks = [(i, text) for i, text in _origins(v) if result.holds(i) and rows[i].metrics is not None]
    shapes, notes = _origin_lines(marks, rows)
    if marks:
        data.append(trace("origin", "origin", [(Peak.of(error_level(rows[i]), i, rows[i].status, rows[i]), None)
                                               for i, _ in marks],
                          mode="markers", marker={"size": 18, "color": _COLORS["diverged"], "line": {"width": 2.5}}))
        data[-1]["marker"]["symbol"] = "circle-open"
    top = max([_y(profile.high, floor), floor * 10] + [min(max(b.hi, floor), _CAP) for b in band])
    layout = _layout(floor, top, shapes, notes)
    return {"data": data, "layout": layout}


def _profile_notes(result: CompareResult, profile: ErrorProfile, every_row: bool) -> list[str]:
    """The lines under a long comparison's chart: how its buckets stand for the rows."""
    notes = _notes(profile.hidden)
    notes.insert(1, f"Each point stands for a bucket of up to {profile.width:,} consecutive records ("
                    f"{len(profile.buckets):,} buckets over {len(result.rows):,} records): it is the bucket's largest "
                    f"relative L2 error, drawn at the record where it occurs, so a single record outside tolerance "
                    f"still shows; the red points are each bucket's worst record outside tolerance. Hover a point for "
                    f"its bucket's records, how many were compared and outside tolerance, and the smallest cosine.")
    if not every_row:
        notes.append(f"This chart shows only the {profile.rows:,} records this comparison kept in memory, not "
                     f"every record.")
    return notes


def _full_table_html(result: CompareResult, shown: int, full: FullTable | None) -> str:
    """What a long comparison's table holds, and where every row is: the CSV report linked, or the command that
    writes it."""
    total = len(result.rows)
    text = (f"This table shows {shown:,} of the {total:,} records: those around each finding, the first NaN/Inf and "
            f"the first records that could not be read or compared, and the first and last records; "
            f"{total - shown:,} records are not shown.")
    if full is not None and full.csv is not None:
        return (f'<p class="note full">{_e(text)} Every record is in the CSV report: '
                f'<a href="{_e(urllib.parse.quote(full.csv))}">{_e(full.csv)}</a>.</p>')
    command = full.command if full is not None and full.command else (
        "align", "compare", _path(result.migrated), _path(result.reference), "--ref", "second", "--csv", "rows.csv")
    return (f'<div class="note full"><p>{_e(text)} The full table is not in this report; to write every record to a '
            f"CSV file, run:</p><pre><code>{_e(shlex.join(command))}</code></pre></div>")


def write_html(result: CompareResult, fh: IO[str], profile: ErrorProfile | None = None,
               full_table: FullTable | None = None) -> None:
    """Write the standalone report page (see the module docstring for what it shows). A long comparison (streamed,
    rows let go: `long_report`) gets the chart of `profile`, the `ErrorProfile` that took every row as it was made
    (without one, of the rows kept), and the table of the rows around its findings, with where every row is
    (`full_table`); any other gets every row."""
    long = long_report(result)
    title = "align compare: " + ("divergence" if result.verdict.findings else
                                 "records on one side only" if not result.passed else
                                 "unreadable records" if result.errors else "no divergence")
    fh.write(f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
             f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_e(title)}</title>'
             f"<style>{_CSS}{_LONG_CSS if long else ''}</style></head><body><main>\n")
    if not long:
        texts = _texts(result)
        figure, hidden = _figure(result, texts)
        fh.write(_headline(result))
        fh.write(f'\n<section id="summary"><h2>Summary</h2><p>{_e(summary(result))}</p></section>\n')
        fh.write('<section id="plot"><h2>Error by layer</h2>\n')
        fh.write(_chart(figure, _notes(hidden)))
        fh.write(f'</section>\n<section id="rows"><h2>All records ({len(result.rows)})</h2>\n')
        fh.write(_table(result, list(enumerate(texts))))
        fh.write("\n</section></main></body></html>\n")
        return
    every_row = profile is not None
    if profile is None:
        kept = [(i, result.rows[i]) for i in range(len(result.rows)) if result.holds(i)]
        profile = ErrorProfile.of(result.tolerance, kept)
    shown = _table_rows(result)
    fh.write(_headline(result, profile))
    fh.write(f'\n<section id="summary"><h2>Summary</h2><p>{_e(summary(result))}</p></section>\n')
    fh.write('<section id="plot"><h2>Error by layer</h2>\n')
    fh.write(_chart(_profile_figure(result, profile), _profile_notes(result, profile, every_row)))
    fh.write(f'</section>\n<section id="rows"><h2>Records around the findings ({len(shown):,} of '
             f'{len(result.rows):,})</h2>\n')
    fh.write(_full_table_html(result, len(shown), full_table))
    fh.write(_table(result, [(i, _text(i, result.rows[i], result.verdict)) for i in shown]))
    fh.write("\n</section></main></body></html>\n")
