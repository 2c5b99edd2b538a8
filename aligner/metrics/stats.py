"""Summary statistics of one tensor (what stats-only dumps record and `align inspect --stats` shows)."""
from __future__ import annotations

import math
import os
from typing import Any, Sequence

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from aligner.core.dtypes import to_numpy
from aligner.metrics.kernel import KERNEL_DTYPES, summarize

# Thresholds of the fraction statistics (the health rules of `align check` and `aligner.watch` read them):
NEAR_ZERO = 0.01              # |v| <= this: "near_zero" (dead ReLUs, vanished gradients)
NEAR_ONE = 0.99               # |v| >= this: "near_one" (saturated sigmoid/tanh)
TINY = 6.103515625e-05        # float16's smallest normal: nonzero |v| below it underflow in half precision ("tiny")


class Stats(msgspec.Struct, kw_only=True, gc=False):
    """One tensor's summary statistics, as a dump's manifest records them (`Record.stats`, decoded with the record).

    min/max/mean/l2 over the finite elements; nan/inf counts; zeros/near_zero/near_one the fractions of elements that
    are 0, |v| <= NEAR_ZERO, |v| >= NEAR_ONE; tiny the fraction of the nonzero ones below TINY; numel. None: no value
    (no finite element; not computed in a light record); UNSET: not recorded at all (an older dump, a foreign one,
    written without the key: it stays absent when written back). Keys of a newer dump this one does not know are
    ignored. False when nothing is recorded (like the empty dict it replaces).
    """

    min: float | None | UnsetType = UNSET
    max: float | None | UnsetType = UNSET
    mean: float | None | UnsetType = UNSET
    l2: float | None | UnsetType = UNSET
    nan: int | None | UnsetType = UNSET
    inf: int | None | UnsetType = UNSET
    zeros: float | None | UnsetType = UNSET
    near_zero: float | None | UnsetType = UNSET
    near_one: float | None | UnsetType = UNSET
    tiny: float | None | UnsetType = UNSET
    numel: int | None | UnsetType = UNSET

    def __bool__(self) -> bool:
        return self.max is not UNSET or msgspec.structs.astuple(self) != _NOTHING  # (max: what most dumps record)

    def has(self, name: str) -> bool:
        """Whether the statistic `name` (a field's name) was recorded, None included."""
        return getattr(self, name) is not UNSET

    def to_dict(self) -> dict[str, Any]:
        """The recorded statistics in field order (the manifest's `stats` object: unset ones left out)."""
        return {k: v for k, v in zip(self.__struct_fields__, msgspec.structs.astuple(self)) if v is not UNSET}


_NOTHING = (UNSET,) * len(Stats.__struct_fields__)
STAT_KEYS = Stats.__struct_fields__


def known(value: float | None | UnsetType) -> float | None:
    """A statistic's value, None when it has none or was not recorded (where the two mean the same)."""
    return None if value is UNSET else value


def fractions(numel: int, zeros: int, near_zero: int, near_one: int, below_tiny: int) -> dict[str, Any]:
    """The fraction statistics from element counts (`below_tiny` counts |v| < TINY, zeros included), as `Stats`
    keyword arguments."""
    nonzero = numel - zeros
    return {"zeros": zeros / numel if numel else 0.0, "near_zero": near_zero / numel if numel else 0.0,
            "near_one": near_one / numel if numel else 0.0,
            "tiny": (below_tiny - zeros) / nonzero if nonzero else 0.0, "numel": numel}


def empty_stats(floating: bool) -> Stats:
    """The statistics of a tensor with no elements."""
    return Stats(min=None, max=None, mean=None, l2=None if floating else 0.0, nan=0, inf=0,
                 **fractions(0, 0, 0, 0, 0))


def tensor_stats(array: np.ndarray) -> Stats:
    """min/max/mean/L2 norm over the finite elements (None if there are none), NaN/Inf counts, and the fractions of
    elements that are zero, near zero (|v| <= 0.01), near one (|v| >= 0.99) and, of the nonzero ones, tiny (below
    float16's smallest normal); thresholds compare in the tensor's own float width (float32 for 16-bit floats)."""
    a = np.asarray(array)
    n = int(a.size)
    floating = a.dtype.kind in "fc" or a.dtype == to_numpy("bfloat16")
    if n == 0:
        return empty_stats(floating)
    if not floating:  # integers and bool: exact in float64 up to 2**53, no NaN/Inf
        a64 = a.astype(np.float64).reshape(-1)
        mag = np.abs(a64)
        zeros = int(np.count_nonzero(a64 == 0))
        return Stats(min=float(a64.min()), max=float(a64.max()), mean=float(a64.mean()),
                     l2=float(np.sqrt(np.einsum("i,i->", a64, a64))), nan=0, inf=0,
                     **fractions(n, zeros, int(np.count_nonzero(mag <= NEAR_ZERO)),
                                 int(np.count_nonzero(mag >= NEAR_ONE)), int(np.count_nonzero(mag < TINY))))
    flat = (a.astype(np.float32) if a.dtype.itemsize < 4 else a).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf: NaN here is the signal, not a problem
        total = np.add.reduce(flat, dtype=np.float64)  # pairwise, no temporary; also the cheap test for NaN/Inf
    nan = inf = 0
    vals = flat
    if not np.isfinite(total):
        finite = np.isfinite(flat)
        nan = int(np.count_nonzero(np.isnan(flat)))
        inf = n - int(np.count_nonzero(finite)) - nan
        if nan or inf:
            vals = flat[finite]
            # finite values near float64's maximum overflow (to inf, or to inf + -inf = NaN): unscaled_mean below
            with np.errstate(over="ignore", invalid="ignore"):
                total = np.add.reduce(vals, dtype=np.float64)
    # count_nonzero of a comparison, never of the floats themselves (5-30x slower)
    mag = np.abs(flat)
    zeros = int(np.count_nonzero(flat == 0))
    counts = fractions(n, zeros, int(np.count_nonzero(mag <= NEAR_ZERO)), int(np.count_nonzero(mag >= NEAR_ONE)),
                       int(np.count_nonzero(mag < TINY)))
    if vals.size == 0:
        return Stats(min=None, max=None, mean=None, l2=None, nan=nan, inf=inf, **counts)
    v64 = vals.astype(np.float64, copy=False)
    mean = float(total / vals.size) if np.isfinite(total) else unscaled_mean(v64)
    # einsum, not np.dot: BLAS dot wakes its thread pool (2 ms for 24K elements on a busy 2-core machine, 60x this)
    return Stats(min=float(vals.min()), max=float(vals.max()), mean=mean,
                 l2=float(np.sqrt(np.einsum("i,i->", v64, v64))), nan=nan, inf=inf, **counts)


def unscaled_mean(values: np.ndarray) -> float:
    """The mean of finite float64 `values` whose sum overflows (float64 values near its maximum): summed scaled down by
    a power of two that keeps the sum finite (exact scaling), then scaled back; the mean itself always fits."""
    shift = max(1, values.size).bit_length()
    return float(np.add.reduce(np.ldexp(values, -shift)) / values.size * 2.0 ** shift)


def batch_stats(arrays: Sequence[np.ndarray]) -> list[Stats]:
    """`tensor_stats` of each array, the float32/float64 ones in one vectorised pass over their concatenation (segment
    reductions: a fixed cost per batch instead of per array); the same keys and numbers (sums to float64 rounding)."""
    out: list[Stats | None] = [None] * len(arrays)
    for dtype in (np.float32, np.float64):
        group = [i for i, a in enumerate(arrays) if a.dtype == dtype and a.size]
        if len(group) < 2:
            continue
        flats = [np.asarray(arrays[i]).reshape(-1) for i in group]
        sizes = np.fromiter((f.size for f in flats), np.int64, len(flats))
        flat = np.concatenate(flats)
        starts = np.zeros(len(flats), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        with np.errstate(invalid="ignore", over="ignore"):
            total = np.add.reduceat(flat, starts, dtype=np.float64)
            squares = np.add.reduceat(np.square(flat, dtype=np.float64), starts)
        low, high = np.minimum.reduceat(flat, starts), np.maximum.reduceat(flat, starts)
        mag = np.abs(flat)
        masks = (flat == 0, mag <= NEAR_ZERO, mag >= NEAR_ONE, mag < TINY)
        finite = np.isfinite(total)
        ends = (starts + sizes).tolist()
        for j, (i, start, end) in enumerate(zip(group, starts.tolist(), ends)):
            if not finite[j]:  # NaN/Inf: counted and excluded exactly, one array at a time (rare)
                continue
            # count_nonzero of a slice of each mask: np.add.reduceat of booleans is 10x slower
            zeros, near_zero, near_one, below = (int(np.count_nonzero(m[start:end])) for m in masks)
            out[i] = Stats(min=float(low[j]), max=float(high[j]), mean=float(total[j] / (end - start)),
                           l2=float(np.sqrt(squares[j])), nan=0, inf=0,
                           **fractions(end - start, zeros, near_zero, near_one, below))
    return [s if s is not None else tensor_stats(a) for s, a in zip(out, arrays)]


def batch_extrema(arrays: Sequence[np.ndarray]) -> list[Stats]:
    """The statistics keys of each array with min, max, nan, inf and numel only (the others None: not computed), the
    float32/float64 ones from two segment reductions over their concatenation; an array holding NaN/Inf gets the full
    `tensor_stats` (exact counts, extrema over its finite elements)."""
    out: list[Stats | None] = [None] * len(arrays)
    for dtype in (np.float32, np.float64):
        group = [i for i, a in enumerate(arrays) if a.dtype == dtype and a.size]
        if not group:
            continue
        flats = [np.asarray(arrays[i]).reshape(-1) for i in group]
        sizes = [f.size for f in flats]
        flat = np.concatenate(flats) if len(flats) > 1 else flats[0]
        starts = np.zeros(len(flats), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        low, high = np.minimum.reduceat(flat, starts), np.maximum.reduceat(flat, starts)
        finite = (np.isfinite(low) & np.isfinite(high)).tolist()
        for i, n, lo, hi, ok in zip(group, sizes, low.tolist(), high.tolist(), finite):
            if ok:
                out[i] = extrema_only(lo, hi, n)
    return [s if s is not None else tensor_stats(a) for s, a in zip(out, arrays)]


# Tensors of fewer elements than this are cheaper to copy than to reduce in place: aligner.watch batches them.
SMALL = 1 << 14
# Elements per thread below which folding statistics on more threads costs more than it saves (starting a thread
# costs ~30 us here; 256K float32 elements take ~0.15 ms on one core).
PART = 1 << 18
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def watch_stats(array: np.ndarray, full: bool) -> Stats:
    """What `aligner.watch` reads of a large float32/float64 array, in one pass of the fused kernel on every core:
    with `full`, every statistic; without, only the exact extrema and NaN/Inf counts the rules read of such a record
    (every statistic when there is a NaN or Inf), so a light record looks the same from both frameworks."""
    stats = fast_stats(array, CORES)
    low, high, numel = stats.min, stats.max, stats.numel
    if full or stats.nan or stats.inf or not (isinstance(low, float) and isinstance(high, float)
                                              and isinstance(numel, int)):
        return stats
    return extrema_only(low, high, numel)


def extrema_only(low: float, high: float, numel: int) -> Stats:
    """The light statistics of a finite tensor: extrema and element count, no sums or fractions."""
    return Stats(min=low, max=high, mean=None, l2=None, nan=0, inf=0, zeros=None, near_zero=None, near_one=None,
                 tiny=None, numel=numel)


def fast_stats(array: np.ndarray, threads: int = 1) -> Stats:
    """`tensor_stats` in one pass of the fused kernel for float32/float64 (on up to `threads` threads for a large
    array; sums in double, so mean and L2 agree with `tensor_stats` up to summation order), `tensor_stats` itself
    for other dtypes."""
    a = np.asarray(array)
    if a.dtype not in KERNEL_DTYPES or not a.size:
        return tensor_stats(a)
    return _kernel_stats(a, threads, None)[0]


def fast_stats_digest(array: np.ndarray, head: bytes) -> tuple[Stats, bytes] | None:
    """`fast_stats` and `kernel.digest(head, array)` in one pass over a float32/float64 array's memory (a full dump's
    statistics and file name: one call instead of two for each tensor); None for another dtype or no elements."""
    a = np.asarray(array)
    if a.dtype not in KERNEL_DTYPES or not a.size:
        return None
    stats, raw = _kernel_stats(a, 1, head)
    assert raw is not None  # asked for: the kernel returns it
    return stats, raw


def _kernel_stats(a: np.ndarray, threads: int, head: bytes | None) -> tuple[Stats, bytes | None]:
    """The fused kernel's statistics of a non-empty float32/float64 array, and its digest where `head` is given."""
    n = int(a.size)
    t = summarize(np.ascontiguousarray(a).reshape(-1), NEAR_ZERO, NEAR_ONE, TINY, max(1, min(threads, n // PART)),
                  head)
    finite = n - t.nan - t.inf
    counts = fractions(n, t.zeros, t.near_zero, t.near_one, t.tiny)
    if not finite:
        return Stats(min=None, max=None, mean=None, l2=None, nan=t.nan, inf=t.inf, **counts), t.digest
    mean = t.sum / finite if math.isfinite(t.sum) else unscaled_mean(a[np.isfinite(a)].astype(np.float64))
    return Stats(min=t.lo, max=t.hi, mean=mean, l2=math.sqrt(t.squares), nan=t.nan, inf=t.inf, **counts), t.digest
