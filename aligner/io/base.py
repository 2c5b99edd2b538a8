"""The interface every checkpoint reader implements: names in file order, lazy per-tensor access."""
from __future__ import annotations

import ctypes
import dataclasses
import mmap
from typing import Iterator

import numpy as np

from aligner.core.dtypes import canonical

_libc = ctypes.CDLL(None, use_errno=True)
_PAGE = mmap.PAGESIZE


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Shape and canonical dtype of one stored tensor, known without reading its data."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


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
        """The tensor as a numpy array (a zero-copy view on the file where the format allows it)."""
        return self._load(name)

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
    """Tensors already held as numpy arrays (an .npz archive, a .npy file, an in-memory state dict)."""

    format = "npy"

    def __init__(self, path: str, framework: str | None, arrays: dict[str, np.ndarray]) -> None:
        super().__init__(path, framework)
        self._arrays = arrays
        self.infos = {name: TensorInfo(tuple(a.shape), canonical(a.dtype)) for name, a in arrays.items()}

    def _load(self, name: str) -> np.ndarray:
        return self._arrays[name]


def _advise(array: np.ndarray, advice: int) -> None:
    """madvise() the whole pages inside a file-backed view (a no-op for small views; failures are harmless)."""
    if array.nbytes < 4 * _PAGE:
        return
    start = array.__array_interface__["data"][0]
    first = -(-start // _PAGE) * _PAGE
    last = (start + array.nbytes) // _PAGE * _PAGE
    if last > first:
        _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), advice)


def drop_pages(array: np.ndarray) -> None:
    """madvise(DONTNEED) a read-only file-backed view once read, so RSS stays at one block, not one tensor."""
    _advise(array, 4)  # MADV_DONTNEED


def populate_pages(array: np.ndarray) -> None:
    """madvise(POPULATE_READ) a file-backed view about to be read: one call maps its cached pages, instead of a
    page fault per 64 KiB (Linux >= 5.14; older kernels refuse it and the faults happen as before)."""
    _advise(array, 22)  # MADV_POPULATE_READ
