"""The interface every checkpoint reader implements: names in file order, lazy per-tensor access.

Readers of formats with a plain data layout (safetensors, .ckpt, .npy) read with pread into memory they own, never
through a memory map: a file truncated by another process while it is read would raise SIGBUS inside a numpy copy,
which Python cannot catch. A short read is one clear `AlignerError` instead.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import mmap
import os
from typing import Iterator

import numpy as np

from aligner.core.dtypes import canonical, contiguous, to_numpy
from aligner.core.errors import AlignerError
from aligner.core.files import open_fd

_libc = ctypes.CDLL(None, use_errno=True)
_PAGE = mmap.PAGESIZE
INT64_MAX = (1 << 63) - 1
READ_BLOCK = 4 << 20  # bytes per pread when a tensor is streamed in chunks


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Shape and canonical dtype of one stored tensor, known without reading its data."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * to_numpy(self.dtype).itemsize


def checked_info(path: str, name: str, shape: object, dtype: object) -> TensorInfo:
    """A TensorInfo from untrusted header fields: a supported dtype, at most 64 whole dims >= 0 whose nonzero ones
    span at most 2**63 - 1 bytes (numpy refuses larger shapes even with a zero dim)."""
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                       for d in shape):
        raise AlignerError(f"{path}: tensor {name!r} has a malformed shape {str(shape)[:80]}")
    if any(d < 0 for d in shape):
        raise AlignerError(f"{path}: tensor {name!r} has a negative dimension in shape {tuple(shape)}")
    try:
        canon = canonical(dtype)
    except AlignerError as exc:
        raise AlignerError(f"{path}: tensor {name!r}: {exc}") from None
    if len(shape) > 64 or math.prod(d or 1 for d in shape) * to_numpy(canon).itemsize > INT64_MAX:
        raise AlignerError(f"{path}: tensor {name!r} declares an impossible shape (more than 64 dims, or more "
                           f"than 2**63 bytes): {str(tuple(shape))[:120]}")
    return TensorInfo(tuple(shape), canon)


class TensorSource:
    """A checkpoint opened for reading. Subclasses fill `infos` (file order) and implement `_load`.

    `framework` is the naming convention of the names ("pytorch" or "mindspore"), None when unknown (safetensors
    and npy files may hold either). `notes` are facts worth showing the user (nesting key, skipped entries, tied
    weights).
    """

    format: str = ""

    def __init__(self, path: str, framework: str | None) -> None:
        self.path = path
        self.framework = framework
        self.infos: dict[str, TensorInfo] = {}
        self.notes: list[str] = []
        self.tied: dict[str, str] = {}   # name -> earlier name sharing the same storage
        self.file_backed = False         # arrays are read-only views on a file mapping (pages can be dropped)

    @property
    def names(self) -> list[str]:
        return list(self.infos)

    def info(self, name: str) -> TensorInfo:
        return self.infos[name]

    def get(self, name: str) -> np.ndarray:
        """The tensor as a numpy array in native byte order."""
        return self._load(name)

    def chunks(self, name: str, size: int) -> Iterator[np.ndarray]:
        """The tensor's elements as flat pieces of at most `size` elements, in storage order (for order-independent
        reductions such as statistics). A piece is valid only until the next one is taken (buffers are reused)."""
        flat = contiguous(self.get(name)).reshape(-1)
        for start in range(0, flat.size, size):
            piece = flat[start:start + size]
            yield piece
            self.release(piece)  # a file-backed view: its pages leave memory piece by piece

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self.infos:
            yield name, self.get(name)

    def release(self, array: np.ndarray) -> None:
        """Drop the file pages behind a view from this process's memory once it has been consumed."""
        if self.file_backed:
            drop_pages(array)

    def _load(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        """Release file handles and mappings."""

    def __enter__(self) -> "TensorSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArraySource(TensorSource):
    """Tensors already held as numpy arrays (an in-memory state dict)."""

    format = "npy"

    def __init__(self, path: str, framework: str | None, arrays: dict[str, np.ndarray]) -> None:
        super().__init__(path, framework)
        self._arrays = arrays
        self.infos = {name: TensorInfo(tuple(a.shape), canonical(a.dtype)) for name, a in arrays.items()}

    def _load(self, name: str) -> np.ndarray:
        return self._arrays[name]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a tensor's bytes lie in its file: (offset, length) pieces in element order, and the stored dtype
    (possibly non-native byte order); `fortran` for a column-major .npy."""

    pieces: tuple[tuple[int, int], ...]
    stored: np.dtype
    fortran: bool = False


class FileSource(TensorSource):
    """A reader whose tensors are byte ranges of one file, read with pread into arrays it owns (no memory map)."""

    def __init__(self, path: str, framework: str | None) -> None:
        super().__init__(path, framework)
        self.layouts: dict[str, Layout] = {}
        self._fd = open_fd(path)  # a regular file, else refused before it is opened
        self.size = os.fstat(self._fd).st_size

    def add(self, name: str, info: TensorInfo, layout: Layout) -> None:
        """Register a tensor, checking its pieces lie inside the file and hold exactly its shape's bytes."""
        have = sum(n for _, n in layout.pieces)
        if have != info.nbytes:
            raise AlignerError(f"{self.path}: tensor {name!r} has {have} bytes of data, its shape "
                               f"{info.shape} needs {info.nbytes}")
        if any(start < 0 or n < 0 or start + n > self.size for start, n in layout.pieces):
            raise AlignerError(f"{self.path}: truncated or corrupted file (tensor {name!r} lies outside the file)")
        self.infos[name] = info
        self.layouts[name] = layout

    def read_into(self, buffer: memoryview, offset: int) -> None:
        """Fill `buffer` from the file at `offset`; a short read (the file shrank meanwhile) is an AlignerError."""
        done = 0
        while done < len(buffer):
            got = os.preadv(self._fd, [buffer[done:]], offset + done)
            if got <= 0:
                raise AlignerError(f"{self.path}: file ended early while being read (truncated or replaced by "
                                   "another process?)")
            done += got

    def _load(self, name: str) -> np.ndarray:
        info, layout = self.infos[name], self.layouts[name]
        out = np.empty(info.numel, layout.stored)
        raw = out.view(np.uint8).data
        pos = 0
        for start, n in layout.pieces:
            self.read_into(raw[pos:pos + n], start)
            pos += n
        native = out if layout.stored.isnative else out.astype(layout.stored.newbyteorder("="))
        if layout.fortran:
            return native.reshape(info.shape[::-1]).transpose()
        return native.reshape(info.shape)

    def chunks(self, name: str, size: int) -> Iterator[np.ndarray]:
        layout = self.layouts[name]
        item = layout.stored.itemsize
        block = np.empty(max(1, min(size, READ_BLOCK // item)), layout.stored)
        raw = block.view(np.uint8).data
        for start, n in layout.pieces:  # pieces hold whole elements (checked by the readers)
            for off in range(0, n, len(raw)):
                part = min(len(raw), n - off)
                self.read_into(raw[:part], start + off)
                piece = block[:part // item]
                yield piece if layout.stored.isnative else piece.astype(layout.stored.newbyteorder("="))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def drop_pages(array: np.ndarray) -> None:
    """madvise(DONTNEED) the whole pages inside a read-only file-backed view once read, so RSS stays at one block,
    not one tensor (a no-op for small views; failures are harmless)."""
    if array.nbytes < 4 * _PAGE:
        return
    start = array.__array_interface__["data"][0]
    first = -(-start // _PAGE) * _PAGE
    last = (start + array.nbytes) // _PAGE * _PAGE
    if last > first:
        _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # MADV_DONTNEED
