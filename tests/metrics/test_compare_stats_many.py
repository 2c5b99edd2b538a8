"""`compare_stats_many`, the vectorised `compare_stats` a streamed compare evaluates stats-only pairs with: for every
item it computes, the same Metrics bit for bit (every field, its value and its Python type: the reports write them);
None, never a different answer, for an item it leaves to `compare_stats` (None or unrecorded statistics, other shapes,
unknown dtypes, counts past float64's exact range)."""
from __future__ import annotations

import dataclasses
import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from aligner.core.tolerance import Tolerance
from aligner.metrics.measure import Metrics, compare_stats, compare_stats_many
from aligner.metrics.stats import Stats, tensor_stats

# floats where the rules' edges are: zeros of both signs, NaN, both infinities, the largest and smallest doubles,
# values a float32 rounding apart, and plain random ones
_EDGE = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.7976931348623157e308, -1.7976931348623157e308, 5e-324, 1.0,
         1.0000001, -1.0, 1e-5, 2.0, 3.0]
FLOATS = st.one_of(st.sampled_from(_EDGE), st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(-10.0, 10.0))
COUNTS = st.one_of(st.integers(0, 3), st.integers(0, 1 << 60), st.sampled_from([-1, 1 << 51, (1 << 51) - 1]))
ODD = st.sampled_from([None, UNSET, True, 3])  # what the vectorised pass leaves to compare_stats (an int as a float)


def _stats(plain: bool) -> st.SearchStrategy[Stats]:
    number = FLOATS if plain else st.one_of(FLOATS, ODD)
    count = COUNTS if plain else st.one_of(COUNTS, ODD)
    return st.builds(lambda lo, hi, mean, l2, nan, inf: Stats(min=lo, max=hi, mean=mean, l2=l2, nan=nan, inf=inf),
                     number, number, number, number, count, count)


SHAPES = st.sampled_from([(4, 1024), (7,), (), (0,), (3, 0), (2, 8, 8, 16), (1 << 26, 1 << 26)])
DTYPES = st.sampled_from(["float32", "Float32", "torch.float16", "bfloat16", "float64", "int32", "int64", "bool"])
TOLERANCES = st.one_of(st.none(), st.builds(Tolerance, st.floats(0, 1), st.floats(0, 1)),
                       st.just(Tolerance(0, 0)))


@st.composite
def items(draw: st.DrawFn, plain: bool) -> tuple:
    shape_b = draw(SHAPES)
    shape_a = shape_b if plain else draw(st.one_of(st.just(shape_b), SHAPES, st.just([*shape_b])))
    dtype_a, dtype_b = draw(DTYPES), draw(DTYPES)
    if not plain and draw(st.booleans()):
        dtype_a = "complex257"  # no such dtype: compare_stats raises, the batch leaves it
    return (draw(_stats(plain)), draw(_stats(plain)), shape_a, shape_b, dtype_a, dtype_b, draw(TOLERANCES))


def _bits(value: object) -> object:
    """A field as the reports see it: its type and, for a float, its exact bits (NaN by its NaN-ness: every NaN is
    written as "nan")."""
    if isinstance(value, float):
        return float, "nan" if math.isnan(value) else struct.pack("<d", value)
    return type(value), value


def _same(got: Metrics, want: Metrics) -> bool:
    return all(_bits(getattr(got, f.name)) == _bits(getattr(want, f.name)) for f in dataclasses.fields(Metrics))


def _scalar(item: tuple) -> Metrics | None:
    try:
        return compare_stats(*item)
    except Exception:  # the batch must leave such an item alone, whatever compare_stats raised
        return None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(items(plain=True), items(plain=False)), min_size=1, max_size=40))
def test_each_item_is_compare_stats_bit_for_bit_or_left_to_it(batch: list[tuple]) -> None:
    for item, got in zip(batch, compare_stats_many(batch)):
        want = _scalar(item)
        if got is not None:
            assert want is not None and _same(got, want), (item, got, want)


@settings(max_examples=200, deadline=None)
@given(st.lists(items(plain=True), min_size=1, max_size=40))
def test_plain_statistics_of_one_shape_are_all_computed(batch: list[tuple]) -> None:
    """The vectorised pass is the one that runs for a dump's ordinary records (not left to compare_stats)."""
    got = compare_stats_many(batch)
    for item, metrics in zip(batch, got):
        tol = item[6]
        exact = all(abs(c) < 1 << 51 for s in item[:2] for c in (s.nan, s.inf)) and math.prod(item[3]) < 1 << 51 \
            and (tol is None or isinstance(tol.rtol, float) and isinstance(tol.atol, float))  # not Tolerance(0, 0)
        assert (metrics is not None) == exact, item
        if metrics is not None:
            assert _same(metrics, compare_stats(*item))


def test_one_row_and_real_tensors() -> None:
    """A batch of one, and the statistics of real tensors: a clean pair, a diverged one, NaN on one side, zero-size
    (no finite element: min None, left to compare_stats), integers of two widths."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    cases = [(x, x), (x * 1.01, x), (np.where(x > 1, np.nan, x), x), (x[:0], x[:0]),
             (np.arange(12, dtype=np.int64).reshape(3, 4), np.arange(12, dtype=np.int32).reshape(3, 4))]
    batch = [(tensor_stats(a), tensor_stats(b), a.shape, b.shape, str(a.dtype), str(b.dtype), None) for a, b in cases]
    for item in batch:
        alone = compare_stats_many([item])[0]
        assert alone is None or _same(alone, compare_stats(*item))
    got = compare_stats_many(batch)
    assert [m is None for m in got] == [False, False, False, True, False]
    # 1.01x: max, min, mean and L2 past tolerance; NaN in place of x > 1: the NaN count, max, mean and L2 (not min)
    assert [m.mismatched for m in got if m is not None] == [0, 4, 4, 0]
    for item, metrics in zip(batch, got):
        if metrics is not None:
            assert _same(metrics, compare_stats(*item)) and metrics.to_dict() == compare_stats(*item).to_dict()


def test_equal_tolerances_of_other_types_are_resolved_apart() -> None:
    """Tolerance(0, 0) equals Tolerance(0.0, 0.0) (and hashes alike), but only the second's rtol and atol are floats:
    whichever comes first, each item gets what compare_stats gives it (found by hypothesis: a cache keyed by equality
    handed the second item the first one's answer)."""
    stats = Stats(min=0.0, max=0.0, mean=0.0, l2=0.0, nan=0, inf=0)
    ints, floats = Tolerance(0, 0), Tolerance(0.0, 0.0)
    for tols in ((ints, floats), (floats, ints)):
        batch = [(stats, stats, (4, 8), (4, 8), "float32", "float32", tol) for tol in tols]
        got = compare_stats_many(batch)
        for item, metrics in zip(batch, got):
            assert (metrics is None) == (item[6] is ints)
            if metrics is not None:
                assert _same(metrics, compare_stats(*item))
