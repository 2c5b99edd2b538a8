"""Present a comparison: terminal table, one-paragraph summary, JSON, CSV and an HTML page with an error plot."""
from __future__ import annotations

import csv
import errno
import itertools
import json
import math
import os
from typing import IO, Any, Iterator, Protocol, Sequence

from rich.console import Console, JustifyMethod
from rich.table import Table

from aligner.pipelines.compare.evaluate import Row, RowStatus
from aligner.pipelines.compare.result import CompareResult, RowFields, row_values
from aligner.pipelines.compare.verdict import Culprit, Divergence, Verdict, error_level
from aligner.render.jsonout import jsonable
from aligner.render.report_rows import (
    CSV_FIELDS,
    RowsWriter,
    Spans,
    csv_cell,
    csv_row_bytes,
    json_row_bytes,
    row_bytes,
)
from aligner.render.words import say
from aligner.render.zoom import zoom_code, zoom_hint

_CONTEXT = 5          # rows shown around each finding when the table is abbreviated
_SHORT_TABLE = 60     # tables up to this many rows are always shown whole
_METRIC_COLUMNS = frozenset(CSV_FIELDS) - {"shape_a", "shape_b"}  # what a row takes from its Metrics
_CALIBRATION_FIELDS = ["calibrated", "noise_dtype", "noise_abs", "noise_rel", "noise_method", "above_noise",
                       "not_calibrated"]  # CSV columns added by --calibrate


def _fmt(x: float | None, spec: str = ".2e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec)


def _name(row: Row) -> str:
    return row.pair.ref.record.module or "(root)"


_SHORT = {"forward": "fwd", "backward": "bwd", "param_grad": "pgrad", "probe": "probe", "output": "out",
          "input": "in", "grad_input": "gin", "grad_output": "gout", "grad": "grad"}


def _where(row: Row) -> str:
    rec = row.pair.ref.record
    kind = f" ({rec.type})" if rec.type else ""
    return f"{_name(row)}{kind}, {rec.kind} {rec.io}" + (f" #{rec.index}" if rec.index else "")


def _kind_io(row: Row) -> str:
    rec = row.pair.ref.record
    return f"{_SHORT.get(rec.kind, rec.kind)} {_SHORT.get(rec.io, rec.io)}" + (f"#{rec.index}" if rec.index else "")


def times(ratio: float) -> str:
    """A noise ratio in words: "40x", "2.5x"."""
    return "infinitely many times" if math.isinf(ratio) else f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def noise_words(row: Row) -> str | None:
    """How far above the reference's own float64 noise the row's error is, e.g. "40x above the float32 noise of
    this layer (max abs 2.1e-06)"; None when the row was not calibrated or not compared."""
    n, ratio = row.noise, row.above_noise
    if n is None or ratio is None:
        return None
    how = "" if n.method == "elements" else ", from statistics"
    if math.isinf(ratio):
        return f"above the {n.dtype} noise of this layer, which is 0 (exact against float64{how})"
    where = "above" if ratio >= 1 else "of"
    return f"{times(ratio)} {where} the {n.dtype} noise of this layer (max abs {n.max_abs:.1e}{how})"


def _describe(row: Row) -> str:
    m = row.metrics
    if m is None:
        return "not compared"
    if m.method == "none":
        return f"shape {list(m.shape_a)} vs {list(m.shape_b)}"
    parts = []
    if not m.dtype_match:
        parts.append(f"dtype {m.dtype_a} vs {m.dtype_b}")
    if not m.shape_match:
        parts.append(f"shape {list(m.shape_a)} vs {list(m.shape_b)}" + (
            ", compared after broadcasting" if math.prod(m.shape_a) != math.prod(m.shape_b) else
            ", compared in the same element order"))
    if m.method == "stats":
        parts.append(f"statistics differ (norm rel err {_fmt(m.rel_l2_err, '.1e')})")
    else:
        parts.append(f"max abs err {_fmt(m.max_abs_err, '.1e')}")
        if m.mismatch_fraction:
            parts.append(f"{m.mismatch_fraction:.1%} of elements off")
    if m.nan_a != m.nan_b or m.inf_a != m.inf_b:
        parts.append(f"NaN/Inf {m.nan_a + m.inf_a} vs {m.nan_b + m.inf_b}")
    noise = noise_words(row)
    if noise is not None:
        parts.append(noise)
    return ", ".join(parts)


def _culprit(f: Divergence, rows: Sequence[Row]) -> str:
    """Who the verdict blames, in words."""
    origin = rows[f.origin]
    if f.culprit is Culprit.WIRING:
        module = origin.pair.ref.record.module or "(root)"
        other = f" ({f.blame_other or 'the model'} on the first side)" if f.blame_other not in (None, f.blame) else ""
        return (f" At fault: the forward of {f.blame or 'the model'}{other}, which hands {module} another module's "
                f"output than the reference does (wiring), not {module} itself.")
    if f.culprit is Culprit.ARGUMENT and f.argument is not None:
        return " At fault: " + argument_words(f) + "."
    if f.culprit is Culprit.PARENT_CODE:
        parent = f.blame or "the model's top-level forward"
        there = f.blame_other
        also = f" ({there or 'the model'} on the first side)" if there is not None and there != f.blame else ""
        return (f" At fault: the code in the forward of {parent}{also} between its module calls, not a module"
                + (f" (source {f.source})" if f.source else "") + ".")
    if f.culprit is Culprit.OP:
        rec, a = origin.pair.ref.record, origin.pair.a.record if origin.pair.a is not None else None
        other = ""
        if a is not None and a is not rec:
            other = f"; on the first side {a.type} in the forward of {a.parent or '(root)'}" + \
                (f" at {a.source}" if a.source else "")
        if f.op is not None:  # an op one side runs and the other does not: it computed the origin's input
            other = "; only one of the two sides runs such an op there"
        return f" At fault: the op {f.op or rec.type} in the forward of {f.blame or '(root)'}" + \
            (f" at {f.source}" if f.source else "") + other + "."
    if f.culprit is Culprit.MODEL_INPUT and f.blame:
        return (f" At fault: the data, before the model ran (the probe {f.blame!r} was saved ahead of every module): "
                "compare the two data pipelines first (decoding, resize and interpolation, normalization constants, "
                "channel order, batch order: aligner.skip_batches resumes a loader at a batch), not the model.")
    if f.culprit is Culprit.MODEL_INPUT:
        return " At fault: the data given to the model (its own input differs), not its code."
    return ""


def argument_words(f: Divergence) -> str:
    """A call's argument passed on one side only, and the two places that can be at fault, in words."""
    x = f.argument
    assert x is not None
    callee, on, off = x.callee or "(root)", *(("the first", "the reference") if x.side == "a" else
                                               ("the reference", "the first"))
    other = f" ({f.blame_other or 'the model'} on the first side)" if f.blame_other not in (None, f.blame) else ""
    return (f"the forward of {f.blame or 'the model'}{other}, which calls {callee} with the tensor argument "
            f"{x.name!r} on {on} side only ({off} side leaves it out), or {callee}'s own use of that argument; "
            f"{callee}'s other inputs matched")


def _setting_value(value: Any, meaning: Any) -> str:
    """A setting's value as code writes it (0.1, not 0.09999999999999998), with its PyTorch meaning where that reads
    otherwise (a MindSpore momentum)."""
    def lit(v: Any) -> str:
        return f"{v:.6g}" if isinstance(v, float) else repr(v)
    return lit(value) + (f" (PyTorch's meaning {lit(meaning)})" if meaning is not None else "")


def settings_text(f: Divergence) -> str:
    """The blamed module's settings that differ between the sides, in one sentence ("" when none do or the dumps
    hold no attributes of it)."""
    if not f.settings:
        return ""
    parts = [f"{s.name} {_setting_value(s.value_a, s.meaning_a)} vs {_setting_value(s.value_b, s.meaning_b)}"
             for s in f.settings]
    what = "The op's arguments differ" if f.culprit is Culprit.OP else "Its settings differ"
    return f" {what} (first vs reference): {'; '.join(parts)}."


def _finding_text(f: Divergence, rows: Sequence[Row]) -> str:
    first, origin = rows[f.first], rows[f.origin]
    text = f"First {f.phase} divergence at {_where(first)}: {_describe(first)}"
    if f.origin == f.first:
        text += f", introduced here: {say(f.reason)}."
    else:
        level = "above" if origin.diverged else "below"
        noise = noise_words(origin)
        text += (f"; it was inherited: the error starts at {_where(origin)} (relative error "
                 f"{error_level(origin):.1e}, {level} tolerance" + (f", {noise}" if noise else "")
                 + f", then accumulated), introduced there: {say(f.reason)}.")
    text += _culprit(f, rows) + settings_text(f)
    if f.previous is not None:
        prev = rows[f.previous]
        state = "matched" if prev.status is RowStatus.OK else prev.status.value
        text += f" The record before it ({_name(prev)}, {prev.pair.ref.record.kind} {prev.pair.ref.record.io}) {state}."
    return text


def summary(result: CompareResult) -> str:
    """The result in plain words, one paragraph."""
    c = result.matched
    rows = result.rows
    parts = [f"Compared {result.migrated} against the reference {result.reference}: {c['name'] + c['content']} records "
             f"matched ({c['name']} by name, {c['content']} by content, type and shape)"]
    if c["unmatched_a"] or c["unmatched_b"]:
        parts[-1] += (f", {c['unmatched_a']} only in the first and {c['unmatched_b']} only in the reference ("
                      + ("a failure under --strict" if result.strict else "listed, not a failure without --strict")
                      + ")")
    if c["folded_a"] or c["folded_b"]:
        parts[-1] += (f"; {c['folded_a'] + c['folded_b']} pass-through call(s) with no twin (e.g. Identity) folded "
                      f"into their producers")
    parts[-1] += f". Tolerance: {result.tolerance.describe()}."
    for m in result.maps:  # msprobe's own mapping files, found beside a dump and read as the --map
        parts.append(f"Names mapped by msprobe's {m.path}: {m.modules} module and {m.params} parameter rename(s)"
                     + (f", {m.unused} entr(ies) not used (API calls are paired by order; a module mapped two ways "
                        "is left alone)" if m.unused else "") + ".")
    if result.calibration is not None:
        parts.append(calibration_text(result))
    v = result.verdict
    if v.bisect_reads is not None:
        parts.append(bisect_text(result))
    for f in v.findings:
        parts.append(_finding_text(f, rows))
    if v.findings and v.findings[0].culprit not in NO_ZOOM:
        parts.append(zoomed_text(result, v.findings[0]) if zoomed(result, v.findings[0]) else
                     zoom_hint(result, v.findings[0]))
    if not v.findings and not result.compared:
        parts.append("Nothing was compared: " + (
            "no paired record could be read, so this is not a pass." if result.errors else
            "no record has a twin on the other side with numbers to compare, so this is not a pass (are both dumps "
            "of the same model and step? a --map file pairs names that differ)."))
    elif not v.findings:
        parts.append("No divergence: every compared record matches within tolerance." if v.bisect_reads is None
                     else "No divergence among the records read.")
    reordered = result.reordered
    if reordered:
        parts.append(f"{len(reordered)} record(s) hold the same rows in another order (first: "
                     f"{_where(rows[reordered[0]])}; "
                     f"an MoE expert's tokens sorted by a sort stable in one framework and not in the other)"
                     + (": an order-only difference, not a divergence: nothing computed from them differs."
                        if not v.findings else "."))
    if v.immaterial:
        row = rows[v.immaterial[0]]
        parts.append(f"{len(v.immaterial)} input record(s) differ while every output of their call agrees (first: "
                     f"{_where(row)}, {_describe(row)}): another form of the same input (a mask with an extra "
                     f"column, a table laid out differently) that changes nothing the call computes, listed, not a "
                     f"divergence.")
    if v.nan_origin is not None:
        n = v.nan_origin
        side = result.migrated if n.side == "a" else result.reference
        parts.append(f"First NaN/Inf: {_where(rows[n.row])} produces {n.count} non-finite value(s) on {side} "
                     f"from finite inputs.")
    if result.errors:
        first = rows[result.errors[0]]
        parts.append(f"{len(result.errors)} record(s) could not be read (first: {_name(first)}: {first.error}).")
    if result.skipped:
        first = rows[result.skipped[0]]
        parts.append(f"{len(result.skipped)} record(s) could not be compared (first: {_name(first)}: {first.skipped}; "
                     + ("a failure under --strict" if result.strict else "listed, not a failure without --strict")
                     + ").")
    if result.problems:
        parts.append(f"{len(result.problems)} manifest line(s) were skipped (first: {result.problems[0]}).")
    return " ".join(parts)


def bisect_text(result: CompareResult) -> str:
    """What --bisect read and what those reads prove (a record proves nothing about what it does not depend on)."""
    v = result.verdict
    read = f"Bisect mode read {v.bisect_reads} of {sum(1 for r in result.rows if r.pair.a and r.pair.b)} tensor pairs"
    if not v.findings:
        return (f"{read}: the last record of each phase and evenly spaced samples matched, which does not rule out a "
                f"divergence between the samples that later records even out (run without --bisect to read every "
                f"record).")
    if v.bisect_confirmed:
        return f"{read}, among them every record before each answer: it is the first divergence."
    return (f"{read}: each answer is where the error it traced back along the data flow is introduced, but "
            f"{v.bisect_unread} record(s) before it were not read (evenly spaced samples of them matched), so an "
            f"earlier divergence that does not reach the records read is not ruled out (run without --bisect to read "
            f"every record).")


def incomplete(result: CompareResult) -> str:
    """Why a comparison ends with exit code 2, in one line: what could not be read (the error line on stderr)."""
    what = [f"{len(result.errors)} record(s) could not be read (first: {_name(result.rows[result.errors[0]])}: "
            f"{result.rows[result.errors[0]].error})"] if result.errors else []
    what += [f"{len(result.problems)} manifest line(s) were skipped (first: {result.problems[0]})"] \
        if result.problems else []
    return f"{' and '.join(what)}: not checked, so not passed"


def calibration_text(result: CompareResult) -> str:
    """What calibrating against the float64 dump did, in words: how many records, from what, which were left out."""
    cal = result.calibration
    assert cal is not None
    text = f"Calibrated against the float64 dump {cal.source}: {len(cal.noise)} reference record(s) measured"
    if cal.from_stats:
        text += (f"; {cal.from_stats} of them from statistics only (a stats-only dump: min/max/mean/norm "
                 f"differences, lower bounds of the elementwise noise)")
    if cal.missing:
        i, why = next(iter(cal.missing.items()))
        text += (f"; {len(cal.missing)} record(s) not calibrated, which keep the default tolerance (first: "
                 f"{_where(result.rows[i])}: {why})")
    return text + "."


# culprits that name their code already: an op with its source line, the model's input, a call handed another output
# or an argument on one side only
NO_ZOOM = (Culprit.OP, Culprit.MODEL_INPUT, Culprit.WIRING, Culprit.ARGUMENT)


def zoomed(result: CompareResult, f: Divergence) -> bool:
    """Whether the dumps already hold the op-level records of the blamed module's forward (the zoom-in was run): the
    same zoom-in again would give the same answer."""
    scope = f"{f.blame}." if f.blame else ""
    return any((parent + ".").startswith(scope) for parent in result.op_parents)


def zoomed_text(result: CompareResult, f: Divergence) -> str:
    """What an op-level dump of the blamed module that names no op tells (instead of the same zoom-in again)."""
    row = result.rows[f.origin]
    before = result.rows[f.previous].pair.ref.record.module if f.previous is not None else None
    return (f"The op-level records of the forward of {f.blame or 'the model'} were read, and no recorded op there "
            f"computed what differs: that code passes the call another tensor, or computes it with an operation "
            f"aligner does not record; read the forward of {f.blame or 'the model'} between the calls of "
            f"{before or 'its start'} and {row.pair.ref.record.module or '(root)'}.")


def zoom(result: CompareResult) -> str | None:
    """The code of the zoom-in that follows the first finding (None when there is nothing to zoom into, or the dumps
    hold its op-level records already)."""
    found = result.verdict.findings
    if not found or found[0].culprit in NO_ZOOM or zoomed(result, found[0]):
        return None
    return zoom_code(result, found[0])


def to_json(result: CompareResult) -> dict[str, Any]:
    """The result as JSON-ready data, with the summary paragraph and the zoom-in code."""
    return jsonable({"summary": summary(result), "zoom": zoom(result)} | result.to_dict())


def write_compare_json(result: CompareResult, fh: IO[str], spool: ReportSpool | None = None) -> None:
    """The result as one JSON document with a key, and then a row, per line: readable and diffable. Rows are written
    as they are made, _JSON_ROWS at a time, each a `RowFields` struct by msgspec's encoder (`row_bytes`: ~1 us a
    row to build and encode, where a dict through json's encoder took ~9). A streamed comparison's rows come from the
    `spool` they were written into as the comparison made them."""
    head = jsonable({"summary": summary(result), "zoom": zoom(result)} | result.to_dict(rows=False))
    fh.write("{\n" + "".join(f"{json.dumps(key)}: {json.dumps(value)},\n" for key, value in head.items()))
    fh.write('"rows": [\n')
    if spool is not None and spool.json is not None:
        spool.flush()
        out = _byte_sink(fh)
        spool.json.copy(out, spool.patches(result, csv_rows=False), cut=2)  # (the last row's comma)
        out.write(b"\n]}\n")
        return
    n = len(result.rows)
    for start in range(0, n, _JSON_ROWS):
        lines = b",\n".join([row_bytes(result.row_record(i)) for i in range(start, min(n, start + _JSON_ROWS))])
        fh.write(f",\n{lines.decode()}" if start else lines.decode())
    fh.write("\n]}\n")


_JSON_ROWS = 4096  # rows per write of the JSON report: large writes, a few MB held
_WRITER_FROM = 16384  # a streamed comparison this long starts a writer process for its report rows (ReportSpool)
_WRITER_WAIT_S = 10.0  # how long rows wait, at twice that, for a writer that has not said it is up


def _byte_sink(fh: IO[str]) -> _Writes:
    """The bytes under a text report (a file's buffer; a StringIO's own writes, decoded)."""
    fh.flush()
    raw = getattr(fh, "buffer", None)
    return raw if raw is not None else _Decoded(fh)


class _Decoded:
    """Bytes written to a text stream that has no buffer under it."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh

    def write(self, data: bytes) -> int:
        self.fh.write(data.decode())
        return len(data)


def write_csv(result: CompareResult, fh: IO[str], spool: ReportSpool | None = None) -> None:
    """One row per record pair; text cells neutralised against spreadsheet formulas, numbers left as numbers (a
    streamed comparison's rows from the `spool` they were written into)."""
    fields = CSV_FIELDS + (_CALIBRATION_FIELDS if result.calibration is not None else [])
    writer = csv.DictWriter(fh, fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    if spool is not None and spool.csv is not None:
        spool.flush()
        spool.csv.copy(_byte_sink(fh), spool.patches(result, csv_rows=True))
        return
    for i in range(len(result.rows)):
        writer.writerow({k: csv_cell(v) for k, v in result.row_dict(i).items()})


def _shown(result: CompareResult, full: bool) -> list[int | None]:
    """Row indices to print (None = an elision mark): all of a short table, else the context of each finding."""
    n = len(result.rows)
    if full or n <= _SHORT_TABLE:
        return list(range(n))
    v = result.verdict
    keep: set[int] = set(range(min(_CONTEXT, n)))
    for f in v.findings:
        for centre in (f.first, f.origin):
            keep.update(range(max(0, centre - _CONTEXT), min(n, centre + _CONTEXT + 1)))
    if v.nan_origin:
        keep.add(v.nan_origin.row)
    keep.update(result.errors[:_CONTEXT])
    keep.update(result.unmatched[:_CONTEXT])
    keep.update(result.skipped[:_CONTEXT])
    out: list[int | None] = []
    for i in sorted(k for k in keep if result.holds(k)):  # (a streamed comparison keeps some rows)
        if out and out[-1] is not None and i != out[-1] + 1:
            out.append(None)
        out.append(i)
    if out[-1] != n - 1:
        out.append(None)
    return out


def _style(i: int, row: Row, verdict: Verdict) -> str:
    if any(f.origin == i for f in verdict.findings):
        return "bold white on red"
    if row.status is RowStatus.DIVERGED:
        return "red"
    if row.status in (RowStatus.ERROR, RowStatus.UNMATCHED, RowStatus.SKIPPED):
        return "yellow"
    return "dim" if row.status is RowStatus.UNREAD else ""


def _verdict_cell(i: int, row: Row, v: Verdict) -> str:
    """The verdict column of one row in words."""
    if row.status is RowStatus.DIVERGED and row.metrics is not None and row.metrics.reordered and i not in v.labels:
        return "same rows, other order"
    if row.status is RowStatus.DIVERGED:
        label = str(v.labels.get(i, RowStatus.DIVERGED))
        return "ORIGIN " + label if any(f.origin == i for f in v.findings) else label
    if row.status is RowStatus.UNMATCHED:
        return "only in reference" if row.pair.a is None else "only in first"
    if row.status is RowStatus.FOLDED:
        return "pass-through (folded)"
    if row.status is RowStatus.ERROR:
        return f"error: {row.error}"
    if row.status is RowStatus.SKIPPED:
        return f"not compared: {row.skipped}"
    return row.status.value


def print_table(result: CompareResult, console: Console, full: bool = False) -> None:
    """A rich table of the rows (abbreviated around the findings unless `full`), origins highlighted."""
    table = Table(show_lines=False, header_style="bold")
    columns: list[tuple[str, JustifyMethod]] = [
        ("#", "right"), ("module", "left"), ("type", "left"), ("kind/io", "left"), ("shape", "left"), ("dtype", "left"),
        ("max abs err", "right"), ("max rel err", "right"), ("cosine", "right"), ("off %", "right"),
        ("verdict", "left")]
    calibrated = result.calibration is not None
    if calibrated:
        columns.insert(-1, ("x noise", "right"))
    for col, just in columns:
        table.add_column(col, justify=just, overflow="fold", no_wrap=col not in ("module", "verdict"))
    v = result.verdict
    for i in _shown(result, full):
        if i is None:
            table.add_row(*(["..."] + [""] * (len(columns) - 1)))
            continue
        row = result.rows[i]
        rec, m = row.pair.ref.record, row.metrics
        status = _verdict_cell(i, row, v)
        frac = m.mismatch_fraction if m is not None else None
        ratio = row.above_noise
        cells = [str(i), rec.module or "(root)", rec.type, _kind_io(row), "x".join(map(str, rec.shape)) or "scalar",
                 rec.dtype if m is None or m.dtype_match else f"{m.dtype_a}/{m.dtype_b}",
                 _fmt(m.max_abs_err if m else None), _fmt(m.max_rel_err if m else None),
                 _fmt(m.cosine if m else None, ".6f"), "-" if frac is None else f"{100 * frac:.2f}"]
        if calibrated:
            cells.append("-" if ratio is None else "inf" if math.isinf(ratio) else f"{ratio:.3g}")
        table.add_row(*cells, status, style=_style(i, row, v))
    console.print(table)
    if not full and len(result.rows) > _SHORT_TABLE:
        console.print(f"{len(result.rows)} rows; the table shows the context of each finding (--all for every row)",
                      style="dim")


_COPY_BLOCK = 1 << 23  # bytes of a spooled report copied at a time


class _Writes(Protocol):
    def write(self, data: bytes, /) -> int: ...


class _Spool:
    """One report's rows in a temp file (unlinked: nothing is left behind), as bytes, with where each row that may
    still get a label starts."""

    def __init__(self) -> None:
        import tempfile  # only a streamed comparison with a report needs it (tempfile costs ~7 ms of start-up)

        self.file = tempfile.TemporaryFile()
        self.at: dict[int, tuple[int, int]] = {}  # row -> (offset, length) of its bytes, until it is settled
        self.size = 0
        self.spans: Spans | None = None  # where a writer process put the rows it wrote (those are not in `at`)

    def span(self, i: int) -> tuple[int, int]:
        """(offset, length) of row i's bytes."""
        got = self.at.get(i)
        if got is None and self.spans is not None:
            got = self.spans.get(i)
        if got is None:
            raise KeyError(i)
        return got

    def add_rows(self, first: int, rows: list[bytes]) -> None:
        """Rows first, first + 1, ... (each its bytes), in one write."""
        data = b"".join(rows)
        self.file.write(data)
        lengths = [len(row) for row in rows]
        starts = itertools.accumulate(lengths[:-1], initial=self.size)
        self.at.update(zip(range(first, first + len(lengths)), zip(starts, lengths)))
        self.size += len(data)

    def copy(self, out: _Writes, patches: dict[int, bytes], cut: int = 0) -> None:
        """The spooled bytes into `out`, the rows in `patches` replaced, less the last `cut` bytes: each run of rows
        that lie one after the other in one write (a streamed comparison labels up to ~100,000 rows, most of them in
        a few runs), the bytes between by the kernel where `out` is a file."""
        self.file.flush()
        self.file.seek(0)
        pos, end_at = 0, self.size - cut
        for start, end, run in self._runs(patches):
            self._copy_to(out, pos, start - pos)
            for k in range(0, len(run), _JSON_ROWS):  # a few MB a write, never the run whole
                data = b"".join(run[k:k + _JSON_ROWS])
                out.write(data[:len(data) - cut] if end == self.size and k + _JSON_ROWS >= len(run) else data)
            pos = end
        self._copy_to(out, pos, end_at - pos)

    def _runs(self, patches: dict[int, bytes]) -> Iterator[tuple[int, int, list[bytes]]]:
        """(start, end, new rows) of each run of patched rows whose spooled bytes follow one another."""
        run: list[bytes] = []
        start = end = 0
        for i in sorted(patches):
            offset, length = self.span(i)
            if run and offset != end:
                yield start, end, run
                run = []
            if not run:
                start = offset
            run.append(patches[i])
            end = offset + length
        if run:
            yield start, end, run

    def _copy_to(self, out: _Writes, pos: int, n: int) -> None:
        """n bytes of the spool from `pos` into `out`: by os.copy_file_range where `out` is a file (the page cache
        copies them; ~1 s of a 600 MB report through Python), else read and written a block at a time."""
        fileno = getattr(out, "fileno", None)
        if n > 0 and fileno is not None and hasattr(os, "copy_file_range"):
            out.flush()  # type: ignore[attr-defined]
            try:
                fd = fileno()
                while n > 0:
                    done = os.copy_file_range(self.file.fileno(), fd, min(n, 1 << 30), pos)
                    if not done:
                        raise OSError("the report's spool file was cut short")
                    pos, n = pos + done, n - done
            except OSError as exc:  # no such copy here (io.UnsupportedOperation among them): read and write the rest
                if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO):
                    raise
        self.file.seek(pos)
        while n > 0:
            chunk = self.file.read(min(n, _COPY_BLOCK))
            if not chunk:
                raise OSError("the report's spool file was cut short")
            out.write(chunk)
            n -= len(chunk)

    def restart(self) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.at.clear()
        self.size = 0
        self.spans = None


class ReportSpool:
    """Where a streamed comparison (compare/stream.py's RowSink) hands its rows: each row written into the --json
    and --csv reports' temp spools as it is made (as `write_compare_json` and `write_csv` write it), and the reports
    put together from them once the verdict is known (`write_compare_json(result, fh, spool)`), the rows the verdict
    labelled written again with their label.

    Past _WRITER_FROM rows, a writer process (render/report_rows.py) encodes the rows on another CPU: building and
    encoding them here took a quarter of a long comparison's time with --json, and more than half with --csv. Until
    it is up, and wherever it cannot be started, they are encoded here. `close` ends it (a comparison that failed)."""

    def __init__(self, json_rows: bool, csv_rows: bool) -> None:
        self.json = _Spool() if json_rows else None
        self.csv = _Spool() if csv_rows else None
        self._rows: list[tuple] = []  # rows (`row_values`) not yet in the spools (at most _JSON_ROWS), from _first
        self._first = 0
        self._writer: RowsWriter | None = None  # started at row _WRITER_FROM; rows go to it once it is ready
        self._tried = False  # whether a writer was started (once)
        self._handed = False  # whether rows went to the writer (then this process writes no row to the spools)

    def add(self, index: int, row: Row) -> None:
        if self.json is None and self.csv is None:
            return
        if self._rows and index != self._first + len(self._rows):
            self._write()
        if not self._rows:
            self._first = index
        self._rows.append(row_values(index, row))
        if len(self._rows) >= _JSON_ROWS:
            self._write()

    def _write(self) -> None:
        """The rows held: to the writer process once it is ready, else into the spools here."""
        if not self._rows:
            return
        if not self._tried and self._first >= _WRITER_FROM:
            self._tried = True
            try:
                self._writer = RowsWriter(*(None if s is None else s.file for s in (self.json, self.csv)))
            except OSError:  # (no writer here: the rows are written by this process)
                pass
        if self._writer is not None and not self._handed:
            # rows go to the writer once it is up; at 2 x _WRITER_FROM rows, wait for it (it starts in ~0.3 s)
            self._handed = self._writer.ready(_WRITER_WAIT_S if self._first >= 2 * _WRITER_FROM else 0.0)
            if not self._handed and (self._writer.failed or self._first >= 2 * _WRITER_FROM):  # rows stay here
                self._writer.close()
                self._writer = None
        if self._handed and self._writer is not None:
            self._writer.send(self._first, self._rows)
        else:
            fields = [RowFields(*values) for values in self._rows]
            if self.json is not None:
                self.json.add_rows(self._first, json_row_bytes(fields))
            if self.csv is not None:
                self.csv.add_rows(self._first, csv_row_bytes(fields))
        self._rows = []

    def flush(self) -> None:
        """The rows held into the spools, the writer process's included (before they are read)."""
        self._write()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            if self._handed:
                for spool, spans in zip((self.json, self.csv), writer.finish()):
                    if spool is not None and spans is not None:
                        spool.spans, spool.size = spans, spans.end
            else:
                writer.close()

    def settled(self, index: int) -> None:
        """Row `index` gets no label: where it starts need not be kept."""
        if self._rows and index >= self._first:
            self._write()
        for spool in (self.json, self.csv):
            if spool is not None:
                spool.at.pop(index, None)

    def restart(self) -> None:
        self.close()
        self._rows = []
        self._tried = self._handed = False
        for spool in (self.json, self.csv):
            if spool is not None:
                spool.restart()

    def close(self) -> None:
        """End the writer process, if one runs (its rows unwanted)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def patches(self, result: CompareResult, csv_rows: bool) -> dict[int, bytes]:
        """The rows the verdict labelled, as they are written with their label (JSON rows a block at a time)."""
        encode = csv_row_bytes if csv_rows else json_row_bytes
        labelled = list(result.verdict.labels)
        out: dict[int, bytes] = {}
        for at in range(0, len(labelled), _JSON_ROWS):
            block = labelled[at:at + _JSON_ROWS]
            out.update(zip(block, encode([result.row_record(i) for i in block])))
        return out

