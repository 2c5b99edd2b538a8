"""Bindings of the fused kernels (_kernel.c): running totals of one tensor pair, fed chunk by chunk (ctypes), and the
summary statistics of one array in a single pass, with its content digest (called directly: once per dumped tensor,
where ctypes' ~8 us a call was most of a small tensor's cost).

Both release the GIL for each call, so evaluate_all's threads compare pairs in parallel where worker processes
cannot be forked, and a dump's writer thread folds statistics while the training thread runs.
"""
from __future__ import annotations

import ctypes
import enum
from typing import Any, NamedTuple

import numpy as np

from aligner.core.errors import AlignerError

try:
    from aligner.metrics import _kernel  # type: ignore[attr-defined]  # a compiled extension: mypy sees no module
except ImportError as exc:  # a source tree used without installing it
    raise AlignerError("aligner's compiled metric kernel (aligner/metrics/_kernel.c) is not built: "
                       "run `make install` or `pip install -e .` (needs a C compiler)") from exc


class Totals(ctypes.Structure):
    """Sums over positions finite on both sides, NaN/Inf counts per side, and the peaks (mirrors `Totals` in C)."""

    _fields_ = [(name, ctypes.c_double) for name in ("saa", "sbb", "sab", "sdd", "sum_abs", "max_abs", "max_rel")] + [
        (name, ctypes.c_int64) for name in ("offset", "count", "mismatched", "max_abs_at", "nan_a", "nan_b",
                                            "inf_a", "inf_b")]

    def __init__(self) -> None:
        super().__init__(max_abs=-1.0)  # below any |a - b|, so the first chunk always records its peak position


class Summary(NamedTuple):
    """One array's extrema and sums over its finite elements, its element counts, and its content digest when asked
    (`summarize`)."""

    lo: float
    hi: float
    sum: float
    squares: float
    nan: int
    inf: int
    zeros: int
    near_zero: int
    near_one: int
    tiny: int
    digest: bytes | None


def _bind(name: str, *argtypes: Any) -> Any:
    """A C function of the kernel library with its argument types (it returns nothing)."""
    fn = getattr(_LIB, name)
    fn.argtypes, fn.restype = list(argtypes), None
    return fn


_LIB = ctypes.CDLL(_kernel.__file__)
_FUNCTIONS = {}
for _dtype, _suffix in ((np.dtype(np.float32), "f32"), (np.dtype(np.float64), "f64")):
    _FUNCTIONS[_dtype] = _bind(f"aligner_accumulate_{_suffix}", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                               ctypes.c_double, ctypes.c_double, ctypes.POINTER(Totals))

KERNEL_DTYPES = tuple(_FUNCTIONS)  # the element types the kernel computes in (native byte order)
_MAPPED = _LIB.aligner_accumulate_mapped
_MAPPED.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                    ctypes.c_double, ctypes.c_double, ctypes.POINTER(Totals)]
_MAPPED.restype = ctypes.c_int


class Mapped(enum.IntEnum):
    """What folding two files' mapped pages gave (`accumulate_mapped`; the codes of aligner_accumulate_mapped)."""

    OK = 0
    SHORT_A = 1       # the first file is shorter than its data: cut short since it was listed, or while it was read
    SHORT_B = 2       # the second file is
    UNMAPPABLE = 3    # the files could not be mapped (a file system without mmap): read them instead


def accumulate(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, totals: Totals) -> None:
    """Fold two equal-length, C-contiguous arrays of one `KERNEL_DTYPES` type into `totals`."""
    if a.dtype != b.dtype or a.dtype not in _FUNCTIONS or a.size != b.size:
        raise ValueError(f"kernel needs two equal-length arrays of one of {KERNEL_DTYPES}, got {a.dtype}/{b.dtype}")
    if not (a.flags.c_contiguous and b.flags.c_contiguous):
        raise ValueError("kernel needs C-contiguous arrays")
    _FUNCTIONS[a.dtype](a.ctypes.data, b.ctypes.data, a.size, rtol, atol, ctypes.byref(totals))


def accumulate_mapped(fd_a: int, offset_a: int, fd_b: int, offset_b: int, count: int, dtype: np.dtype,
                      rtol: float, atol: float, totals: Totals) -> Mapped:
    """Fold `count` elements of `dtype` (one of `KERNEL_DTYPES`) stored from byte `offset_a` of the open file `fd_a`
    and `offset_b` of `fd_b` into `totals`, read from their mapped pages; `totals` changes only when this gives OK."""
    if dtype not in _FUNCTIONS:
        raise ValueError(f"kernel needs one of {KERNEL_DTYPES}, got {dtype}")
    return Mapped(_MAPPED(fd_a, offset_a, fd_b, offset_b, count, dtype.itemsize, rtol, atol, ctypes.byref(totals)))


def summarize(array: np.ndarray, near_zero: float, near_one: float, tiny: float, threads: int = 1,
              head: bytes | None = None) -> Summary:
    """Statistics of a C-contiguous `KERNEL_DTYPES` array in one pass, on up to `threads` threads: extrema, sum and
    sum of squares (in double) of its finite elements; counts of NaN, Inf, zeros, |v| <= near_zero, |v| >= near_one
    and |v| < tiny (thresholds compared in the array's type); with `head`, `digest(head, array)` too."""
    if array.dtype not in _FUNCTIONS or not array.flags.c_contiguous:
        raise ValueError(f"kernel needs a C-contiguous array of one of {KERNEL_DTYPES}, got {array.dtype}")
    return Summary._make(_kernel.summary(array, near_zero, near_one, tiny, threads, head))


def digest(head: bytes, array: np.ndarray) -> bytes:
    """XXH3-128 of `head` then the bytes of a C-contiguous `array` (canonical, 16 bytes): non-cryptographic, 30 GB/s
    here, where blake2b ran at 0.7 GB/s."""
    return _kernel.digest(head, array)
