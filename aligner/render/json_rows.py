"""The rows of compare's JSON report: each a `RowFields` in msgspec's compact JSON, one a line; and, for a long
streamed comparison, a writer process that encodes them on another CPU while the comparison goes on.

The writer (`RowsWriter`, run as `python -m aligner.render.json_rows`) takes each row's values as a msgpack array
(~0.2 us a row to send, where building and encoding its JSON here took ~2.5: msgpack writes floats as bytes, not
text), and appends their JSON lines to the spool file it was handed, and where each starts to an offsets file. What
it writes is `spool_lines` of the same rows: the report's bytes do not depend on who wrote them.
"""
from __future__ import annotations

import array
import gc
import json
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
from aligner.pipelines.compare.result import RowFields, as_fields
from aligner.render.jsonout import jsonable

_ROW_ENCODER = msgspec.json.Encoder()
# the row fields that may hold a non-finite float (JSON has none: jsonable writes it as a string)
_FLOAT_FIELDS = ("mismatch_fraction", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "cosine", "sqnr_db",
                 "rel_l2_err", "rtol", "atol", "noise_abs", "noise_rel", "above_noise")
_HEAD = struct.Struct("<QQQ")  # a frame to the writer: its first row's index, its kind, its bytes' length
_ROWS, _LINES = 0, 1  # frame kinds: rows as msgpack; the rows' lines made by the sender (`spool_lines`)
_OFFSET = struct.Struct("<q")
_READY = b"r"  # the writer's word that it is up  # the offsets file: where each row's line starts in the spool


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


class RowsWriter:
    """A writer process that appends the JSON lines of the rows it is sent to `spool` (from the file's position, which
    it shares: write nothing to `spool` until `finish`), and each line's start to `offsets`.

    `send` hands it a block of consecutive rows; `finish` waits for it and says where the rows lie (`Spans`). A writer
    that cannot be started raises OSError from the constructor (write the rows here instead); one that fails later
    raises AlignerError: its rows are lost, and the report cannot be written."""

    def __init__(self, spool: BinaryIO, offsets: BinaryIO) -> None:
        self.spool, self.offsets = spool, offsets
        self._encoder = msgspec.msgpack.Encoder()
        self._runs: list[tuple[int, int, int]] = []  # (first row, rows, index of its first offset) of each block run
        self._sent = 0
        if not sys.executable or os.name != "posix":  # (passing file descriptors needs POSIX)
            raise OSError("no Python to start a writer process with")
        here = str(Path(__file__).resolve().parents[2])  # the writer imports this aligner, wherever it was found
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "aligner.render.json_rows", str(spool.fileno()), str(offsets.fileno())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            pass_fds=(spool.fileno(), offsets.fileno()), env=env)
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
        written to the spool from the first send)."""
        if not self._runs:
            self.spool.flush()  # what this process wrote, before the writer's rows
        run = self._runs[-1] if self._runs else None
        if run is not None and run[0] + run[1] == first:
            self._runs[-1] = (run[0], run[1] + len(rows), run[2])
        else:
            self._runs.append((first, len(rows), self._sent))
        self._sent += len(rows)
        try:
            kind, data = _ROWS, self._encoder.encode(rows)
        except UnicodeEncodeError:  # a lone surrogate in a name, which msgpack's UTF-8 refuses: the lines made here
            kind, data = _LINES, spool_lines([RowFields(*values) for values in rows])
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(_HEAD.pack(first, kind, len(data)) + data)
        except (BrokenPipeError, OSError) as exc:
            self.close()
            raise AlignerError(f"the JSON report's writer process ended early ({exc}): the report cannot be "
                               "written; run the comparison again") from None

    def finish(self) -> Spans:
        """Wait for the writer to write every row sent; where each lies. AlignerError when it failed."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        code = self._proc.wait()
        if code != 0:
            raise AlignerError(f"the JSON report's writer process failed (exit status {code}): the report cannot be "
                               "written; run the comparison again")
        return Spans(self.offsets, self._runs, os.fstat(self.spool.fileno()).st_size)

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
    """Where the rows a `RowsWriter` wrote lie in the spool: (offset, length) of a row, read from the offsets file."""

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


def main(spool_fd: int, offsets_fd: int) -> None:
    """The writer: frames from stdin until it closes; each row's JSON line appended to the spool, its start to the
    offsets file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends the parent, whose pipe's end ends this
    gc.disable()  # rows form no cycles
    decoder = msgspec.msgpack.Decoder(list[tuple])
    stdin = sys.stdin.buffer
    sys.stdout.buffer.write(_READY)
    sys.stdout.buffer.flush()
    while (head := _read_exactly(stdin, _HEAD.size)) is not None:
        _, kind, size = _HEAD.unpack(head)
        data = _read_exactly(stdin, size)
        if data is None:
            raise EOFError("a frame was cut short")
        lines = spool_lines([RowFields(*values) for values in decoder.decode(data)]) if kind == _ROWS else data
        where = os.lseek(spool_fd, 0, os.SEEK_CUR)  # (shared with the parent, which wrote the rows before)
        starts = array.array("q", [0])
        for line in lines.split(b"\n")[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        starts.pop()
        _write_all(offsets_fd, array.array("q", [where + s for s in starts]).tobytes())
        _write_all(spool_fd, lines)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
