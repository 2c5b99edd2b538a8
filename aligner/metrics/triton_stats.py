"""The statistics of an accelerator torch tensor in one pass: a Triton kernel whose programs each write one row of
partial statistics into a device table, read back later with the other tensors' rows in one transfer and combined on
the host (`combine`). torch's own reductions launch ~20 kernels per tensor (a mask, a `where` and a reduction each);
this is one launch, no allocation and no wait (a stats-only resnet18 step on an H200: 3.4x the floor, against 9.6x;
docs/scale.md).

The columns of a row (`COLUMNS`): minimum, maximum, sum and sum of squares of the finite elements (float64), their sum
scaled by 2**-SCALE_BITS (the mean of float64 values whose sum overflows, as `unscaled_mean` gives it), then the counts
of NaN, of infinities, of zeros, of |v| <= NEAR_ZERO, of |v| >= NEAR_ONE and of |v| < TINY. Values are widened
to float64 in the kernel and compared with thresholds already rounded to the tensor's own float width (float32 for
16-bit floats), which is how `tensor_stats` compares them: the same counts and extrema exactly, sums to float64
rounding. Triton ships with torch's CUDA builds; where it is missing or its first compile fails (no C compiler for its
launcher), `usable` is False, `why_not` says why, and the caller keeps torch's reductions.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Any

import numpy as np

from aligner.metrics.stats import NEAR_ONE, NEAR_ZERO, TINY

COLUMNS = 11
HEAD = 5  # the columns before the counts
SCALE_BITS = 64  # 2**63 elements of float64's largest value, scaled so, sum to below its maximum
BLOCK = 1024  # elements a program loads per iteration
MAX_PROGRAMS = 256  # rows a tensor writes at most: ~2 waves on a 132-SM GPU, 20 KiB to read back
# devices the kernel runs on: Triton's GPU backends (ROCm's torch says "cuda" too); tests add "cpu" under
# TRITON_INTERPRET=1, Triton's interpreter
DEVICES = frozenset({"cuda"})
FLOATS = ("float16", "bfloat16", "float32", "float64")

_failed: list[str] = []  # why the kernel is not used in this process (its first failure), once it failed


def usable(tensor: Any) -> bool:
    """Whether a tensor (any framework's) can go through the kernel: a strided plain torch tensor or Parameter (a
    subclass, a DTensor say, may have no data of its own to read), a float of FLOATS on a device of DEVICES, with
    Triton importable and not failed before in this process."""
    torch = sys.modules.get("torch")  # None in a MindSpore-only process: no torch tensor to take
    return (torch is not None and not _failed and type(tensor) in (torch.Tensor, torch.nn.Parameter)
            and tensor.device.type in DEVICES and tensor.layout == torch.strided
            and str(tensor.dtype)[6:] in FLOATS and _triton_installed())


def failed(exc: Exception) -> None:
    """Stop using the kernel in this process: it failed once (`why_not` says how), and each try would cost again."""
    _failed.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])


def why_not() -> str | None:
    """Why the kernel is not used in this process (Triton missing, or its first failure); None when it is usable."""
    if _failed:
        return _failed[0]
    return None if _triton_installed() else "Triton is not installed"


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def programs(numel: int) -> tuple[int, int]:
    """(programs, iterations each) for a tensor of `numel` elements: at most MAX_PROGRAMS rows, BLOCK elements an
    iteration."""
    blocks = -(-numel // BLOCK)
    iters = -(-blocks // MAX_PROGRAMS)
    return -(-blocks // iters), iters


@functools.cache
def thresholds(device: Any, wide: bool) -> Any:
    """The float64 device vector [NEAR_ZERO, NEAR_ONE, TINY] rounded to the compared width first (float64 for a
    float64 tensor, float32 otherwise): a float64 comparison with it equals `tensor_stats`'s comparison."""
    import torch

    values = np.array([NEAR_ZERO, NEAR_ONE, TINY], np.float64 if wide else np.float32).astype(np.float64)
    return torch.from_numpy(values).to(device)


def launch(tensor: Any, table: Any, row: int, limits: Any) -> int:
    """Queue the kernel over `tensor` (a dense copy first if its elements do not fill one span of memory), writing its
    rows from `row` of `table` (a float64 device tensor of COLUMNS columns) with `limits` from `thresholds`; returns
    the rows written. Nothing waits: a later in-place write to `tensor` queues behind it. A kernel already compiled
    for this dtype, alignment and index width is launched through Triton's compiled handle (the documented
    `compiled[grid](*args)`), skipping the argument binding and cache lookup of each `kernel[grid]` call."""
    if tensor.device.type == "cuda":
        import torch

        if tensor.device.index != torch.cuda.current_device():  # Triton launches on the current device's stream
            with torch.cuda.device(tensor.device):
                return launch(tensor, table, row, limits)
    if tensor.is_neg():  # a negated view (the imaginary part of a conjugate): its memory holds -values
        tensor = tensor.resolve_neg()
    flat = tensor if _dense(tensor) else tensor.contiguous()
    numel = flat.numel()
    count, iters = programs(numel)
    # what Triton specialises the compiled kernel on here: the tensor's dtype, its address's 16-byte alignment and
    # whether numel needs 64 bits (the table and limits are fresh allocations, aligned)
    key = (flat.dtype, flat.data_ptr() % 16 == 0, numel >= 1 << 31, flat.device)
    compiled = _compiled.get(key)
    if compiled is not None:
        compiled[(count, 1, 1)](flat, table, limits, row, numel, iters, BLOCK)
        return count
    compiled = _kernel()[(count,)](flat, table, limits, row, numel, iters, BLOCK=BLOCK, num_warps=4)
    if compiled is not None and flat.device.type != "cpu":  # the interpreter returns None
        _compiled[key] = compiled
    return count


_compiled: dict[tuple[Any, ...], Any] = {}  # Triton's compiled kernels by what they are specialised on


def _dense(t: Any) -> bool:
    """Whether the tensor's elements fill one span of memory from its first element's address, in some order (the
    statistics do not depend on it): contiguous, or dense and permuted (channels-last). Its strides, smallest first,
    are then the products of the sizes before them (dimensions of size 1 aside)."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def combine(rows: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each tensor's (head, counts) from the rows read back: tensors' rows are consecutive, the i-th starting at
    `starts[i]`; head [min, max, sum, sum of squares, scaled sum] over the finite elements (a sum that overflows is
    inf), counts [nan, inf, zeros, near zero, near one, tiny]."""
    with np.errstate(over="ignore", invalid="ignore"):
        sums = np.add.reduceat(rows[:, 2:HEAD], starts, axis=0)
    head = np.column_stack([np.minimum.reduceat(rows[:, 0], starts), np.maximum.reduceat(rows[:, 1], starts), sums])
    return head, np.add.reduceat(rows[:, HEAD:], starts, axis=0)


@functools.cache
def _kernel() -> Any:
    """The jitted kernel (Triton imported and the kernel defined on first use: `align --help` imports no Triton, and
    TRITON_INTERPRET is read when the kernel is defined)."""
    import triton
    import triton.language as tl

    # integers are not specialised (row, numel, iterations vary per tensor: one compile per dtype and alignment)
    @triton.jit(do_not_specialize=["row", "numel", "iters"])
    def partial_stats(x_ptr, out_ptr, limits_ptr, row, numel, iters, BLOCK: tl.constexpr):  # noqa: N803
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * iters * BLOCK
        offsets = tl.arange(0, BLOCK)
        near_zero = tl.load(limits_ptr)
        near_one = tl.load(limits_ptr + 1)
        tiny = tl.load(limits_ptr + 2)
        low = tl.full([BLOCK], float("inf"), tl.float64)
        high = tl.full([BLOCK], float("-inf"), tl.float64)
        total = tl.zeros([BLOCK], tl.float64)
        squares = tl.zeros([BLOCK], tl.float64)
        scaled = tl.zeros([BLOCK], tl.float64)
        nans = tl.zeros([BLOCK], tl.int32)
        infs = tl.zeros([BLOCK], tl.int32)
        zeros = tl.zeros([BLOCK], tl.int32)
        small = tl.zeros([BLOCK], tl.int32)
        large = tl.zeros([BLOCK], tl.int32)
        below = tl.zeros([BLOCK], tl.int32)
        for i in range(iters):
            index = start + i * BLOCK + offsets
            inside = index < numel
            v = tl.load(x_ptr + index, mask=inside, other=0.0).to(tl.float64)
            mag = tl.abs(v)
            finite = inside & (mag < float("inf"))  # NaN compares false
            kept = tl.where(finite, v, 0.0)
            low = tl.minimum(low, tl.where(finite, v, float("inf")))
            high = tl.maximum(high, tl.where(finite, v, float("-inf")))
            total += kept
            squares += kept * kept
            scaled += kept * 5.421010862427522e-20  # 2**-SCALE_BITS: exact, a power of two
            nans += (inside & (v != v)).to(tl.int32)
            infs += (inside & (mag == float("inf"))).to(tl.int32)
            zeros += (inside & (v == 0.0)).to(tl.int32)
            small += (inside & (mag <= near_zero)).to(tl.int32)
            large += (inside & (mag >= near_one)).to(tl.int32)
            below += (inside & (mag < tiny)).to(tl.int32)
        out = out_ptr + (row + pid).to(tl.int64) * 11
        tl.store(out, tl.min(low, 0))
        tl.store(out + 1, tl.max(high, 0))
        tl.store(out + 2, tl.sum(total, 0))
        tl.store(out + 3, tl.sum(squares, 0))
        tl.store(out + 4, tl.sum(scaled, 0))
        tl.store(out + 5, tl.sum(nans, 0).to(tl.float64))
        tl.store(out + 6, tl.sum(infs, 0).to(tl.float64))
        tl.store(out + 7, tl.sum(zeros, 0).to(tl.float64))
        tl.store(out + 8, tl.sum(small, 0).to(tl.float64))
        tl.store(out + 9, tl.sum(large, 0).to(tl.float64))
        tl.store(out + 10, tl.sum(below, 0).to(tl.float64))

    return partial_stats
