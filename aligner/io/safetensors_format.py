"""safetensors reader/writer: streaming, with bfloat16 (which safetensors' numpy binding lacks).

The format is an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the
raw little-endian tensor bytes. Files written here load with `safetensors.safe_open` (checked by the tests).
"""
from __future__ import annotations

import json
import struct
from typing import Iterable

import numpy as np

from aligner.core.dtypes import SAFETENSORS_CODE, canonical, contiguous, to_numpy
from aligner.core.errors import AlignerError
from aligner.core.nesting import json_loads
from aligner.io.base import FileSource, Layout, TensorInfo, checked_info

_CODE_TO_CANON = {code: name for name, code in SAFETENSORS_CODE.items()}


MAX_HEADER = 100_000_000  # bytes: safetensors' own limit on the JSON header


class SafetensorsSource(FileSource):
    """A .safetensors file; the header's `__metadata__.framework` (written by aligner) gives the naming convention."""

    format = "safetensors"

    def __init__(self, path: str) -> None:
        super().__init__(path, None)
        try:
            self._index()
        except BaseException:
            self.close()
            raise

    def _index(self) -> None:
        path, size = self.path, self.size
        if size < 8:
            raise AlignerError(f"{path}: truncated safetensors file ({size} bytes)")
        head = bytearray(8)
        self.read_into(memoryview(head), 0)
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(size - 8, MAX_HEADER):
            raise AlignerError(f"{path}: truncated or corrupted safetensors file (header length {hlen} > "
                               f"{'file size' if hlen > size - 8 else f'the {MAX_HEADER} byte limit'})")
        text = bytearray(hlen)
        self.read_into(memoryview(text), 8)
        try:
            header = json_loads(text)
        except ValueError as exc:  # not UTF-8, not JSON, or nested too deep
            raise AlignerError(f"{path}: corrupted safetensors header ({str(exc)[:120]})") from None
        if not isinstance(header, dict):
            raise AlignerError(f"{path}: corrupted safetensors header (a JSON {type(header).__name__}, expected an "
                               "object)")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise AlignerError(f"{path}: corrupted safetensors header (__metadata__ is not an object)")
        framework = meta.get("framework")
        self.framework = framework if isinstance(framework, str) and framework else \
            "mindspore" if meta.get("format") == "ms" else None
        base = 8 + hlen
        entries = [(name, *self._entry(name, entry, size - base)) for name, entry in header.items()]
        for name, info, begin, end in sorted(entries, key=lambda e: e[2]):
            self.add(name, info, Layout(((base + begin, end - begin),), to_numpy(info.dtype).newbyteorder("<")))

    def _entry(self, name: str, entry: object, data_len: int) -> tuple[TensorInfo, int, int]:
        """(info, begin, end) of one header entry, checked: known dtype, sane shape, offsets inside the data."""
        path = self.path
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) \
                or entry["dtype"] not in _CODE_TO_CANON:
            raise AlignerError(f"{path}: unsupported or malformed header entry for {name!r}: {str(entry)[:120]}")
        info = checked_info(path, name, entry.get("shape"), _CODE_TO_CANON[entry["dtype"]])
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)):
            raise AlignerError(f"{path}: malformed data_offsets for {name!r}: {str(offsets)[:80]}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise AlignerError(f"{path}: truncated or corrupted safetensors file (tensor {name!r} at bytes "
                               f"{begin}..{end} of a {data_len}-byte data section)")
        if end - begin != info.nbytes:
            raise AlignerError(f"{path}: corrupted safetensors header (tensor {name!r} spans {end - begin} bytes, "
                               f"its shape {info.shape} needs {info.nbytes})")
        return info, begin, end


def write_safetensors(fh, items: Iterable[tuple[str, np.ndarray]], infos: dict[str, TensorInfo],
                      framework: str | None) -> None:
    """Stream tensors into an open binary file; `infos` (the same names, in order) lets the header go first."""
    header: dict[str, object] = {"__metadata__": {"format": "pt" if framework == "pytorch" else "ms",
                                                  "framework": framework or "unknown", "writer": "aligner"}}
    offset = 0
    for name, info in infos.items():
        nbytes = info.numel * to_numpy(info.dtype).itemsize
        header[name] = {"dtype": SAFETENSORS_CODE[info.dtype], "shape": list(info.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # align the data section to 8 bytes, as safetensors does
    fh.write(struct.pack("<Q", len(blob)))
    fh.write(blob)
    for name, array in items:
        info = infos[name]
        if canonical(array.dtype) != info.dtype or tuple(array.shape) != info.shape:
            raise AlignerError(f"internal: tensor {name} does not match its declared shape/dtype")
        fh.write(contiguous(array).reshape(-1).view(np.uint8).data)
