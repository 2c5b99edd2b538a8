"""The one-pass statistics kernel (`fast_stats`) against the numpy reference `tensor_stats`, with NaN/Inf/zeros,
denormals and overflowing squares across block and lane edges, on one and several threads."""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.core.dtypes import to_numpy, to_storable
from aligner.dumping.fstats import fast_stats_of, torch_watch_stats
from aligner.dumping.writer import digest, stats_and_name
from aligner.metrics import _kernel  # type: ignore[attr-defined]  # compiled: mypy sees no module
from aligner.metrics.kernel import digest as kernel_digest
from aligner.metrics.kernel import summarize
from aligner.metrics.stats import NEAR_ONE, NEAR_ZERO, PART, TINY, Stats, fast_stats, tensor_stats

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.01, 0.99, "tiny", "max", "-max"]  # max: squares overflow float


def _assert_same(fast_stats: Stats, ref_stats: Stats, array: np.ndarray) -> None:
    """Counts and extrema exactly; mean and L2 to 1e-12 of their scale: double sums in another order differ by a few
    ulps of double (~1e-16 times n at worst) of the sum of |v| (the mean's scale: a sum that cancels, 3e38 - 3e38 +
    1e-8, is exact in neither order) or of the sum of squares (L2: no cancellation); 1e-12 leaves a 1000x margin."""
    fast, ref = fast_stats.to_dict(), ref_stats.to_dict()
    assert fast.keys() == ref.keys()
    values = array[np.isfinite(array)].astype(np.float64)
    # the mean of |v| with each term divided first: near float64's maximum a plain mean overflows to inf, and an
    # infinite scale would let any mean pass
    scale = {"mean": float(np.abs(values / values.size).sum()) if values.size else 0.0, "l2": ref["l2"] or 0.0}
    for key, want in ref.items():
        got = fast[key]
        if key in scale and want is not None and got is not None and math.isfinite(want):
            assert abs(got - want) <= 1e-12 * scale[key], key
        else:
            assert got == want, key


@settings(max_examples=80, deadline=None)
@given(data=st.data(), n=st.integers(1, 9000), dtype=st.sampled_from([np.float32, np.float64]),
       threads=st.integers(1, 5))
def test_one_pass_matches_the_reference_with_special_values(data: st.DataObject, n: int, dtype: type,
                                                             threads: int) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a = (rng.standard_normal(n) * data.draw(st.sampled_from([1e-7, 1.0, 1e4]))).astype(dtype)
    info = np.finfo(dtype)
    named = {"tiny": info.smallest_subnormal, "max": info.max, "-max": -info.max}
    for i in data.draw(st.lists(st.integers(0, n - 1), max_size=8)):
        value = data.draw(st.sampled_from(SPECIALS))
        a[i] = named.get(value, value)
    _assert_same(fast_stats(a, threads), tensor_stats(a), a)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_large_arrays_split_across_threads_give_the_whole_answer(threads: int) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal(3 * PART + 12345).astype(np.float32)
    a[[7, PART + 1, 3 * PART]] = [np.nan, np.inf, 0.0]  # one special value in each part
    _assert_same(fast_stats(a, threads), tensor_stats(a), a)
    raw = summarize(a, NEAR_ZERO, NEAR_ONE, TINY, threads)
    assert (raw.nan, raw.inf) == (1, 1)


@pytest.mark.parametrize("special", [np.inf, np.nan])
@pytest.mark.parametrize("signs", [(1,), (1, -1)])
def test_finite_values_near_the_maximum_beside_a_special_value_warn_of_nothing(special: float,
                                                                                  signs: tuple[int, ...]) -> None:
    """Their float64 sum overflows (to inf, or with both signs to inf + -inf = NaN: 200 of each, summed pairwise in
    blocks), which both paths handle (the mean scaled); a warning would break a user's run under -W error, so none
    may escape."""
    big = np.finfo(np.float64).max
    a = np.array([s * big for s in signs for _ in range(200)] + [special])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stats in (tensor_stats(a), fast_stats(a)):
            assert (stats.mean, stats.max, stats.l2) == (big if signs == (1,) else 0.0, big, np.inf)
            assert (stats.nan, stats.inf) == ((1, 0) if np.isnan(special) else (0, 1))


def test_no_finite_element_leaves_extrema_unset() -> None:
    stats = fast_stats(np.array([np.nan, np.inf, -np.inf] * 700, np.float32))
    assert (stats.min, stats.max, stats.mean, stats.l2) == (None, None, None, None)
    assert (stats.nan, stats.inf, stats.near_one) == (700, 1400, pytest.approx(2 / 3))


def test_non_contiguous_and_other_dtypes_fall_back_to_the_reference() -> None:
    a = np.arange(40_000, dtype=np.float32).reshape(200, 200).T  # a transposed view: copied, then one pass
    _assert_same(fast_stats(a), tensor_stats(a), a)
    ints = np.arange(-5, 5, dtype=np.int64)
    assert fast_stats(ints) == tensor_stats(ints)


def test_torch_tensors_read_in_place_on_the_framework_threads() -> None:
    t = torch.randn(64, 1000, requires_grad=True) * 3  # a graph tensor: read through detach, never copied
    t.retain_grad()
    ref = tensor_stats(t.detach().numpy())
    _assert_same(fast_stats_of(t), ref, t.detach().numpy())
    _assert_same(torch_watch_stats(t, full=True), ref, t.detach().numpy())
    light = torch_watch_stats(t, full=False)
    assert (light.min, light.max, light.mean) == (ref.min, ref.max, None)
    t2 = torch.randn(20_000)
    t2[5] = float("nan")
    _assert_same(torch_watch_stats(t2, full=False), tensor_stats(t2.numpy()), t2.numpy())  # NaN: every statistic, exact


@pytest.mark.parametrize("values", [[1.0, "max", "max"], ["-max", "-max", 2.0, "-max"]])
def test_a_mean_whose_float64_sum_overflows_is_the_finite_mean(values: list) -> None:
    """Float64 values near its maximum overflow any float64 sum, but their mean fits: both the kernel and the reference
    give it (was -inf from the reference and a finite, order-dependent value from the kernel: a random draw failed)."""
    big = np.finfo(np.float64).max
    a = np.array([{"max": big, "-max": -big}.get(v, v) for v in values], np.float64)
    want = float(np.mean(a / a.size) * a.size)  # each term scaled first: no overflow, exact to a few ulps
    for stats in (tensor_stats(a), fast_stats(a)):
        assert isinstance(stats.mean, float) and math.isfinite(stats.mean)
        assert abs(stats.mean - want) <= 1e-15 * abs(want)


# XXH3-128 (seed 0) of head + data, from the `xxhash` package: the empty input's is the value xxHash publishes
XXH3_VECTORS = [(b"", b"", "99aa06d3014798d86001c324468d497f"),
                (b"<f4(2, 3)", b"", "ab34e57374761ff7da26842514f32c39"),
                (b"abc", bytes(range(256)) * 5, "0b3077f77dbf4ac29b9f6cff0bb46677")]


@pytest.mark.parametrize("head, data, want", XXH3_VECTORS)
def test_the_compiled_digest_is_xxh3_128(head: bytes, data: bytes, want: str) -> None:
    """Tensor files keep their names across versions (a dump appended to later links to the files already there)."""
    assert kernel_digest(head, np.frombuffer(data, np.uint8)).hex() == want


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(0, 40), min_size=0, max_size=3),
       dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.bool_, "bfloat16"]),
       transpose=st.booleans())
def test_one_call_gives_the_statistics_and_name_two_calls_give(data: st.DataObject, shape: list[int], dtype: Any,
                                                                  transpose: bool) -> None:
    """The writer's one pass (`stats_and_name`) against `fast_stats` and `digest` of what is stored, on every layout a
    hook hands it (transposed views included) and with special values."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a = (rng.standard_normal(shape) * 3).astype(to_numpy(dtype) if dtype == "bfloat16" else dtype)
    if a.size and a.dtype.kind == "f":
        flat = a.reshape(-1)
        for i in data.draw(st.lists(st.integers(0, a.size - 1), max_size=4)):
            flat[i] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0]))
    if transpose:
        a = a.T
    stats, name = stats_and_name(a)
    assert name == f"{digest(to_storable(a))}.npy"
    want = fast_stats(a)
    assert stats.to_dict() == want.to_dict()


@pytest.mark.parametrize("n", [16383, 16384, 16385, 3 * 16384 + 5, 100_003])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_statistics_and_digest_taken_part_by_part_are_those_of_the_whole(n: int, dtype: type) -> None:
    """The writer's call reads a large array in parts of 16,384 elements (statistics, then the digest of each part
    while it is in cache): the same statistics, bit for bit, and the same digest as one pass of each, a NaN and an
    Inf in different parts included."""
    a = (np.random.default_rng(n).standard_normal(n) * 5).astype(dtype)
    a[[n // 3, n - 1]] = [np.nan, -np.inf]
    stats, name = stats_and_name(a)
    assert name == f"{digest(a)}.npy"
    assert stats.to_dict() == fast_stats(a).to_dict()


def test_the_summary_refuses_what_it_cannot_read_as_floats() -> None:
    with pytest.raises(ValueError, match="float32 or float64"):
        _kernel.summary(np.arange(4, dtype=np.int32), NEAR_ZERO, NEAR_ONE, TINY, 1, None)
    with pytest.raises(ValueError, match="float32 or float64"):
        _kernel.summary(np.arange(4, dtype=">f4"), NEAR_ZERO, NEAR_ONE, TINY, 1, b"")
    with pytest.raises(ValueError, match="C-contiguous"):
        summarize(np.ones((3, 4), np.float32).T, NEAR_ZERO, NEAR_ONE, TINY)
