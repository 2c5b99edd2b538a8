"""safetensors reader/writer over mmap: zero-copy, streaming, with bfloat16 (which safetensors' numpy binding lacks).

The format is an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the
raw little-endian tensor bytes. Files written here load with `safetensors.safe_open` (checked by the tests).
"""
from __future__ import annotations

import json
import mmap
import struct
from typing import Iterable

import numpy as np

from aligner.core.dtypes import SAFETENSORS_CODE, canonical, contiguous, to_numpy
from aligner.core.errors import AlignerError
from aligner.io.base import TensorInfo, TensorSource

_CODE_TO_CANON = {code: name for name, code in SAFETENSORS_CODE.items()}


class SafetensorsSource(TensorSource):
    """A .safetensors file; the header's `__metadata__.framework` (written by aligner) gives the naming convention."""

    format = "safetensors"

    def __init__(self, path: str) -> None:
        super().__init__(path, None)
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size < 8:
                raise AlignerError(f"{path}: truncated safetensors file ({size} bytes)")
            fh.seek(0)
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if hlen > size - 8:
                raise AlignerError(f"{path}: truncated or corrupted safetensors file "
                                   f"(header length {hlen} > file size)")
            try:
                header = json.loads(fh.read(hlen))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise AlignerError(f"{path}: corrupted safetensors header ({exc})") from None
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + hlen else None
        meta = header.pop("__metadata__", None) or {}
        self.framework = meta.get("framework") or ("mindspore" if meta.get("format") == "ms" else None)
        self._base = 8 + hlen
        self._spans: dict[str, tuple[int, int]] = {}
        data_len = size - self._base
        for name, entry in sorted(header.items(), key=lambda kv: kv[1].get("data_offsets", [0])[0]):
            try:
                dtype = _CODE_TO_CANON[entry["dtype"]]
                shape = tuple(int(s) for s in entry["shape"])
                begin, end = (int(x) for x in entry["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise AlignerError(f"{path}: unsupported or malformed header entry for {name!r}: {entry}") from None
            if end > data_len or end - begin != int(np.prod(shape, dtype=np.int64)) * to_numpy(dtype).itemsize:
                raise AlignerError(f"{path}: truncated or corrupted safetensors file (tensor {name!r} out of bounds)")
            self.infos[name] = TensorInfo(shape, dtype)
            self._spans[name] = (begin, end)
        self.file_backed = True

    def _load(self, name: str) -> np.ndarray:
        begin, end = self._spans[name]
        info = self.infos[name]
        if end == begin or self._mm is None:  # no data section (a file of empty tensors) has no mapping
            return np.zeros(info.shape, to_numpy(info.dtype))
        return np.frombuffer(self._mm, to_numpy(info.dtype), count=info.numel,
                             offset=self._base + begin).reshape(info.shape)

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # views still alive; the mapping goes when they do
                pass


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
