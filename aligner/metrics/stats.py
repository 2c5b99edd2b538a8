"""Summary statistics of one tensor (what stats-only dumps record and `align inspect --stats` shows)."""
from __future__ import annotations

from typing import Any

import numpy as np

from aligner.core.dtypes import to_numpy

# Thresholds of the fraction statistics (the health rules of `align check` and `aligner.watch` read them):
NEAR_ZERO = 0.01              # |v| <= this: "near_zero" (dead ReLUs, vanished gradients)
NEAR_ONE = 0.99               # |v| >= this: "near_one" (saturated sigmoid/tanh)
TINY = 6.103515625e-05        # float16's smallest normal: nonzero |v| below it underflow in half precision ("tiny")
STAT_KEYS = ("min", "max", "mean", "l2", "nan", "inf", "zeros", "near_zero", "near_one", "tiny", "numel")


def fractions(numel: int, zeros: int, near_zero: int, near_one: int, below_tiny: int) -> dict[str, Any]:
    """The fraction statistics from element counts (`below_tiny` counts |v| < TINY, zeros included)."""
    nonzero = numel - zeros
    return {"zeros": zeros / numel if numel else 0.0, "near_zero": near_zero / numel if numel else 0.0,
            "near_one": near_one / numel if numel else 0.0,
            "tiny": (below_tiny - zeros) / nonzero if nonzero else 0.0, "numel": numel}


def empty_stats(floating: bool) -> dict[str, Any]:
    """The statistics of a tensor with no elements."""
    return {"min": None, "max": None, "mean": None, "l2": None if floating else 0.0, "nan": 0, "inf": 0,
            **fractions(0, 0, 0, 0, 0)}


def tensor_stats(array: np.ndarray) -> dict[str, Any]:
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
        return {"min": float(a64.min()), "max": float(a64.max()), "mean": float(a64.mean()),
                "l2": float(np.sqrt(np.einsum("i,i->", a64, a64))), "nan": 0, "inf": 0,
                **fractions(n, zeros, int(np.count_nonzero(mag <= NEAR_ZERO)),
                            int(np.count_nonzero(mag >= NEAR_ONE)), int(np.count_nonzero(mag < TINY)))}
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
            total = np.add.reduce(vals, dtype=np.float64)
    # count_nonzero of a comparison, never of the floats themselves (5-30x slower)
    mag = np.abs(flat)
    zeros = int(np.count_nonzero(flat == 0))
    counts = fractions(n, zeros, int(np.count_nonzero(mag <= NEAR_ZERO)), int(np.count_nonzero(mag >= NEAR_ONE)),
                       int(np.count_nonzero(mag < TINY)))
    if vals.size == 0:
        return {"min": None, "max": None, "mean": None, "l2": None, "nan": nan, "inf": inf, **counts}
    v64 = vals.astype(np.float64, copy=False)
    # einsum, not np.dot: BLAS dot wakes its thread pool (2 ms for 24K elements on a busy 2-core machine, 60x this)
    return {"min": float(vals.min()), "max": float(vals.max()), "mean": float(total / vals.size),
            "l2": float(np.sqrt(np.einsum("i,i->", v64, v64))), "nan": nan, "inf": inf, **counts}
