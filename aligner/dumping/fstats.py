"""Tensor statistics computed where the tensor lives: no host copy of its data.

`stats_of` is what stats-only dumps and `aligner.watch` record. A CPU tensor (torch, or MindSpore on a CPU target) is
already in host memory: its statistics come from `tensor_stats` over a zero-copy numpy view, computed at once (a later
in-place op cannot change them). A tensor on an accelerator is reduced by its own framework on its own device
(`torch_stats`, `mindspore_stats`): a few reductions, float64 sums, and one transfer of a small vector (MindSpore: a
second one only when the tensor holds NaN or Inf, to redo min/max/mean/L2 over the finite elements; torch masks them
in the first). Both give the `Stats`
of `aligner.metrics.stats.tensor_stats`: counts and min/max exactly, mean and L2 to float64 rounding.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import inspect
import sys
from typing import Any, Callable

import numpy as np

from aligner.core.dtypes import NUMPY, canonical, torch_to_numpy
from aligner.core.errors import AlignerError
from aligner.dumping.tensors import ms_numpy
from aligner.metrics import triton_stats
from aligner.metrics.stats import (
    NEAR_ONE,
    NEAR_ZERO,
    TINY,
    Stats,
    empty_stats,
    extrema_only,
    fast_stats,
    fractions,
    tensor_stats,
)


def on_host(tensor: Any) -> bool:
    """Whether the tensor's data is already in host memory (a numpy array, a strided CPU torch tensor, a MindSpore
    tensor on a CPU target): copying it is a memcpy, cheaper than reducing it on the training thread."""
    if isinstance(tensor, np.ndarray):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        return tensor.device.type == "cpu" and tensor.layout == torch.strided
    ms = sys.modules.get("mindspore")
    return ms is not None and isinstance(tensor, ms.Tensor) and _ms_on_cpu(tensor)


def stats_of(tensor: Any) -> Stats:
    """`tensor_stats` of a torch/MindSpore tensor or numpy array, without copying a device tensor to the host."""
    if isinstance(tensor, np.ndarray):
        return tensor_stats(tensor)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        t = tensor.detach()
        if t.device.type == "cpu" and t.layout == torch.strided:
            return tensor_stats(torch_to_numpy(t.resolve_conj().resolve_neg()))
        return torch_stats(t)
    ms = sys.modules.get("mindspore")
    if ms is not None and isinstance(tensor, ms.Tensor):
        if _ms_on_cpu(tensor):
            return tensor_stats(ms_view(tensor))
        return mindspore_stats(tensor)
    raise AlignerError(f"aligner statistics need a torch or MindSpore tensor or a numpy array, "
                       f"got {type(tensor).__name__}")


def fast_stats_of(tensor: Any) -> Stats:
    """The statistics a dump records of a tensor already in host memory, computed now without copying it: one pass of
    the fused kernel (`fast_stats`) over a zero-copy view for float32/float64, on the calling thread (a second
    kernel thread measured slower inside a training step: it competes with the framework's pool, whose threads spin
    between ops: resnet18 1.33x vs 1.26x); the exact `stats_of` for other dtypes."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        if tensor.dtype in (torch.float32, torch.float64):  # a negated view's values resolved (its memory holds -v)
            return fast_stats(torch_to_numpy(tensor.detach().resolve_neg()))
        return stats_of(tensor)
    return fast_stats(tensor if isinstance(tensor, np.ndarray) else ms_view(tensor))


def _assemble(floating: bool, numel: int, head: list[float], counts: list[float]) -> Stats:
    """The statistics from the transferred vector: [min, max, sum, sum of squares] over the finite elements (the
    kernel's, `triton_stats`, then their sum scaled down, for a mean whose sum overflows float64) and the counts [nan,
    inf, zeros, |v| <= NEAR_ZERO, |v| >= NEAR_ONE, |v| < TINY]."""
    nan, inf, zeros, near_zero, near_one, below = (int(c) for c in counts)
    finite = numel - nan - inf
    rest = fractions(numel, zeros, near_zero, near_one, below)
    if not finite:
        return Stats(min=None, max=None, mean=None, l2=None if floating else 0.0, nan=nan, inf=inf, **rest)
    low, high, total, squares = head[:4]
    mean = float(total) / finite
    if not np.isfinite(total) and len(head) > 4:
        mean = float(head[4]) / finite * 2.0 ** triton_stats.SCALE_BITS
    return Stats(min=float(low), max=float(high), mean=mean, l2=float(np.sqrt(squares)), nan=nan, inf=inf, **rest)


def torch_stats(tensor: Any) -> Stats:
    """`tensor_stats` computed by torch on the tensor's own device; one host transfer of a small vector (the queued
    reductions of `torch_stats_queued`, read back at once)."""
    queued = torch_stats_queued(tensor)
    return read_queued([queued])[0] if isinstance(queued, QueuedStats) else queued


@dataclasses.dataclass(frozen=True)
class QueuedStats:
    """The statistics of an accelerator tensor as one device vector, queued behind the ops already issued and read
    back later (`read_queued`) with others in one transfer, so recording it makes the training thread wait for
    nothing."""

    vector: Any  # float64 on the tensor's device: [min, max, sum, sum of squares] of the finite elements, the counts
    floating: bool
    numel: int


def torch_stats_queued(tensor: Any) -> QueuedStats | Stats:
    """The statistics of a torch tensor as reductions queued on its device now (a later in-place op queues behind
    them, so it cannot change them), read back by `read_queued`; an empty tensor's at once. Extrema and sums are
    taken over the finite elements (NaN/Inf masked), so one transfer serves a tensor that holds NaN or Inf too."""
    import torch

    x = tensor.detach().reshape(-1)
    numel = x.numel()
    floating = x.is_floating_point()
    if numel == 0:
        return empty_stats(floating)
    f64 = torch.float64
    if not floating:
        x = x.to(f64)
    elif x.element_size() < 4:
        x = x.float()
    mag = x.abs()
    finite = torch.isfinite(x)
    x64 = torch.where(finite, x.to(f64), 0.0)
    low = torch.where(finite, x, torch.inf).min().to(f64)
    high = torch.where(finite, x, -torch.inf).max().to(f64)
    counts = torch.stack((torch.isnan(x).sum(), torch.isinf(x).sum(), (x == 0).sum(), (mag <= NEAR_ZERO).sum(),
                          (mag >= NEAR_ONE).sum(), (mag < TINY).sum())).to(f64)
    head = torch.stack((low, high, x64.sum(), torch.dot(x64, x64)))
    return QueuedStats(torch.cat((head, counts)), floating, numel)


def read_queued(queued: list[QueuedStats]) -> list[Stats]:
    """The statistics of queued vectors, in their order: one transfer per device (it waits for their ops)."""
    import torch

    values: dict[int, list[float]] = {}
    by_device: dict[Any, list[int]] = {}
    for i, q in enumerate(queued):
        by_device.setdefault(q.vector.device, []).append(i)
    for indices in by_device.values():
        rows = torch.stack([queued[i].vector for i in indices]).cpu().tolist()
        values.update(zip(indices, rows))
    return [_assemble(q.floating, q.numel, values[i][:4], values[i][4:]) for i, q in enumerate(queued)]


# A StatsStage buffer holds STAGE_ELEMENTS (16 MiB as float32, ~130 MiB more while it is read) and takes tensors of
# at most STAGE_MAX elements: segment_reduce is parallel over many short segments, not along a long one (staging
# resnet18's large activations, 2**23 elements a buffer, made 20 flushes a step wait ~5 ms each on an H200), so a
# bigger tensor is reduced alone (torch_stats_queued). Where Triton runs (`triton_stats.usable`) every floating tensor
# goes through its one-pass kernel instead, its rows in a table of TABLE_ROWS (1.25 MiB; a full table is followed by
# another, so the kernel path never waits). docs/scale.md has the device figures.
STAGE_ELEMENTS = 1 << 22
STAGE_MAX = 1 << 18
TABLE_ROWS = 1 << 14
KERNEL_ABOVE = 0  # tensors of more elements than this take the kernel, the others the copy (bench_dump tries both)
KERNEL = "kernel"  # the second half of a kernel table's key (the first is the device)


@dataclasses.dataclass(frozen=True)
class Staged:
    """A tensor's place in a StatsStage: which buffer (device and width, or device and KERNEL), which segment, and the
    device bytes of kernel table rows it holds until the stage is read (0 in a copy buffer, which has a fixed size)."""

    key: tuple[Any, Any]
    index: int
    table_bytes: int = 0


class StatsStage:
    """The statistics of many accelerator tensors read back at once. With Triton (`triton_stats`), each floating
    tensor is reduced by one kernel launch into rows of a device table (`reduce`). Otherwise a small one is copied
    into a flat device buffer by one queued kernel (`add`; 16-bit floats widen to float32, float64 stays), and `read`
    reduces every segment together (segment_reduce: ~20 kernels per buffer, where `torch_stats_queued` launches ~20
    per tensor). Either way one transfer per buffer or table."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, Any], Any] = {}
        self._lengths: dict[tuple[Any, Any], list[int]] = {}
        self._used: dict[tuple[Any, Any], int] = {}
        self._tables: dict[Any, list[tuple[Any, int]]] = {}  # by device: (table, rows used), the last one filling
        self._starts: dict[tuple[Any, Any], list[int]] = {}  # by kernel key: each tensor's first row, all tables'
        self._rows: dict[Any, int] = {}  # by device: the rows its tables hold so far (the next tensor's first row)

    @staticmethod
    def _key(tensor: Any) -> tuple[Any, Any] | None:
        """The copy buffer a torch tensor is staged in (device, width); None for one that is not copied."""
        import torch

        if not tensor.is_floating_point() or not 0 < tensor.numel() <= STAGE_MAX:
            return None
        return tensor.device, torch.float64 if tensor.dtype == torch.float64 else torch.float32

    def full(self, tensor: Any) -> bool:
        """Whether `tensor` would be copied (`add`) but its buffer has no room left for it: read the stage first."""
        key = self._key(tensor)
        return key is not None and self._used.get(key, 0) + tensor.numel() > STAGE_ELEMENTS

    def reduce(self, tensor: Any) -> Staged | None:
        """Queue the kernel over a torch tensor it takes (`by_kernel`); None for any other tensor, or when the kernel
        fails (it is not used again in this process: `triton_stats.failed`)."""
        if not by_kernel(tensor):
            return None
        try:
            return self._reduce(tensor)  # the kernel reads its address: no detached view needed
        except Exception as exc:  # Triton's first compile (a missing C compiler, say): torch's reductions
            triton_stats.failed(exc)
            return None

    def _reduce(self, t: Any) -> Staged:
        """Launch the kernel over `t` into the next free rows of its device's table (a new table when they run
        out)."""
        import torch

        rows = triton_stats.programs(t.numel())[0]
        tables = self._tables.setdefault(t.device, [])
        if not tables or tables[-1][1] + rows > TABLE_ROWS:
            tables.append((torch.empty((TABLE_ROWS, triton_stats.COLUMNS), dtype=torch.float64, device=t.device), 0))
        table, used = tables[-1]
        triton_stats.launch(t, table, used, triton_stats.thresholds(t.device, t.dtype == torch.float64))
        tables[-1] = (table, used + rows)
        key = (t.device, KERNEL)
        self._starts.setdefault(key, []).append(self._rows.get(t.device, 0))
        self._rows[t.device] = self._rows.get(t.device, 0) + rows
        lengths = self._lengths.setdefault(key, [])
        lengths.append(t.numel())
        return Staged(key, len(lengths) - 1, rows * triton_stats.COLUMNS * 8)

    def add(self, tensor: Any) -> Staged | None:
        """Queue the copy of a floating torch tensor of at most STAGE_MAX elements (`full` said there is room): the way
        where the kernel does not run (`reduce` gave None); None for a tensor that is not copied."""
        import torch

        t = tensor.detach()
        key = self._key(t)
        if key is None:
            return None
        n, width, used = t.numel(), key[1], self._used.get(key, 0)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = torch.empty(STAGE_ELEMENTS, dtype=width, device=t.device)
        buffer[used:used + n].view(t.shape).copy_(t)
        lengths = self._lengths.setdefault(key, [])
        lengths.append(n)
        self._used[key] = used + n
        return Staged(key, len(lengths) - 1)

    def read(self) -> dict[tuple[Any, Any], list[Stats]]:
        """Every staged tensor's statistics, by buffer or table and segment (one transfer each); the stage is empty
        after, its buffers and tables given back."""
        out = {key: self._read_table(key) if key[1] == KERNEL else self._read(key) for key in self._lengths}
        self._lengths.clear()
        self._used.clear()
        self._buffers.clear()  # back to the framework's allocator: a closed dump holds no device memory
        self._tables.clear()
        self._starts.clear()
        self._rows.clear()
        return out

    def _read_table(self, key: tuple[Any, Any]) -> list[Stats]:
        import torch

        rows = torch.cat([table[:used] for table, used in self._tables[key[0]]]).cpu().numpy()
        head, counts = triton_stats.combine(rows, np.asarray(self._starts[key]))
        return [_assemble(True, n, h, c) for n, h, c in zip(self._lengths[key], head.tolist(), counts.tolist())]

    def _read(self, key: tuple[Any, Any]) -> list[Stats]:
        import torch

        lengths = self._lengths[key]
        x = self._buffers[key][:self._used[key]]
        device = x.device
        lens = torch.tensor(lengths, device=device)
        f64 = torch.float64

        def seg(v: Any, how: str) -> Any:
            return torch.segment_reduce(v, how, lengths=lens, unsafe=True)  # unsafe: no check, so no wait

        finite = torch.isfinite(x)
        x64 = torch.where(finite, x, 0.0).to(f64)
        mag = x.abs()
        # counts as float32 sums of 0/1, one mask at a time (memory): exact, a segment holds < 2**24 elements
        counts = [seg(mask.to(torch.float32), "sum").to(f64) for mask in (
            torch.isnan(x), torch.isinf(x), x == 0, mag <= NEAR_ZERO, mag >= NEAR_ONE, mag < TINY)]
        table = torch.stack([seg(torch.where(finite, x, torch.inf), "min").to(f64),
                             seg(torch.where(finite, x, -torch.inf), "max").to(f64),
                             seg(x64, "sum"), seg(x64 * x64, "sum"), *counts], dim=1)
        rows = table.cpu().tolist()
        return [_assemble(True, n, row[:4], row[4:]) for n, row in zip(lengths, rows)]


def by_kernel(tensor: Any) -> bool:
    """Whether a torch tensor's statistics are queued by the Triton kernel (`triton_stats.usable`, above
    KERNEL_ABOVE)."""
    return triton_stats.usable(tensor) and tensor.numel() > KERNEL_ABOVE


def mindspore_stats(tensor: Any) -> Stats:
    """`tensor_stats` computed by MindSpore on the tensor's own device; one host transfer of a small vector."""
    import mindspore as ms
    from mindspore import mint, ops

    numel = int(tensor.size)
    floating = ms.dtype.is_floating_point(tensor.dtype) if hasattr(ms.dtype, "is_floating_point") else \
        tensor.dtype in (ms.float16, ms.bfloat16, ms.float32, ms.float64)
    if numel == 0:
        return empty_stats(floating)
    f64 = ms.float64
    x = tensor.reshape(-1)
    if not floating:
        x = x.astype(f64)
    elif tensor.dtype in (ms.float16, ms.bfloat16):
        x = x.astype(ms.float32)
    mag = mint.abs(x)
    counts = ops.stack((mint.isnan(x).astype(f64).sum(), mint.isinf(x).astype(f64).sum(),
                         (x == 0).astype(f64).sum(), (mag <= NEAR_ZERO).astype(f64).sum(),
                         (mag >= NEAR_ONE).astype(f64).sum(), (mag < TINY).astype(f64).sum()))
    values = [float(v) for v in ops.cat((_ms_head(x, f64), counts)).asnumpy()]
    if values[4] or values[5]:  # NaN or Inf: min/max/sum over the finite elements only (a second, rare transfer)
        kept = mint.masked_select(x, mint.isfinite(x))
        if int(kept.size):
            values[:4] = [float(v) for v in _ms_head(kept, f64).asnumpy()]
    return _assemble(floating, numel, values[:4], values[4:])


def _ms_head(x: Any, f64: Any) -> Any:
    """[min, max, sum, sum of squares] of a flat MindSpore tensor, as one float64 tensor (sums in float64)."""
    from mindspore import mint, ops

    x64 = x.astype(f64)
    return ops.stack((mint.min(x).astype(f64), mint.max(x).astype(f64), x64.sum(), (x64 * x64).sum()))


def _ms_on_cpu(tensor: Any) -> bool:
    """Whether a MindSpore tensor's memory is host memory: always on a CPU target, else its device (reading it waits
    for the op that writes the tensor)."""
    if ms_cpu_target():
        return True
    return str(getattr(tensor, "device", None) or "").upper().startswith("CPU")


def ms_cpu_target() -> bool:
    """Whether MindSpore is loaded and its context runs on the CPU target (every tensor in host memory)."""
    ms = sys.modules.get("mindspore")
    return ms is not None and str(ms.get_context("device_target")).upper().startswith("CPU")


def ms_deferrable(tensor: Any, dtype: str) -> Any:
    """What to keep of a MindSpore float tensor (`dtype`: its canonical name) to compute its statistics later without
    waiting for its op now: the tensor itself (MindSpore ops return new tensors), or for a Parameter (changed in place
    by optimizers and BatchNorm) a copy queued behind the ops already issued; None for anything else (reduced now)."""
    ms = sys.modules.get("mindspore")
    if ms is None or dtype not in ("float32", "float64") or not isinstance(tensor, ms.Tensor):
        return None
    return _ms_copy()(tensor) if isinstance(tensor, ms.Parameter) else tensor


@functools.cache
def _ms_copy() -> Any:
    """A byte-exact MindSpore copy queued behind the ops already issued: `Tensor.copy_` into `mint.empty_like`, both
    PyBoost ops, which return at once. `ops.deepcopy` (an op of the older launch path) waits for the ops queued before
    it (2.6-4 ms a call behind a few queued matmuls here); the twin CNN's four BatchNorm buffer copies a step cost 3.5
    ms more with it than with these (paired over 600 steps; docs/scale-mindspore.md), as much as holding no copy. The
    originals, unwrapped: an `ops=True` dump wraps both functions to record them, and the in-place guard `copy_`."""
    ms = sys.modules["mindspore"]
    empty_like, copy_ = inspect.unwrap(ms.mint.empty_like), inspect.unwrap(ms.Tensor.copy_)
    return lambda tensor: copy_(empty_like(tensor), tensor)


def ms_views() -> Callable[[Any], np.ndarray]:
    """`ms_view`, once every MindSpore op queued so far has run (one wait for them all: a view reads the memory as it
    is, without the wait `asnumpy` makes); where that wait raises (a queued op failed), `asnumpy`, which raises it
    again for each record (the flush records it as skipped)."""
    from mindspore.graph.api import _pynative_executor

    try:
        _pynative_executor.sync()
    except Exception:
        return ms_numpy
    return ms_view


def ms_view(tensor: Any) -> np.ndarray:
    """A MindSpore CPU tensor's memory as numpy, without a copy (read it after `ms_views`' wait); bfloat16 as
    ml_dtypes'. A contiguous tensor of a numpy type is wrapped from its data pointer, the array holding the tensor:
    `asnumpy` took ~60 us a tensor at a step's exit (~13 us warm), most of it numpy parsing the buffer's format in
    Python, and the writer waited on that."""
    dtype = _ms_numpy(tensor.dtype)
    if dtype is None or not tensor.is_contiguous() or not tensor.size:
        return ms_numpy(tensor)
    memory = (ctypes.c_char * (tensor.size * dtype.itemsize)).from_address(tensor._data_ptr())
    memory.tensor = tensor  # alive as long as the array is
    return np.frombuffer(memory, dtype).reshape(tensor.shape)


@functools.cache
def _ms_numpy(dtype: Any) -> np.dtype | None:
    """The numpy dtype a MindSpore tensor's memory reads as (bfloat16: ml_dtypes'), None for one numpy has not."""
    try:
        return NUMPY[canonical(dtype)]
    except AlignerError:  # a dtype aligner does not store (asnumpy says what it is)
        return None


def torch_watch_stats(tensor: Any, full: bool) -> Stats:
    """What `aligner.watch` reads of a CPU float torch tensor, at once (no copy, so a later in-place op cannot change
    it): with `full`, every statistic (`fast_stats_of`: one pass); without, the exact extrema and NaN/Inf counts in
    one `aminmax` pass (every statistic when there is a NaN or Inf)."""
    import torch

    t = tensor.detach()
    n = t.numel()
    if full or n == 0:
        return fast_stats_of(t)
    lo, hi = (float(v) for v in torch.aminmax(t))
    if not (np.isfinite(lo) and np.isfinite(hi)):  # NaN/Inf (rare): exact counts, extrema over the finite ones
        return fast_stats_of(t)
    return extrema_only(lo, hi, n)
