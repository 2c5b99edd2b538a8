"""The rows of compare's JSON and CSV reports: each a `RowFields` as a line of msgspec's compact JSON, or as a CSV
row; and, for a long streamed comparison, a writer process that encodes them on another CPU while the comparison
goes on.

The writer (`RowsWriter`, run as `python -m aligner.render.report_rows`) takes each row's values as a msgpack array
(~0.2 us a row to send, where building and encoding its JSON here took ~2.5, and its CSV row ~25: msgpack writes
floats as bytes, not text). It appends the rows' JSON lines (`json_row_bytes`) and CSV rows (`csv_row_bytes`) to the
spool files it was handed, and where each row starts to an offsets file per spool. The functions are the ones this
process uses for the rows it writes itself: the reports' bytes do not depend on who wrote them.
"""
from __future__ import annotations

import array
import csv
import gc
import json
import operator
import os
import select
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, BinaryIO

import msgspec

from aligner.core.errors import AlignerError
from aligner.core.text import spreadsheet_text
from aligner.pipelines.compare.result import RowFields, as_fields
from aligner.render.jsonout import jsonable

_ROW_ENCODER = msgspec.json.Encoder()
# the row fields that may hold a non-finite float (JSON has none: jsonable writes it as a string)
_FLOAT_FIELDS = ("mismatch_fraction", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "cosine", "sqnr_db",
                 "rel_l2_err", "rtol", "atol", "noise_abs", "noise_rel", "above_noise")
_HEAD = struct.Struct("<QQQ")  # a frame to the writer: its first row's index, its kind, its bytes' length
_ROWS, _LINES = 0, 1  # frame kinds: rows as msgpack; the rows' JSON lines and CSV rows made by the sender
CSV_FIELDS = ["row", "module", "module_a", "type", "kind", "io", "index", "step", "matched_by", "status", "label",
              "shape_a", "shape_b", "dtype_a", "dtype_b", "method", "numel", "mismatched", "mismatch_fraction",
              "max_abs_err", "max_abs_index", "max_rel_err", "mean_abs_err", "rmse", "cosine", "sqnr_db",
              "rel_l2_err", "nan_a", "nan_b", "inf_a", "inf_b", "rtol", "atol", "error"]
_CSV_VALUES = operator.attrgetter(*CSV_FIELDS)  # (every one a RowFields field: the metrics' UNSET when absent)
_OFFSET = struct.Struct("<q")  # the offsets file: where each row's line starts in the spool
_READY = b"r"  # the writer's word that it is up


def row_bytes(row: RowFields) -> bytes:
    """One row as compact JSON, by msgspec: a non-finite number as the string "nan", "inf" or "-inf" (as `jsonable`
    writes it), a row msgspec cannot encode (a name holding a lone surrogate, which no UTF-8 encoder takes) by json's
    encoder, which writes its escape."""
    data: Any = row
    for key in _FLOAT_FIELDS:
        value = getattr(row, key, None)
        if value.__class__ is float and value - value != 0.0:  # inf - inf and nan - nan are nan
            data = jsonable(as_fields(row))
            break
    try:
        return _ROW_ENCODER.encode(data)
    except UnicodeEncodeError:
        return json.dumps(jsonable(as_fields(row))).encode()


def rows_lines(rows: list[RowFields]) -> bytes:
    """Rows as `row_bytes` writes them, each ending in a newline, by one msgspec call for them all (~0.4 us a row
    where a call each took ~1.5): msgspec writes a non-finite number as null, so a row with more nulls than None
    fields, or a block msgspec cannot encode, is written row by row by `row_bytes`."""
    try:
        data = _ROW_ENCODER.encode_lines(rows)
    except UnicodeEncodeError:
        return b"".join([row_bytes(row) + b"\n" for row in rows])
    nones = [msgspec.structs.astuple(row).count(None) for row in rows]
    if data.count(b"null") == sum(nones):  # (a name holding "null" only sends its block the slow way)
        return data
    lines = data.split(b"\n")
    return b"".join([line + b"\n" if line.count(b"null") == n else row_bytes(row) + b"\n"
                     for line, n, row in zip(lines, nones, rows)])


def spool_lines(rows: list[RowFields]) -> bytes:
    """`rows_lines` as a report's spool holds them: each line ending in the comma that joins it to the next."""
    return rows_lines(rows).replace(b"\n", b",\n")  # (JSON text holds no newline: a string escapes it)


def json_row_bytes(rows: list[RowFields]) -> list[bytes]:
    """Each row's line of `spool_lines`, its joining comma and newline included (what a spool holds of a row)."""
    return [line + b"\n" for line in spool_lines(rows).split(b"\n")[:-1]]


def csv_cell(value: Any) -> Any:
    """One CSV cell: a list as JSON, a number as it is (a non-finite one as "inf"/"nan"), text as spreadsheet-safe
    text (a name such as =HYPERLINK(...) gets a leading ', so opening the file runs no formula)."""
    kind = type(value)
    if kind is int or value is None:  # (the cells of most rows, answered first)
        return value
    if kind is float:
        return value if value - value == 0.0 else str(value)  # inf - inf and nan - nan are nan
    cell = jsonable(value)
    if isinstance(cell, (list, tuple)):
        return json.dumps(cell)
    return spreadsheet_text(cell) if isinstance(cell, str) and not isinstance(value, float) else cell


def csv_row_bytes(rows: list[RowFields]) -> list[bytes]:
    """Each row as its CSV line (UTF-8, ending in a newline; a name holding a newline is quoted across lines), the
    columns of CSV_FIELDS, a field the row lacks empty: what csv.DictWriter writes of `csv_cell` of its fields, ~5 us
    a row where that took ~25 (text cells are cached: most repeat)."""
    lines = _Lines()
    writer = csv.writer(lines, lineterminator="\n")
    texts: dict[str, str] = {}
    unset = msgspec.UNSET
    for row in rows:
        cells = []
        for value in _CSV_VALUES(row):
            if type(value) is str:
                text = texts.get(value)
                if text is None:
                    text = texts[value] = csv_cell(value)
                cells.append(text)
            else:
                cells.append("" if value is unset else csv_cell(value))
        writer.writerow(cells)
    return [line.encode() for line in lines]


class _Lines(list):
    """What a csv.writer writes, a row a line (it calls `write` once a row)."""

    def write(self, line: str) -> None:
        self.append(line)


class _Output:
    """One report the writer writes: its spool (shared with this process, which wrote the rows before), the offsets
    file of the rows the writer wrote, and those rows' runs."""

    def __init__(self, spool: BinaryIO) -> None:
        import tempfile

        self.spool, self.offsets = spool, tempfile.TemporaryFile()
        self.runs: list[tuple[int, int, int]] = []  # (first row, rows, index of its first offset) of each block run


class RowsWriter:
    """A writer process that appends the rows it is sent to the JSON and CSV spools it is handed (either may be None)
    from each file's position, which it shares: write nothing to them until `finish`.

    `send` hands it a block of consecutive rows; `finish` waits for it and says where the rows lie (`Spans` per
    spool). A writer that cannot be started raises OSError from the constructor (write the rows here instead); one
    that fails later raises AlignerError: its rows are lost, and the reports cannot be written."""

    def __init__(self, json_spool: BinaryIO | None, csv_spool: BinaryIO | None) -> None:
        if not sys.executable or os.name != "posix":  # (passing file descriptors needs POSIX)
            raise OSError("no Python to start a writer process with")
        self.outputs = [None if f is None else _Output(f) for f in (json_spool, csv_spool)]
        self._encoder = msgspec.msgpack.Encoder()
        self._sent = 0
        fds = [str(fd) for out in self.outputs for fd in ((out.spool.fileno(), out.offsets.fileno())
                                                           if out is not None else (-1, -1))]
        here = str(Path(__file__).resolve().parents[2])  # the writer imports this aligner, wherever it was found
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "aligner.render.report_rows", *fds], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, pass_fds=[int(fd) for fd in fds if fd != "-1"], env=env)
        self._ready = False
        self.failed = False  # it ended before it was up (then write the rows here)

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether the writer is up (it says so once its imports are done), waiting at most `timeout` seconds;
        sending before would wait on the pipe for its start (~0.3 s)."""
        if not self._ready and self._proc.stdout is not None:
            if select.select([self._proc.stdout], [], [], timeout)[0]:
                self._ready = self._proc.stdout.read(1) == _READY
                self.failed = not self._ready  # it ended without a word
        return self._ready

    def send(self, first: int, rows: list[tuple]) -> None:
        """Rows first, first + 1, ... as `RowFields` values (result.row_values): to the writer (nothing else is
        written to the spools from the first send)."""
        for out in self.outputs:
            if out is None:
                continue
            if not self._sent:
                out.spool.flush()  # what this process wrote, before the writer's rows
            run = out.runs[-1] if out.runs else None
            if run is not None and run[0] + run[1] == first:
                out.runs[-1] = (run[0], run[1] + len(rows), run[2])
            else:
                out.runs.append((first, len(rows), self._sent))
        self._sent += len(rows)
        try:
            kind, data = _ROWS, self._encoder.encode(rows)
        except UnicodeEncodeError:  # a lone surrogate in a name, which msgpack's UTF-8 refuses: the lines made here
            fields = [RowFields(*values) for values in rows]
            json_out, csv_out = self.outputs
            kind, data = _LINES, self._encoder.encode((json_row_bytes(fields) if json_out is not None else None,
                                                       csv_row_bytes(fields) if csv_out is not None else None))
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(_HEAD.pack(first, kind, len(data)) + data)
        except (BrokenPipeError, OSError) as exc:
            self.close()
            raise AlignerError(f"the report's writer process ended early ({exc}): the report cannot be written; "
                               "run the comparison again") from None

    def finish(self) -> list[Spans | None]:
        """Wait for the writer to write every row sent; where each lies in each spool. AlignerError when it
        failed."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        code = self._proc.wait()
        if code != 0:
            raise AlignerError(f"the report's writer process failed (exit status {code}): the report cannot be "
                               "written; run the comparison again")
        return [None if out is None else Spans(out.offsets, out.runs, os.fstat(out.spool.fileno()).st_size)
                for out in self.outputs]

    def close(self) -> None:
        """End the writer (its rows unwanted: a comparison that failed or read the dumps whole after all)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass


class Spans:
    """Where the rows a `RowsWriter` wrote lie in a spool: (offset, length) of a row, read from its offsets file."""

    def __init__(self, offsets: BinaryIO, runs: list[tuple[int, int, int]], end: int) -> None:
        self.offsets, self.runs, self.end = offsets, runs, end
        self.count = sum(n for _, n, _ in runs)

    def get(self, row: int) -> tuple[int, int] | None:
        """(offset, length) of a row the writer wrote; None for another."""
        for first, n, at in self.runs:
            if first <= row < first + n:
                k = at + row - first
                data = os.pread(self.offsets.fileno(), 2 * _OFFSET.size, k * _OFFSET.size)
                begin = _OFFSET.unpack_from(data)[0]
                stop = _OFFSET.unpack_from(data, _OFFSET.size)[0] if k + 1 < self.count else self.end
                return begin, stop - begin
        return None


def _read_exactly(fh: IO[bytes], n: int) -> bytes | None:
    data = fh.read(n)
    if len(data) != n:
        if data:
            raise EOFError("a frame was cut short")
        return None
    return data


def _append(spool_fd: int, offsets_fd: int, rows: list[bytes]) -> None:
    """Rows' bytes appended to a spool (at its position, shared with the parent), where each starts to its offsets
    file."""
    where = os.lseek(spool_fd, 0, os.SEEK_CUR)
    starts = array.array("q")
    for row in rows:
        starts.append(where)
        where += len(row)
    _write_all(offsets_fd, starts.tobytes())
    _write_all(spool_fd, b"".join(rows))


def main(fds: list[int]) -> None:
    """The writer: frames from stdin until it closes; each row's JSON line and CSV row appended to their spools
    (`fds`: the JSON spool and its offsets file, the CSV spool and its offsets file; -1 for a report not written)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends the parent, whose pipe's end ends this
    gc.disable()  # rows form no cycles
    json_fd, json_offsets, csv_fd, csv_offsets = fds
    stdin = sys.stdin.buffer
    sys.stdout.buffer.write(_READY)
    sys.stdout.buffer.flush()
    while (head := _read_exactly(stdin, _HEAD.size)) is not None:
        _, kind, size = _HEAD.unpack(head)
        data = _read_exactly(stdin, size)
        if data is None:
            raise EOFError("a frame was cut short")
        if kind == _ROWS:
            fields = [RowFields(*values) for values in msgspec.msgpack.decode(data)]
            json_rows = json_row_bytes(fields) if json_fd >= 0 else []
            csv_rows = csv_row_bytes(fields) if csv_fd >= 0 else []
        else:
            json_rows, csv_rows = msgspec.msgpack.decode(data)
        if json_fd >= 0:
            _append(json_fd, json_offsets, json_rows)
        if csv_fd >= 0:
            _append(csv_fd, csv_offsets, csv_rows)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


if __name__ == "__main__":
    main([int(fd) for fd in sys.argv[1:5]])
