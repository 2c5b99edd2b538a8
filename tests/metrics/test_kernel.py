"""The fused C kernel against torch.isclose and numpy references, with NaN/Inf/zeros/overflow across block edges."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.metrics.kernel import Totals, accumulate
from aligner.metrics.measure import compare_arrays

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, "tiny", "max", "-max"]  # tiny: a denormal; max: squares overflow


def _reference(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> dict:
    """The metrics the kernel must produce, computed with plain numpy in the arrays' own dtype."""
    t = a.dtype.type
    with np.errstate(all="ignore"):
        fin = np.isfinite(a) & np.isfinite(b)
        d = np.abs(a - b)
        far = d > t(atol) + t(rtol) * np.abs(b)
        agree = (np.isnan(a) & np.isnan(b)) | (a == b)
        fd, fb = d[fin], np.abs(b[fin])
        rel = np.where(fd > 0, fd / fb, 0)
        sdd = float(np.sum(fd.astype(np.float64) ** 2))
    return {
        "mismatched": int(np.count_nonzero(fin & far) + np.count_nonzero(~fin & ~agree)),
        "count": int(fin.sum()),
        "nan": (int(np.isnan(a).sum()), int(np.isnan(b).sum())),
        "inf": (int(np.isinf(a).sum()), int(np.isinf(b).sum())),
        "max_abs": float(fd.max()) if fd.size else None,
        "max_abs_at": int(np.flatnonzero(fin)[np.argmax(fd)]) if fd.size else None,
        "max_rel": float(rel.max()) if fd.size else None,
        "sdd": sdd,
    }


def _with_specials(data: st.DataObject, n: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    b = rng.standard_normal(n).astype(dtype)
    a = (b + rng.choice([0.0, 1e-6, 1e-3], size=n) * rng.standard_normal(n)).astype(dtype)
    for arr in (a, b):
        spots = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=6)) if n else []
        info = np.finfo(dtype)
        named = {"tiny": info.smallest_subnormal, "max": info.max, "-max": -info.max}
        for i in spots:
            value = data.draw(st.sampled_from(SPECIALS))
            arr[i] = named.get(value, value)
    return a, b


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(0, 7000), dtype=st.sampled_from([np.float32, np.float64]))
def test_kernel_matches_references_with_special_values(data: st.DataObject, n: int, dtype: type) -> None:
    a, b = _with_specials(data, n, dtype)
    rtol, atol = (1.3e-6, 1e-5) if dtype is np.float32 else (1e-7, 1e-7)
    totals = Totals()
    accumulate(a, b, rtol, atol, totals)
    ref = _reference(a, b, rtol, atol)
    close = torch.isclose(torch.from_numpy(a), torch.from_numpy(b), rtol=rtol, atol=atol, equal_nan=True)
    assert totals.mismatched == ref["mismatched"] == int((~close).sum())
    assert (totals.offset, totals.count) == (n, ref["count"])
    assert (totals.nan_a, totals.nan_b) == ref["nan"] and (totals.inf_a, totals.inf_b) == ref["inf"]
    if ref["max_abs"] is not None:
        assert totals.max_abs == ref["max_abs"] and totals.max_abs_at == ref["max_abs_at"]
        assert totals.max_rel == ref["max_rel"]
        assert totals.sdd == pytest.approx(ref["sdd"], rel=1e-9)


def test_chunks_fed_one_by_one_give_the_whole_answer() -> None:
    rng = np.random.default_rng(5)
    b = rng.standard_normal(10_000).astype(np.float32)
    a = b + np.float32(1e-4) * rng.standard_normal(10_000).astype(np.float32)
    a[4321] = np.nan
    whole, pieces = Totals(), Totals()
    accumulate(a, b, 1.3e-6, 1e-5, whole)
    for start in range(0, a.size, 999):
        accumulate(a[start:start + 999], b[start:start + 999], 1.3e-6, 1e-5, pieces)
    assert (pieces.mismatched, pieces.max_abs, pieces.max_abs_at, pieces.max_rel, pieces.nan_a) == \
           (whole.mismatched, whole.max_abs, whole.max_abs_at, whole.max_rel, whole.nan_a)
    assert pieces.sab == pytest.approx(whole.sab, rel=1e-12)


def test_overflowing_difference_of_finite_values_is_reported_not_hidden() -> None:
    b = np.zeros(5000, np.float32)
    a = b.copy()
    a[3000], b[3000] = 3e38, -3e38  # finite inputs whose float32 difference is inf
    m = compare_arrays(a, b)
    assert m.max_abs_err == np.inf and m.max_abs_index == (3000,) and m.mismatched == 1
    assert (m.nan_a, m.inf_a, m.nan_b, m.inf_b) == (0, 0, 0, 0)


def test_kernel_refuses_mismatched_or_strided_input() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        accumulate(np.zeros(3, np.float32), np.zeros(3, np.float64), 0.0, 0.0, Totals())
    with pytest.raises(ValueError, match="C-contiguous"):
        accumulate(np.zeros(6, np.float32)[::2], np.zeros(3, np.float32), 0.0, 0.0, Totals())

