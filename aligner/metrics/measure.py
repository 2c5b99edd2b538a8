"""Streaming error metrics between two tensors: one fused pass (a compiled kernel) over fixed-size chunks, float64
sums, bounded memory.

`compare_arrays(a, b)` is the public entry point (also used for checkpoint diffs); `b` is the reference, so relative
errors divide by `|b|` and SQNR treats `b` as the signal. Anything that yields flat C-order chunks (an `ArrayStream`)
can be compared with `compare_streams`, which is how dump files are read without loading them whole.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import operator
from contextlib import AbstractContextManager
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
from msgspec import UNSET

from aligner.core.dtypes import INTEGER, canonical, contiguous
from aligner.core.result import number, typed
from aligner.core.tolerance import Tolerance
from aligner.metrics.kernel import Mapped, Totals, accumulate, accumulate_mapped
from aligner.metrics.stats import Stats, known

CHUNK = 1 << 18  # elements per chunk: one kernel call per MiB of float32; converted chunks stay in L2 cache
MAP_MIN = 1 << 20  # bytes per side from which a file-backed pair is folded from its mapped pages (`FileRegion`)

class Method(str, enum.Enum):
    """How a pair was compared: element by element, by recorded statistics only, or not at all (shapes differ)."""

    ELEMENTS = "elements"
    STATS = "stats"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


_NONE = Method.NONE  # bound once: an enum member looked up on its class costs ~0.1 us, and rows ask millions of times


@dataclasses.dataclass(slots=True)  # ~250 bytes where a __dict__ took ~1.3 KB: a streamed compare keeps 100,000s
class Metrics:
    """How far `a` is from the reference `b`. Error fields are None when the values were not compared elementwise."""

    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    rtol: float
    atol: float
    method: Method = Method.ELEMENTS
    numel: int = 0
    mismatched: int = 0                # elements outside atol + rtol*|b| incl. NaN/Inf disagreements (stats: checks)
    max_abs_err: float | None = None
    max_abs_index: tuple[int, ...] | None = None
    max_rel_err: float | None = None
    mean_abs_err: float | None = None
    rmse: float | None = None
    cosine: float | None = None
    sqnr_db: float | None = None
    rel_l2_err: float | None = None    # ||a-b|| / ||b||; for statistics, the lower bound | ||a|| - ||b|| | / ||b||
    norm_a: float | None = None
    norm_b: float | None = None
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    reordered: bool = False            # diverged, but the same rows (along the first axis) in another order

    @property
    def shape_match(self) -> bool:
        return tuple(self.shape_a) == tuple(self.shape_b)

    @property
    def dtype_match(self) -> bool:
        return self.dtype_a == self.dtype_b

    @property
    def mismatch_fraction(self) -> float | None:
        """Fraction of elements outside tolerance (None unless compared elementwise)."""
        if self.method != Method.ELEMENTS:
            return None
        return self.mismatched / self.numel if self.numel else 0.0

    @property
    def nonfinite(self) -> bool:
        return bool(self.nan_a or self.nan_b or self.inf_a or self.inf_b)

    @property
    def allclose(self) -> bool:
        """Values agree within tolerance (identical NaN/Inf positions count as agreeing)."""
        return self.mismatched == 0 and self.method != _NONE

    @property
    def diverged(self) -> bool:
        """Values, dtype or shape disagree; a dtype seen as `torch.float32` on one side and `Float32` on the other
        does not, because both are canonical `float32` here. Integer widths do not either when every value agrees:
        MindSpore keeps index tensors as int32 where torch uses int64 (the dtype difference is still reported)."""
        return self.mismatched != 0 or self.method == _NONE or \
            self.dtype_a != self.dtype_b and not INTEGER >= {self.dtype_a, self.dtype_b}  # (allclose, dtype_match)

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _METRIC_FIELDS}  # flat: no deep copy needed
        out.update(shape_a=list(self.shape_a), shape_b=list(self.shape_b), allclose=self.allclose,
                   mismatch_fraction=self.mismatch_fraction,
                   max_abs_index=list(self.max_abs_index) if self.max_abs_index is not None else None)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        """Metrics from `to_dict`'s data (the derived keys ignored; "nan"/"inf" strings back to floats); ValueError,
        KeyError or TypeError for data that is not."""
        index = data["max_abs_index"]
        fields = {name: data[name] for name in _METRIC_FIELDS}
        fields.update(shape_a=tuple(typed(n, int, "shape_a") for n in data["shape_a"]),
                      shape_b=tuple(typed(n, int, "shape_b") for n in data["shape_b"]),
                      method=Method(data["method"]), reordered=typed(data["reordered"], bool, "reordered"),
                      max_abs_index=None if index is None else tuple(typed(n, int, "index") for n in index),
                      **{k: typed(data[k], int, k) for k in _COUNTS}, **{k: number(data[k]) for k in _FLOATS})
        for key in ("dtype_a", "dtype_b"):
            typed(fields[key], str, key)
        return cls(**fields)


_METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(Metrics))
_COUNTS = ("numel", "mismatched", "nan_a", "nan_b", "inf_a", "inf_b")
_FLOATS = ("rtol", "atol", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "cosine", "sqnr_db", "rel_l2_err",
           "norm_a", "norm_b")


class ArrayStream(Protocol):
    """A tensor readable in flat C-order chunks, so it never has to be held in memory whole."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> str: ...  # canonical name

    def chunks(self, size: int) -> Iterator[np.ndarray]: ...


@dataclasses.dataclass(frozen=True)
class FileRegion:
    """Where a stream's elements lie in its file: `count` elements of `dtype` (native byte order, C order) from byte
    `offset`; `open` opens the file as the stream's reads do; `cut` is the error saying it was cut short while read."""

    open: Callable[[], AbstractContextManager[IO[bytes]]]
    offset: int
    count: int
    dtype: np.dtype
    cut: Callable[[], Exception]


@runtime_checkable
class FileStream(ArrayStream, Protocol):
    """An `ArrayStream` whose elements may lie in a file as the kernel reads them (None when they do not)."""

    def region(self) -> FileRegion | None: ...


@dataclasses.dataclass
class MemoryStream:
    """An in-memory array (any layout) as an `ArrayStream`."""

    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> str:
        return canonical(self.array.dtype)

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        return flat_chunks(self.array, size)


def flat_chunks(array: np.ndarray, size: int) -> Iterator[np.ndarray]:
    """Flat C-order pieces of at most `size` elements, copying only one buffer's worth for non-contiguous arrays."""
    if array.flags.c_contiguous:
        flat = array.reshape(-1)
        for start in range(0, flat.size, size):
            yield flat[start:start + size]
        return
    if array.size == 0:
        return
    it = np.nditer(array, flags=["external_loop", "buffered", "zerosize_ok"], op_flags=[["readonly"]],
                   order="C", buffersize=size)
    yield from it


def _paired(chunks_a: Iterable[np.ndarray], chunks_b: Iterable[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Re-cut two chunk streams so that both sides of each yielded pair have the same length."""
    it_b = iter(chunks_b)
    rest_b = np.empty(0)
    for piece_a in chunks_a:
        while piece_a.size:
            if not rest_b.size:
                rest_b = next(it_b)
            n = min(piece_a.size, rest_b.size)
            yield piece_a[:n], rest_b[:n]
            piece_a, rest_b = piece_a[n:], rest_b[n:]


def _compute_dtype(dtype_a: str, dtype_b: str) -> np.dtype:
    """float32 arithmetic unless a side needs float64 to be exact (float64, int32, int64)."""
    wide = {"float64", "int32", "int64"}
    return np.dtype(np.float64 if {dtype_a, dtype_b} & wide else np.float32)


def _native(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`array` as C-contiguous `dtype` in native byte order (what the kernel reads), copying only when needed."""
    return contiguous(array if array.dtype == dtype else array.astype(dtype))


def _finish(totals: Totals, metrics: Metrics, shape: tuple[int, ...]) -> Metrics:
    """Write the kernel's totals into `metrics` (`shape`: what the flat index of the largest error runs over)."""
    n = totals.count
    metrics.numel = totals.offset
    metrics.mismatched = totals.mismatched
    metrics.nan_a, metrics.nan_b, metrics.inf_a, metrics.inf_b = totals.nan_a, totals.nan_b, totals.inf_a, totals.inf_b
    metrics.norm_a, metrics.norm_b = math.sqrt(totals.saa), math.sqrt(totals.sbb)
    if n == 0:
        return metrics
    metrics.max_abs_err = totals.max_abs
    metrics.max_abs_index = tuple(int(i) for i in np.unravel_index(totals.max_abs_at, shape or (1,)))
    metrics.max_rel_err = totals.max_rel
    metrics.mean_abs_err = totals.sum_abs / n
    metrics.rmse = math.sqrt(totals.sdd / n)
    na, nb, sdd = metrics.norm_a, metrics.norm_b, totals.sdd
    metrics.cosine = 1.0 if na == nb == 0 else (totals.sab / (na * nb) if na and nb else 0.0)
    metrics.cosine = max(-1.0, min(1.0, metrics.cosine))
    signal_to_noise = math.inf if sdd == 0 else totals.sbb / sdd  # 0 for a zero reference or an infinite error
    metrics.sqnr_db = 10 * math.log10(signal_to_noise) if signal_to_noise > 0 else -math.inf
    metrics.rel_l2_err = 0.0 if sdd == 0 else (math.sqrt(sdd) / nb if nb else math.inf)
    return metrics


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def compare_streams(a: ArrayStream, b: ArrayStream, tolerance: Tolerance | None = None, chunk: int = CHUNK) -> Metrics:
    """Metrics of `a` against the reference `b`, reading both once in chunks (memory independent of tensor size).

    Shapes that differ only by size-1 dimensions (`[1, 10]` vs `[10]`), or where one merges consecutive dimensions of
    the other (`same_order`), are compared elementwise but still reported as a shape difference; so is a side that
    broadcasts to the other's shape (a position table returned as [16, 64] where the other side gathers it into
    [2, 16, 64]), compared as broadcast when the result holds at most BROADCAST_LIMIT elements; other shape
    differences are not compared (method NONE). Without a `tolerance`, the dtypes' torch.testing defaults apply.
    """
    dtype_a, dtype_b = canonical(a.dtype), canonical(b.dtype)
    tol = tolerance or Tolerance.for_dtype(dtype_a, dtype_b)
    metrics = Metrics(tuple(a.shape), tuple(b.shape), dtype_a, dtype_b, tol.rtol, tol.atol)
    shape = metrics.shape_b
    if not same_order(metrics.shape_a, metrics.shape_b):
        wide = broadcast_shape(metrics.shape_a, metrics.shape_b)
        if wide is None or math.prod(wide) > BROADCAST_LIMIT:
            metrics.method = Method.NONE
            metrics.numel = math.prod(metrics.shape_b)
            return metrics
        a, b, shape = _widened(a, wide), _widened(b, wide), wide
    dtype, totals = _compute_dtype(dtype_a, dtype_b), Totals()
    if not _fold_mapped(a, b, dtype, metrics, totals):
        for piece_a, piece_b in _paired(a.chunks(chunk), b.chunks(chunk)):
            accumulate(_native(piece_a, dtype), _native(piece_b, dtype), metrics.rtol, metrics.atol, totals)
    return _finish(totals, metrics, shape)


def _fold_mapped(a: ArrayStream, b: ArrayStream, dtype: np.dtype, metrics: Metrics, totals: Totals) -> bool:
    """Fold two streams into `totals` straight from their files' mapped pages, where both lie in files as `dtype`
    (what the kernel computes in) and hold MAP_MIN bytes or more: reading them into a buffer first costs a copy as
    long as the kernel itself. False, `totals` untouched, where they do not or cannot be mapped: read them instead."""
    ra, rb = (s.region() if isinstance(s, FileStream) else None for s in (a, b))
    if ra is None or rb is None or not ra.dtype == rb.dtype == dtype or ra.count != rb.count \
            or ra.count * dtype.itemsize < MAP_MIN:
        return False
    with ra.open() as fa, rb.open() as fb:
        done = accumulate_mapped(fa.fileno(), ra.offset, fb.fileno(), rb.offset, ra.count, dtype, metrics.rtol,
                                 metrics.atol, totals)
    if done in (Mapped.SHORT_A, Mapped.SHORT_B):
        raise (ra if done == Mapped.SHORT_A else rb).cut()
    return done == Mapped.OK


def same_order(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> bool:
    """Whether two shapes lay out the same elements in the same C order: one merges consecutive dimensions of the
    other (timm's NHWC [2, 8, 8, 16] and mindcv's [B, H*W, C] [2, 64, 16]; size-1 dimensions aside). A transpose or
    any other reshape is not: its flat order differs."""
    if shape_a == shape_b:  # (most pairs: the same shape)
        return True
    if math.prod(shape_a) != math.prod(shape_b):
        return False
    ends_a = set(itertools.accumulate(_squeezed(shape_a), operator.mul))
    ends_b = set(itertools.accumulate(_squeezed(shape_b), operator.mul))
    return ends_a <= ends_b or ends_b <= ends_a


def same_rows(a: ArrayStream, b: ArrayStream, tolerance: Tolerance | None = None) -> bool:
    """Whether two tensors of one shape hold the same rows (along the first axis) in another order, within
    tolerance: the tokens an MoE expert receives, ordered by a sort that is stable in one framework (MindSpore's) and
    not in the other (torch's CPU argsort). Read whole: at most BROADCAST_LIMIT elements."""
    if tuple(a.shape) != tuple(b.shape) or len(a.shape) < 2 or a.shape[0] < 2 or math.prod(a.shape) > BROADCAST_LIMIT:
        return False
    arrays = []
    for stream in (a, b):
        pieces = list(stream.chunks(BROADCAST_LIMIT))
        flat = np.concatenate(pieces) if pieces else np.empty(0)
        rows = flat.astype(np.float64).reshape(a.shape[0], -1)
        arrays.append(rows[np.lexsort(rows.T[::-1])])
    tol = tolerance or Tolerance.for_dtype(canonical(a.dtype), canonical(b.dtype))
    return bool(np.allclose(arrays[0], arrays[1], rtol=tol.rtol, atol=tol.atol, equal_nan=True))


BROADCAST_LIMIT = 1 << 24  # elements of a broadcast comparison: the narrower side is held in memory, broadcast


def broadcast_shape(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The wider of two shapes when the other broadcasts to it (numpy's rules), else None."""
    try:
        wide = tuple(np.broadcast_shapes(shape_a, shape_b))
    except ValueError:
        return None
    return wide if wide in (tuple(shape_a), tuple(shape_b)) else None


def _widened(stream: ArrayStream, shape: tuple[int, ...]) -> ArrayStream:
    """`stream` broadcast to `shape` (read whole: it is the narrower side), or itself when it has that shape."""
    if tuple(stream.shape) == shape:
        return stream
    pieces = list(stream.chunks(BROADCAST_LIMIT))
    whole = (np.concatenate(pieces) if pieces else np.empty(0)).reshape(stream.shape)
    return MemoryStream(np.broadcast_to(whole, shape))


def compare_arrays(a: Any, b: Any, tolerance: Tolerance | None = None) -> Metrics:
    """Metrics of array `a` against the reference array `b` (numpy arrays or anything `np.asarray` accepts)."""
    return compare_streams(MemoryStream(np.asarray(a)), MemoryStream(np.asarray(b)), tolerance)


def compare_stats(stats_a: Stats, stats_b: Stats, shape_a: tuple[int, ...],
                  shape_b: tuple[int, ...], dtype_a: str, dtype_b: str,
                  tolerance: Tolerance | None = None) -> Metrics:
    """Compare statistics-only records (min/max/mean/l2 over finite values, NaN/Inf counts).

    Each test is implied by elementwise allclose (|max_a-max_b| <= atol + rtol*max|b|, |mean_a-mean_b| <=
    atol + rtol*rms(b), | ||a||-||b|| | <= atol*sqrt(n) + rtol*||b||), so a failure proves an elementwise mismatch and a
    clean run is never flagged; a near-zero mean is judged against the tensor's scale, not against itself.
    """
    dtype_a, dtype_b = canonical(dtype_a), canonical(dtype_b)
    tol = tolerance or Tolerance.for_dtype(dtype_a, dtype_b)
    m = Metrics(tuple(shape_a), tuple(shape_b), dtype_a, dtype_b, tol.rtol, tol.atol, method=Method.STATS,
                numel=math.prod(shape_b))
    if not same_order(m.shape_a, m.shape_b):
        m.method = Method.NONE
        return m
    a, b = stats_a, stats_b
    m.nan_a, m.nan_b = int(a.nan or 0), int(b.nan or 0)
    m.inf_a, m.inf_b = int(a.inf or 0), int(b.inf or 0)
    m.norm_a, m.norm_b = norm_a, norm_b = known(a.l2), known(b.l2)
    failed = int(m.nan_a != m.nan_b) + int(m.inf_a != m.inf_b)
    n = max(m.numel - m.nan_b - m.inf_b, 1)
    rtol, atol = m.rtol, m.atol
    extreme = atol + rtol * max(abs(b.min or 0.0), abs(b.max or 0.0))
    worst = 0.0
    for va, vb, allowed, extremum in ((a.max, b.max, extreme, True), (a.min, b.min, extreme, True),
                                      (a.mean, b.mean, atol + rtol * (norm_b or 0.0) / math.sqrt(n), False),
                                      (a.l2, b.l2, atol * math.sqrt(n) + rtol * (norm_b or 0.0), False)):
        if va is UNSET or vb is UNSET:  # not recorded on a side (msprobe omits Mean/Norm at times)
            continue
        if va is None or vb is None:  # None: no finite element on that side
            failed += (va is None) != (vb is None)
            continue
        err = abs(va - vb)
        failed += err > allowed
        if extremum and err > worst:
            worst = err
    m.mismatched = failed
    m.max_abs_err = float(worst)  # a lower bound on the elementwise max abs error
    if norm_a is not None and norm_b is not None:
        diff = abs(norm_a - norm_b)
        m.rel_l2_err = 0.0 if diff == 0 else (diff / norm_b if norm_b else math.inf)
    return m


StatsItem = tuple[Stats, Stats, Sequence[Any], Sequence[Any], str, str, "Tolerance | None"]  # compare_stats's arguments
_COMPARED = [operator.attrgetter(name) for name in ("max", "min", "mean", "l2", "nan", "inf")]  # compare_stats reads
_PLAIN = (float, float, float, float, int, int) * 2  # of both sides
_EXACT = float(1 << 51)  # counts and element counts below this stay exact through float64 sums of three


def _resolved(dtype_a: str, dtype_b: str, tol: Tolerance | None) -> tuple[str, str, float, float] | None:
    """What compare_stats makes of an item's dtypes and tolerance (None where its rtol or atol is not a float)."""
    da, db = canonical(dtype_a), canonical(dtype_b)
    tol = tol or Tolerance.for_dtype(da, db)
    return (da, db, tol.rtol, tol.atol) if type(tol.rtol) is float and type(tol.atol) is float else None


def compare_stats_many(items: Sequence[StatsItem]) -> list[Metrics | None]:
    """`compare_stats(*item)` of each item, bit for bit, from one vectorised pass over the batch: for the items of
    equal shapes and known dtypes whose compared statistics are plain numbers (min, max, mean and L2 floats, the
    NaN/Inf counts ints); None for the others (call `compare_stats` for them: it handles None, statistics not
    recorded, other shapes, and raises what it raises). The statistics are read a column at a time (a C loop each)."""
    out: list[Metrics | None] = [None] * len(items)
    if not items:
        return out
    sa, sb, shapes_a, shapes_b, dtypes_a, dtypes_b, tols = zip(*items)
    columns = [list(map(get, side)) for side in (sa, sb) for get in _COMPARED]  # 12 columns: a's six, b's six
    plain: list[bool] | None = None  # None while every item's statistics are plain numbers
    for column, kind in zip(columns, _PLAIN):
        if set(map(type, column)) != {kind}:
            mine = [type(v) is kind for v in column]
            plain = mine if plain is None else list(map(operator.and_, plain, mine))
    at: list[int] = []
    fixed: list[tuple] = []  # (shape, dtype_a, dtype_b, rtol, atol, numel) of each item computed here
    # (dtype_a, dtype_b, id(tol)) -> _resolved: by identity, as Tolerance(0, 0) == Tolerance(0.0, 0.0) (only the
    # second is computed here) and the items hold every tol while this runs
    resolved: dict[tuple, tuple[str, str, float, float] | None] = {}
    for k in range(len(items)) if plain is None else itertools.compress(range(len(items)), plain):
        try:
            tol = tols[k]
            key = (dtypes_a[k], dtypes_b[k], id(tol))
            known_ = resolved[key] if key in resolved else resolved.setdefault(key, _resolved(*key[:2], tol))
            ta, tb = tuple(shapes_a[k]), tuple(shapes_b[k])
            numel = math.prod(tb)
        except Exception:  # whatever it is, compare_stats meets it again and says so
            continue
        if known_ is None or type(numel) is not int or not 0 <= numel < _EXACT or ta != tb:
            continue
        at.append(k)
        fixed.append((tb, *known_, numel))
    if not at:
        return out
    table = np.array(columns if len(at) == len(items) else [list(map(column.__getitem__, at)) for column in columns],
                     np.float64)  # a row per statistic, contiguous
    a, b = table[:6], table[6:]
    rtol, atol, numel = (np.array(column, np.float64) for column in list(zip(*fixed))[3:])
    with np.errstate(all="ignore"):  # NaN and Inf come out as Python's float arithmetic gives them, silently
        exact = (np.abs(a[4:]) < _EXACT).all(0) & (np.abs(b[4:]) < _EXACT).all(0)
        sqrt_n = np.sqrt(np.maximum(numel - b[4] - b[5], 1.0))
        low, high = np.abs(b[1]), np.abs(b[0])
        extreme = atol + rtol * np.where(high > low, high, low)  # Python's max(low, high): low unless high is greater
        norm_b = np.where(b[3] == 0.0, 0.0, b[3])  # `norm_b or 0.0`
        err = np.abs(a[:4] - b[:4])  # max, min, mean, l2
        failed = ((a[4] != b[4]).astype(np.int64) + (a[5] != b[5]) + (err[0] > extreme) + (err[1] > extreme)
                  + (err[2] > atol + rtol * norm_b / sqrt_n) + (err[3] > atol * sqrt_n + rtol * norm_b))
        worst = np.where(err[0] > 0.0, err[0], 0.0)
        worst = np.where(err[1] > worst, err[1], worst)
        diff = np.abs(a[3] - b[3])
        rel = np.where(diff == 0.0, 0.0, np.where(b[3] != 0.0, diff / b[3], math.inf))
    stats = Method.STATS
    l2_a, nan_a, inf_a, l2_b, nan_b, inf_b = columns[3:6] + columns[9:12]
    for k, (shape, da, db, rt, at_, n), bad, high_err, rel_err, ok in zip(
            at, fixed, failed.tolist(), worst.tolist(), rel.tolist(), exact.tolist()):
        if ok:  # the fields compare_stats sets, in its types (Python floats and ints), in Metrics' order
            out[k] = Metrics(shape, shape, da, db, rt, at_, stats, n, bad, high_err, None, None, None, None, None,
                             None, rel_err, l2_a[k], l2_b[k], nan_a[k], nan_b[k], inf_a[k], inf_b[k])
    return out
