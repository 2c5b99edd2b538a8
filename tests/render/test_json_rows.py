"""The JSON report's writer process (render/json_rows.py RowsWriter): the bytes it appends to a spool are the bytes
this process writes for the same rows (`spool_lines`), where each row lies is read back exactly, and a writer that
dies is one AlignerError, never a report with rows missing."""
from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest

import aligner
from aligner.core.errors import AlignerError
from aligner.pipelines.compare.result import RowFields, row_values
from aligner.render.json_rows import RowsWriter, spool_lines
from tests.support.compare_fixtures import write_dump

STARTS_S = 60.0  # a writer says it is up within ~0.3 s; a loaded CI machine gets a wide margin


def _lines(rows: list[tuple]) -> bytes:
    return spool_lines([RowFields(*values) for values in rows])


def _rows(tmp_path: Path) -> list[tuple]:
    """The rows (`row_values`, what a writer is sent) of a real comparison: clean, diverged, an infinite error (JSON
    has no inf: written another way), a module named "null", and one whose name holds a lone surrogate (a block
    msgspec cannot encode)"""
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    names = [f"m.{i}" for i in range(60)]
    names[3], names[41] = "null", "bad\ud800name"
    a = [{"module": name, "array": x * (1.5 if i % 7 == 2 else 1)} for i, name in enumerate(names)]
    b = [{"module": name, "array": x * 0 if i in (9, 50) else x} for i, name in enumerate(names)]
    result = aligner.compare(write_dump(tmp_path / "a", "mindspore", a, mode="stats"),
                             write_dump(tmp_path / "b", "pytorch", b, mode="stats"))
    assert any(r.metrics is not None and r.metrics.rel_l2_err == float("inf") for r in result.rows)
    return [row_values(i, row) for i, row in enumerate(result.rows)]


def test_writer_writes_what_this_process_writes(tmp_path: Path) -> None:
    """Rows written here first, then two runs of rows sent to the writer: the spool holds exactly `spool_lines` of
    them all in that order, and each sent row's span is its own line."""
    rows = _rows(tmp_path)
    with tempfile.TemporaryFile() as spool, tempfile.TemporaryFile() as offsets:
        head = _lines(rows[:5])
        spool.write(head)
        writer = RowsWriter(spool, offsets)
        assert writer.ready(STARTS_S)
        writer.send(5, rows[5:40])
        writer.send(40, rows[40:])  # the next rows: one run with the block before
        writer.send(1000, rows[:3])  # another run
        spans = writer.finish()
        spool.seek(0)
        data = spool.read()
        assert data == head + _lines(rows[5:]) + _lines(rows[:3])
        assert spans.end == len(data)
        for i, row in [(i, rows[i]) for i in range(5, len(rows))] + [(1000 + k, rows[k]) for k in range(3)]:
            got = spans.get(i)
            assert got is not None
            offset, length = got
            assert data[offset:offset + length] == _lines([row]), i
        assert spans.get(4) is None and spans.get(1003) is None  # written here, and never written


def test_writer_that_dies_is_one_error(tmp_path: Path) -> None:
    """A writer killed while rows are sent to it (the kernel's OOM killer, a kill by hand): the next send or the
    finish raises AlignerError naming the writer, and nothing waits forever."""
    rows = _rows(tmp_path)
    with tempfile.TemporaryFile() as spool, tempfile.TemporaryFile() as offsets:
        writer = RowsWriter(spool, offsets)
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
    with tempfile.TemporaryFile() as spool, tempfile.TemporaryFile() as offsets:
        writer = RowsWriter(spool, offsets)
        assert writer.ready(STARTS_S)
        pid = writer._proc.pid
        writer.close()
        assert writer._proc.returncode is not None
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no child of that pid is left
