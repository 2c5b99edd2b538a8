"""The reports' rows (render/report_rows.py): a block's CSV rows are the rows csv.DictWriter writes one at a time;
the writer process appends to each spool the bytes this process writes for the same rows (`spool_lines`,
`csv_row_bytes`), where each row lies is read back exactly, and a writer that dies is one AlignerError, never a
report with rows missing."""
from __future__ import annotations

import csv
import io
import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest

import aligner
from aligner.core.errors import AlignerError
from aligner.pipelines.compare.result import RowFields, as_fields, row_values
from aligner.render.report_rows import CSV_FIELDS, RowsWriter, csv_cell, csv_row_bytes, spool_lines
from tests.support.compare_fixtures import write_dump

STARTS_S = 60.0  # a writer says it is up within ~0.3 s; a loaded CI machine gets a wide margin
NAMES = {3: "null", 41: "bad\ud800name", 12: "=HYPERLINK(\"x\")", 20: "two\nlines", 30: "-minus", 33: "日本"}


def _rows(tmp_path: Path) -> list[tuple]:
    """The rows (`row_values`, what a writer is sent) of a real comparison: clean, diverged, an infinite error (JSON
    has no inf: written another way), and names that are hostile to the formats: "null", a lone surrogate (which no
    UTF-8 encoder takes), a spreadsheet formula, a newline, a leading minus, non-ASCII."""
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    names = [NAMES.get(i, f"m.{i}") for i in range(60)]
    a = [{"module": name, "array": x * (1.5 if i % 7 == 2 else 1)} for i, name in enumerate(names)]
    b = [{"module": name, "array": x * 0 if i in (9, 50) else x} for i, name in enumerate(names)]
    result = aligner.compare(write_dump(tmp_path / "a", "mindspore", a, mode="stats"),
                             write_dump(tmp_path / "b", "pytorch", b, mode="stats"))
    assert any(r.metrics is not None and r.metrics.rel_l2_err == float("inf") for r in result.rows)
    return [row_values(i, row) for i, row in enumerate(result.rows)]


def _json(rows: list[tuple]) -> bytes:
    return spool_lines([RowFields(*values) for values in rows])


def _csv(rows: list[tuple]) -> bytes:
    return b"".join(csv_row_bytes([RowFields(*values) for values in rows]))


def test_csv_rows_are_what_dictwriter_writes(tmp_path: Path) -> None:
    """A block's CSV rows, each its own bytes, are the rows csv.DictWriter writes row by row from the same fields
    (`csv_cell` of each; a field the row lacks empty), hostile names included: the formula and the minus get a
    leading ', the newline stays inside one quoted cell, the surrogate is shown as its escape."""
    fields = [RowFields(*values) for values in _rows(tmp_path)]
    text = io.StringIO()
    writer = csv.DictWriter(text, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    for row in fields:
        writer.writerow({k: csv_cell(v) for k, v in as_fields(row).items()})
    got = csv_row_bytes(fields)
    assert len(got) == len(fields)
    assert b"".join(got) == text.getvalue().encode()
    parsed = list(csv.reader(io.StringIO(b"".join(got).decode())))
    assert [p[1] for p in parsed] == ["'=HYPERLINK(\"x\")" if n == NAMES[12] else "'-minus" if n == NAMES[30] else
                                      "bad\\ud800name" if n == NAMES[41] else n for n in (r.module for r in fields)]


def test_writer_writes_what_this_process_writes(tmp_path: Path) -> None:
    """Rows written here first, then two runs of rows sent to the writer: each spool holds exactly `spool_lines` /
    `csv_row_bytes` of them all in that order, and each sent row's span is its own line."""
    rows = _rows(tmp_path)
    with tempfile.TemporaryFile() as json_spool, tempfile.TemporaryFile() as csv_spool:
        json_spool.write(_json(rows[:5]))
        csv_spool.write(_csv(rows[:5]))
        writer = RowsWriter(json_spool, csv_spool)
        assert writer.ready(STARTS_S)
        writer.send(5, rows[5:40])
        writer.send(40, rows[40:])  # the next rows: one run with the block before
        writer.send(1000, rows[:3])  # another run
        spans = writer.finish()
        for spool, spans_, encode in ((json_spool, spans[0], _json), (csv_spool, spans[1], _csv)):
            spool.seek(0)
            data = spool.read()
            assert data == encode(rows) + encode(rows[:3])
            assert spans_ is not None and spans_.end == len(data)
            for i, row in [(i, rows[i]) for i in range(5, len(rows))] + [(1000 + k, rows[k]) for k in range(3)]:
                got = spans_.get(i)
                assert got is not None
                offset, length = got
                assert data[offset:offset + length] == encode([row]), i
            assert spans_.get(4) is None and spans_.get(1003) is None  # written here, and never written


def test_writer_of_one_report(tmp_path: Path) -> None:
    """A writer for the JSON report alone writes no CSV, and says so (no spans for it)."""
    rows = _rows(tmp_path)
    with tempfile.TemporaryFile() as json_spool:
        writer = RowsWriter(json_spool, None)
        assert writer.ready(STARTS_S)
        writer.send(0, rows)
        json_spans, csv_spans = writer.finish()
        json_spool.seek(0)
        assert json_spool.read() == _json(rows) and csv_spans is None and json_spans is not None


def test_writer_that_dies_is_one_error(tmp_path: Path) -> None:
    """A writer killed while rows are sent to it (the kernel's OOM killer, a kill by hand): the next send or the
    finish raises AlignerError naming the writer, and nothing waits forever."""
    rows = _rows(tmp_path)
    with tempfile.TemporaryFile() as spool:
        writer = RowsWriter(spool, None)
        assert writer.ready(STARTS_S)
        writer.send(0, rows[:10])
        os.kill(writer._proc.pid, signal.SIGKILL)
        with pytest.raises(AlignerError, match="writer process"):
            for _ in range(1000):  # a pipe's buffer may take a few blocks before the dead end shows
                writer.send(10, rows)
            writer.finish()
        writer.close()


def test_closed_writer_leaves_no_process(tmp_path: Path) -> None:
    """close() (a comparison that failed or fell back to reading whole) ends a writer that is still waiting for
    rows: its process is gone, reaped."""
    with tempfile.TemporaryFile() as spool:
        writer = RowsWriter(None, spool)
        assert writer.ready(STARTS_S)
        pid = writer._proc.pid
        writer.close()
        assert writer._proc.returncode is not None
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no child of that pid is left
