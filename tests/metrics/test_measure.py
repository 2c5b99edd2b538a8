"""compare_arrays / compare_streams / compare_stats against torch.testing and float64 numpy references."""
from __future__ import annotations

import math

import ml_dtypes
import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.core.tolerance import Tolerance
from aligner.metrics.measure import MemoryStream, compare_arrays, compare_stats, compare_streams
from aligner.metrics.stats import tensor_stats


def _noisy(shape: tuple[int, ...], scale: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.standard_normal(shape).astype(np.float32)
    return (b + scale * rng.standard_normal(shape)).astype(np.float32), b


def test_metrics_match_torch_and_float64_references() -> None:
    a, b = _noisy((7, 300, 211), 1e-5)
    m = compare_arrays(a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert m.mismatched == int((~torch.isclose(ta, tb, rtol=1.3e-6, atol=1e-5)).sum()) > 0
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    assert m.max_abs_err == pytest.approx(d.max(), rel=1e-6)
    assert m.max_abs_index == np.unravel_index(np.argmax(d), b.shape)
    assert m.max_rel_err == pytest.approx((d / np.abs(b)).max(), rel=1e-5)
    assert m.mean_abs_err == pytest.approx(d.mean(), rel=1e-5)
    assert m.rmse == pytest.approx(math.sqrt((d ** 2).mean()), rel=1e-5)
    b64 = b.astype(np.float64)
    assert m.rel_l2_err == pytest.approx(np.linalg.norm(d) / np.linalg.norm(b64), rel=1e-5)
    assert m.sqnr_db == pytest.approx(10 * math.log10((b64 ** 2).sum() / (d ** 2).sum()), abs=1e-4)
    assert m.cosine == pytest.approx(1.0, abs=1e-6)
    assert (m.rtol, m.atol) == (1.3e-6, 1e-5)
    assert m.mismatch_fraction == pytest.approx(m.mismatched / b.size)
    assert not m.allclose and m.diverged


def test_identical_arrays_allclose_and_override_tolerance() -> None:
    a, b = _noisy((1000,), 1e-4)
    assert compare_arrays(b, b.copy()).allclose
    assert compare_arrays(b, b.copy()).sqnr_db == math.inf
    assert not compare_arrays(a, b).allclose
    assert compare_arrays(a, b, Tolerance(rtol=0, atol=1e-2)).allclose


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3000), chunk=st.integers(1, 700), seed=st.integers(0, 2**16))
def test_chunking_does_not_change_the_answer(n: int, chunk: int, seed: int) -> None:
    a, b = _noisy((n,), 3e-5, seed)
    whole = compare_streams(MemoryStream(a), MemoryStream(b), chunk=1 << 20)
    pieces = compare_streams(MemoryStream(a), MemoryStream(b), chunk=chunk)
    assert pieces.mismatched == whole.mismatched
    assert pieces.max_abs_err == whole.max_abs_err and pieces.max_abs_index == whole.max_abs_index
    assert pieces.max_rel_err == whole.max_rel_err
    if n:
        assert pieces.rmse == pytest.approx(whole.rmse, rel=1e-5)


def test_non_contiguous_views_compare_in_c_order() -> None:
    a, b = _noisy((40, 60), 1e-3)
    m = compare_arrays(a.T, np.ascontiguousarray(b.T))
    d = np.abs(a.T.astype(np.float64) - b.T)
    assert m.max_abs_index == np.unravel_index(np.argmax(d), d.shape)
    assert m.mismatched == int((~np.isclose(a.T, b.T, rtol=1.3e-6, atol=1e-5)).sum())


def test_nan_and_inf_counts_and_agreement() -> None:
    b = np.arange(10, dtype=np.float32)
    a = b.copy()
    a[2], a[5] = np.nan, np.inf
    m = compare_arrays(a, b)
    assert (m.nan_a, m.inf_a, m.nan_b, m.inf_b) == (1, 1, 0, 0)
    assert m.mismatched == 2 and m.max_abs_err == 0.0
    same = b.copy()
    same[2], same[5] = np.nan, -np.inf
    twin = same.copy()
    assert compare_arrays(same, twin).allclose  # identical NaN / same-signed Inf positions agree
    twin[5] = np.inf
    assert compare_arrays(same, twin).mismatched == 1


def test_per_dtype_default_tolerances() -> None:
    assert Tolerance.for_dtype("float16", "float16") == Tolerance(1e-3, 1e-5)
    assert Tolerance.for_dtype("bfloat16", "float32") == Tolerance(1.6e-2, 1e-5)
    assert Tolerance.for_dtype("float64", "float64") == Tolerance(1e-7, 1e-7)
    assert Tolerance.for_dtype("int64", "int64") == Tolerance(0.0, 0.0)
    b = np.linspace(1, 2, 100, dtype=np.float32)
    a16 = (b * (1 + 5e-4)).astype(np.float16)
    assert compare_arrays(a16, b.astype(np.float16)).allclose
    assert not compare_arrays(a16.astype(np.float32), b).allclose
    bf = b.astype(ml_dtypes.bfloat16)
    assert compare_arrays(bf, bf).allclose and compare_arrays(bf, bf).dtype_a == "bfloat16"
    assert compare_arrays(np.arange(5), np.arange(5) + np.array([0, 0, 1, 0, 0])).mismatched == 1


def test_float64_arrays_are_compared_in_float64() -> None:
    b = np.linspace(1, 2, 1000)
    a = b * (1 + 5e-8)
    assert compare_arrays(a, b).allclose
    assert not compare_arrays(b * (1 + 5e-7), b).allclose


def test_shape_and_dtype_disagreement() -> None:
    m = compare_arrays(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert m.method == "none" and not m.shape_match and m.diverged and m.max_abs_err is None
    squeezed = compare_arrays(np.ones((1, 5), np.float32), np.ones(5, np.float32))
    assert squeezed.allclose and not squeezed.shape_match and squeezed.method == "elements"
    dt = compare_arrays(np.ones(4, np.float16), np.ones(4, np.float32))
    assert dt.allclose and not dt.dtype_match and dt.diverged
    ids = compare_arrays(np.arange(6, dtype=np.int32), np.arange(6, dtype=np.int64))  # MindSpore vs torch indices
    assert not ids.dtype_match and not ids.diverged
    assert compare_arrays(np.arange(6, dtype=np.int32), np.arange(1, 7, dtype=np.int64)).diverged


def test_statistics_compare_by_norm_not_by_relative_mean() -> None:
    a, b = _noisy((4096,), 1e-7, seed=3)
    b -= b.mean()  # mean ~ 0: a relative error of means would explode
    a = (b + np.float32(1e-7) * np.random.default_rng(4).standard_normal(b.shape)).astype(np.float32)
    assert compare_arrays(a, b).allclose
    ok = compare_stats(tensor_stats(a), tensor_stats(b), a.shape, b.shape, "float32", "Float32")
    assert ok.method == "stats" and ok.allclose and ok.dtype_match
    bad = compare_stats(tensor_stats(a * 1.01), tensor_stats(b), a.shape, b.shape, "float32", "float32")
    assert not bad.allclose and bad.rel_l2_err == pytest.approx(0.01, rel=1e-3)
    nan = a.copy()
    nan[0] = np.nan
    assert not compare_stats(tensor_stats(nan), tensor_stats(b), a.shape, b.shape, "float32", "float32").allclose
    # a statistic one side did not record (msprobe omits Mean and Norm at times) is not a mismatch; a recorded None
    # (no finite element on that side) against a number is
    partial = msgspec.structs.replace(tensor_stats(b), mean=msgspec.UNSET, l2=msgspec.UNSET)
    assert compare_stats(tensor_stats(a), partial, a.shape, b.shape, "float32", "float32").allclose
    assert not compare_stats(tensor_stats(a * 1.01), partial, a.shape, b.shape, "float32", "float32").allclose
    empty = msgspec.structs.replace(tensor_stats(b), mean=None)
    assert compare_stats(tensor_stats(a), empty, a.shape, b.shape, "float32", "float32").mismatched == 1


def test_a_side_that_broadcasts_to_the_other_is_compared_broadcast() -> None:
    """A position table returned as a [16, 64] slice on one side and a [2, 16, 64] gather on the other holds equal
    values: compared as broadcast, in either order (it was 'shape mismatch', never compared: a false divergence)."""
    table = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    gathered = np.broadcast_to(table, (2, 16, 64)).copy()
    for a, b in ((table, gathered), (gathered, table)):
        m = compare_streams(MemoryStream(a), MemoryStream(b), chunk=100)  # chunks cut across the broadcast rows
        assert m.method == "elements" and m.allclose and not m.diverged and m.numel == 2 * 16 * 64
        assert not m.shape_match  # still reported as a shape difference
    gathered[1, 3, 5] += 1.0  # the second copy differs at one element: found, at its index in the wide shape
    m = compare_arrays(gathered, table)
    assert m.diverged and m.mismatched == 1 and m.max_abs_index == (1, 3, 5)
    assert compare_arrays(np.zeros((3, 4)), np.zeros((4, 3))).method == "none"  # no broadcast: not compared
    assert compare_arrays(np.zeros((2, 3)), np.zeros((3, 3))).method == "none"


def test_a_layout_that_merges_consecutive_dimensions_is_compared_in_order() -> None:
    """timm's Swin keeps [B, H, W, C] where mindcv keeps [B, H*W, C]: the same elements in the same C order, compared
    elementwise (it was a 'shape mismatch' on every record of a clean pair); a transpose ([B, C, H*W]) is not."""
    nhwc = np.random.default_rng(1).standard_normal((2, 8, 8, 16)).astype(np.float32)
    flat = nhwc.reshape(2, 64, 16).copy()
    for a, b in ((nhwc, flat), (flat, nhwc)):
        m = compare_arrays(a, b)
        assert m.method == "elements" and m.allclose and not m.shape_match
    assert compare_arrays(flat.transpose(0, 2, 1).copy(), nhwc).method == "none"
    stats = tensor_stats(nhwc)
    assert compare_stats(stats, stats, (2, 8, 8, 16), (2, 64, 16), "float32", "float32").allclose


def test_the_same_rows_in_another_order_are_an_order_only_difference() -> None:
    """An MoE expert receives its tokens sorted by torch's unstable CPU argsort on one side and MindSpore's stable
    one on the other: the same rows in another order. Not a divergence (it blamed a correct expert), reported as
    such; rows that differ, or a transpose, still diverge."""
    from aligner.metrics.measure import same_rows

    rows = np.random.default_rng(2).standard_normal((6, 8)).astype(np.float32)
    shuffled = rows[[3, 0, 5, 1, 4, 2]]
    assert compare_arrays(shuffled, rows).diverged  # elementwise they differ...
    assert same_rows(MemoryStream(shuffled), MemoryStream(rows))  # ...but hold the same rows
    changed = shuffled.copy()
    changed[0, 0] += 1e-2
    assert not same_rows(MemoryStream(changed), MemoryStream(rows))
    assert not same_rows(MemoryStream(rows.T.copy()), MemoryStream(rows[:, :6].T.copy()))
