"""MindSpore .ckpt reader/writer that streams the protobuf wire format itself, without importing MindSpore.

A .ckpt is a sequence of `Checkpoint{repeated Value value = 1}` messages; each `Value{tag = 1, tensor = 2}` carries
`TensorProto{repeated int64 dims = 1, string tensor_type = 2, bytes tensor_content = 3}`, and a large tensor is split
into several Values with the same tag (as `mindspore.save_checkpoint` does). An optional `crc_num` trailer may follow.
Reading walks the fields with pread (never a memory map: a file truncated meanwhile would raise SIGBUS) and reads each
tensor's pieces into one array; writing emits one Value per chunk straight from the array's buffer, so neither
direction holds the checkpoint in memory twice. The tests load our files with `mindspore.load_checkpoint`.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np

from aligner.core.dtypes import MINDSPORE_NAME, canonical, contiguous, to_numpy
from aligner.core.errors import AlignerError
from aligner.io.base import FileSource, Layout, checked_info

_MS_TO_CANON = {ms: canon for canon, ms in MINDSPORE_NAME.items()}
CHUNK = 256 * 1024 * 1024  # bytes of tensor content per Value (MindSpore uses 512 MiB)
_CRC_TRAILER = 17          # b"crc_num" + 10-byte big-endian number


class _FileBytes:
    """A file's bytes indexed like a buffer (`fb[i]`, `fb[a:b]`), read with pread a window at a time: the protobuf
    walker reads only the small fields and skips tensor contents, and never maps the file."""

    _WINDOW = 1 << 16

    def __init__(self, source: FileSource) -> None:
        self._source = source
        self._start = 0
        self._data = b""

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            out = bytearray(key.stop - key.start)
            self._source.read_into(memoryview(out), key.start)
            return bytes(out)
        if not self._start <= key < self._start + len(self._data):
            window = bytearray(max(0, min(self._WINDOW, self._source.size - key)))
            self._source.read_into(memoryview(window), key)
            self._start, self._data = key, bytes(window)
        return self._data[key - self._start]


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: Any, pos: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """Yield (field number, wire type, value or (start, stop) span) for each field in buf[pos:end]."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield field, wire, value
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise ValueError("length-delimited field runs past the end")
            yield field, wire, (pos, pos + length)
            pos += length
        else:
            raise ValueError(f"unexpected wire type {wire}")


class MindSporeCkptSource(FileSource):
    """A MindSpore .ckpt file (unencrypted; map tensors are not supported)."""

    format = "mindspore"

    def __init__(self, path: str) -> None:
        super().__init__(path, "mindspore")
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        if self.size == 0:
            raise AlignerError(f"{self.path}: empty checkpoint file")
        buf = _FileBytes(self)
        end = self.size
        if end >= _CRC_TRAILER and buf[end - _CRC_TRAILER:end - 10] == b"crc_num":
            end -= _CRC_TRAILER
            self.notes.append("has a crc_num trailer (not verified)")
        try:
            found = self._index(buf, end)
        except ValueError as exc:
            raise AlignerError(f"{self.path}: not a readable MindSpore checkpoint (truncated, corrupted or "
                               f"encrypted: {exc})") from None
        for tag, (dims, ttype, pieces) in found.items():
            if any(d >= 1 << 63 for d in dims):
                negative = tuple(d - (1 << 64) if d >= 1 << 63 else d for d in dims)
                raise AlignerError(f"{self.path}: tensor {tag!r} has a negative dimension in shape {negative}")
            stored = to_numpy(_MS_TO_CANON[ttype])
            data = sum(n for _, n in pieces)
            # MindSpore writes a scalar as dims [0] with one element of data; [0] with no data is an empty vector
            shape = () if dims == [0] and data == stored.itemsize else tuple(dims)
            if any(n % stored.itemsize for _, n in pieces):
                raise AlignerError(f"{self.path}: tensor {tag!r} is split inside an element")
            self.add(tag, checked_info(self.path, tag, shape, _MS_TO_CANON[ttype]), Layout(tuple(pieces), stored))

    @staticmethod
    def _index(buf: Any, end: int) -> dict[str, tuple[list[int], str, list[tuple[int, int]]]]:
        """{tag: (raw dims, tensor type, [(offset, length)] of its content pieces)} in file order."""
        found: dict[str, tuple[list[int], str, list[tuple[int, int]]]] = {}
        for field, wire, span in _fields(buf, 0, end):
            if field != 1 or wire != 2:
                raise ValueError(f"unexpected top-level field {field}")
            tag = None
            tensor = None
            for vf, vw, vspan in _fields(buf, *span):
                if vf == 1 and vw == 2:
                    tag = buf[vspan[0]:vspan[1]].decode("utf-8")
                elif vf == 2 and vw == 2:
                    tensor = vspan
                elif vf == 3:
                    raise ValueError("map tensors are not supported")
            if tag is None or tensor is None:
                raise ValueError("a value without tag or tensor")
            dims: list[int] = []
            ttype = None
            content = (0, 0)
            for tf, tw, tval in _fields(buf, *tensor):
                if tf == 1 and tw == 0:
                    dims.append(tval)
                elif tf == 1 and tw == 2:  # packed dims
                    pos, stop = tval
                    while pos < stop:
                        dim, pos = _varint(buf, pos, stop)
                        dims.append(dim)
                elif tf == 2 and tw == 2:
                    ttype = buf[tval[0]:tval[1]].decode("ascii")
                elif tf == 3 and tw == 2:
                    content = tval
            if ttype not in _MS_TO_CANON:
                raise ValueError(f"tensor {tag!r} has unsupported type {ttype!r}")
            if tag not in found:
                found[tag] = (dims, ttype, [])
            elif found[tag][:2] != (dims, ttype):
                raise ValueError(f"the pieces of tensor {tag!r} disagree on its shape or type")
            found[tag][2].append((content[0], content[1] - content[0]))
        return found


def _enc_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(field: int, length: int) -> bytes:
    return _enc_varint(field << 3 | 2) + _enc_varint(length)


def write_ckpt(fh, items: Iterable[tuple[str, np.ndarray]]) -> None:
    """Stream (name, array) pairs into an open binary file in MindSpore's .ckpt layout."""
    for name, array in items:
        array = contiguous(array)
        ttype = MINDSPORE_NAME[canonical(array.dtype)].encode()
        dims = b"".join(b"\x08" + _enc_varint(d) for d in (array.shape or (0,)))
        tag = name.encode("utf-8")
        raw = array.reshape(-1).view(np.uint8).data
        # split on element boundaries, as MindSpore does, so each chunk holds whole elements
        step = max(CHUNK // max(array.itemsize, 1) * max(array.itemsize, 1), array.itemsize or 1)
        for start in range(0, max(len(raw), 1), step):
            part = raw[start:start + step]
            tensor = dims + _len_field(2, len(ttype)) + ttype + _len_field(3, len(part))
            tensor_len = len(tensor) + len(part)
            value_head = _len_field(1, len(tag)) + tag + _len_field(2, tensor_len)
            fh.write(_len_field(1, len(value_head) + tensor_len) + value_head + tensor)
            fh.write(part)
