"""MindSpore .ckpt reader/writer that streams the protobuf wire format over mmap, without importing MindSpore.

A .ckpt is a sequence of `Checkpoint{repeated Value value = 1}` messages; each `Value{tag = 1, tensor = 2}` carries
`TensorProto{repeated int64 dims = 1, string tensor_type = 2, bytes tensor_content = 3}`, and a large tensor is split
into several Values with the same tag (as `mindspore.save_checkpoint` does). An optional `crc_num` trailer may follow.
Reading maps the file and returns zero-copy views; writing emits one Value per chunk straight from the array's buffer,
so neither direction holds the checkpoint in memory twice. The tests load our files with `mindspore.load_checkpoint`.
"""
from __future__ import annotations

import mmap
from typing import Iterable

import numpy as np

from aligner.core.dtypes import MINDSPORE_NAME, canonical, contiguous, to_numpy
from aligner.core.errors import AlignerError
from aligner.io.base import TensorInfo, TensorSource

_MS_TO_CANON = {ms: canon for canon, ms in MINDSPORE_NAME.items()}
CHUNK = 256 * 1024 * 1024  # bytes of tensor content per Value (MindSpore uses 512 MiB)
_CRC_TRAILER = 17          # b"crc_num" + 10-byte big-endian number


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
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


def _fields(buf, pos: int, end: int):
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


class MindSporeCkptSource(TensorSource):
    """A MindSpore .ckpt file (unencrypted; map tensors are not supported)."""

    format = "mindspore"

    def __init__(self, path: str) -> None:
        super().__init__(path, "mindspore")
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                raise AlignerError(f"{path}: empty checkpoint file")
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        end = size
        if size >= _CRC_TRAILER and self._mm[size - _CRC_TRAILER:size - 10] == b"crc_num":
            end -= _CRC_TRAILER
            self.notes.append("has a crc_num trailer (not verified)")
        self._chunks: dict[str, list[tuple[int, int]]] = {}
        try:
            self._index(end)
        except ValueError as exc:
            self._mm.close()
            raise AlignerError(f"{path}: not a readable MindSpore checkpoint (truncated, corrupted or encrypted: "
                               f"{exc})") from None
        self.file_backed = True

    def _index(self, end: int) -> None:
        mm = self._mm
        for field, wire, span in _fields(mm, 0, end):
            if field != 1 or wire != 2:
                raise ValueError(f"unexpected top-level field {field}")
            tag = None
            tensor = None
            for vf, vw, vspan in _fields(mm, *span):
                if vf == 1 and vw == 2:
                    tag = bytes(mm[vspan[0]:vspan[1]]).decode("utf-8")
                elif vf == 2 and vw == 2:
                    tensor = vspan
                elif vf == 3:
                    raise ValueError("map tensors are not supported")
            if tag is None or tensor is None:
                raise ValueError("a value without tag or tensor")
            dims: list[int] = []
            ttype = None
            content = (0, 0)
            for tf, tw, tval in _fields(mm, *tensor):
                if tf == 1 and tw == 0:
                    dims.append(tval)
                elif tf == 1 and tw == 2:  # packed dims
                    pos, stop = tval
                    while pos < stop:
                        dim, pos = _varint(mm, pos, stop)
                        dims.append(dim)
                elif tf == 2:
                    ttype = bytes(mm[tval[0]:tval[1]]).decode("ascii")
                elif tf == 3:
                    content = tval
            if ttype not in _MS_TO_CANON:
                raise ValueError(f"tensor {tag!r} has unsupported type {ttype!r}")
            dims = [d - (1 << 64) if d >= 1 << 63 else d for d in dims]
            shape = () if dims == [0] else tuple(dims)   # MindSpore writes scalars as dims [0]
            if tag not in self.infos:
                self.infos[tag] = TensorInfo(shape, _MS_TO_CANON[ttype])
                self._chunks[tag] = []
            self._chunks[tag].append(content)
        for tag, info in self.infos.items():
            have = sum(stop - start for start, stop in self._chunks[tag])
            need = info.numel * to_numpy(info.dtype).itemsize
            if have != need:
                raise ValueError(f"tensor {tag!r} has {have} bytes, its shape needs {need}")

    def _load(self, name: str) -> np.ndarray:
        info = self.infos[name]
        dtype = to_numpy(info.dtype)
        chunks = self._chunks[name]
        if len(chunks) == 1:
            start, stop = chunks[0]
            return np.frombuffer(self._mm, dtype, count=info.numel, offset=start).reshape(info.shape)
        out = np.empty(info.numel, dtype)
        raw = out.view(np.uint8)
        pos = 0
        for start, stop in chunks:
            raw[pos:pos + stop - start] = np.frombuffer(self._mm, np.uint8, count=stop - start, offset=start)
            pos += stop - start
        return out.reshape(info.shape)

    def close(self) -> None:
        try:
            self._mm.close()
        except BufferError:  # views still alive; the mapping goes when they do
            pass


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
