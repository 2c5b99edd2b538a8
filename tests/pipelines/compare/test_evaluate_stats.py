"""`evaluate_stats`, a block's stats-only pairs evaluated in one vectorised pass (what a streamed compare runs): each
row it gives is the row `evaluate` gives for that pair (metrics bit for bit, the same error/skipped/read fields), and
it leaves every other pair to `evaluate` (None): one side only, a record the dump skipped, statistics on one side
only or not recorded, tensor files on both sides, an unreadable file, statistics that are not plain numbers."""
from __future__ import annotations

import dataclasses
import math
import struct
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.dumping.manifest import Kind, Record
from aligner.dumping.pair.matching import MatchedBy, Pair
from aligner.dumping.read.source import Item
from aligner.metrics.measure import Metrics
from aligner.metrics.stats import Stats
from aligner.pipelines.compare.evaluate import Row, evaluate, evaluate_stats

FLOAT = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0, math.nan, math.inf]), st.floats(-5, 5))
NUMBER = st.one_of(FLOAT, st.none())
_FOUR = ("min", "max", "mean", "l2")
PLAIN = st.builds(lambda v, nan: Stats(**dict(zip(_FOUR, v)), nan=nan, inf=0), st.tuples(*[FLOAT] * 4),
                  st.sampled_from([0, 1]))
ODD = st.builds(lambda v, nan: Stats(**dict(zip(_FOUR, v)), nan=nan, inf=0), st.tuples(*[NUMBER] * 4),
                st.sampled_from([0, 1, UNSET, None]))
# mostly what a dump's records hold (the vectorised pass computes them), and every kind it leaves to evaluate
STATS = st.one_of(PLAIN, PLAIN, PLAIN, st.none(), st.just(Stats()), ODD)


@st.composite
def items(draw: st.DrawFn, seq: int) -> Item | None:
    if draw(st.integers(0, 9)) == 0:
        return None  # a record on one side only
    stats = draw(STATS)
    skipped = draw(st.sampled_from([None, None, None, "unsupported dtype complex64"]))
    stored = draw(st.sampled_from([None, None, None, "t.npy"]))  # a tensor file (none there: evaluate's rows say so)
    shape = draw(st.sampled_from([[4, 8]] * 8 + [[32], [4, 8, 1]]))
    record = Record(seq=seq, module=f"m.{seq}", kind=Kind.FORWARD, dtype=draw(st.sampled_from(["float32", "float16"])),
                    shape=shape, stats=stats, file=stored, skipped=skipped)
    # a file that cannot be read, or one refused before any read (outside the dump: no path, an error)
    path, error = draw(st.sampled_from([(Path("/nonexistent/t.npy"), None), (Path("/nonexistent/t.npy"), "cannot read"),
                                        (None, "t.npy: outside the dump")])) if stored else (None, None)
    return Item(record, path, error)


def _bits(value: object) -> object:
    if isinstance(value, float):
        return float, "nan" if math.isnan(value) else struct.pack("<d", value)
    return type(value), value


def _same(got: Row, want: Row) -> bool:
    if (got.pair, got.error, got.read, got.noise, got.skipped) != (want.pair, want.error, want.read, want.noise,
                                                                   want.skipped):
        return False
    if got.metrics is None or want.metrics is None:
        return got.metrics is want.metrics
    return all(_bits(getattr(got.metrics, f.name)) == _bits(getattr(want.metrics, f.name))
               for f in dataclasses.fields(Metrics))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(items(1), items(2)), min_size=1, max_size=30),
       st.sampled_from([ToleranceSpec(), ToleranceSpec(default=Tolerance(1e-3, 1e-3)),
                        ToleranceSpec(floor=Tolerance(1e-2, 1e-2)),
                        # a pattern for one name; a calibrated tolerance for one record (step 0, seq 2), alone and
                        # under a default (which wins): evaluate_stats asks per pair only where those may apply
                        ToleranceSpec(overrides=(("m.2", Tolerance(0.5, 0.5)),), floor=Tolerance(1e-2, 1e-2)),
                        ToleranceSpec(calibrated={(0, 2): Tolerance(0.5, 0.5)}),
                        ToleranceSpec(default=Tolerance(1e-3, 1e-3), overrides=(("m.2", Tolerance(0.5, 0.5)),)),
                        ToleranceSpec(default=Tolerance(1e-3, 1e-3), calibrated={(0, 2): Tolerance(0.5, 0.5)})]))
def test_each_row_is_evaluates_row_or_left_to_it(sides: list[tuple], tolerance: ToleranceSpec) -> None:
    pairs = [Pair(a, b, MatchedBy.NAME if a is not None and b is not None else None) for a, b in sides]
    for pair, row in zip(pairs, evaluate_stats(pairs, tolerance)):
        a, b = pair.a, pair.b
        if row is None:
            continue
        assert a is not None and b is not None and a.record.stats and b.record.stats
        assert a.record.skipped is None and b.record.skipped is None
        assert _same(row, evaluate(pair, tolerance)), (pair, row)


def test_every_kind_of_side_against_every_other(tmp_path: Path) -> None:
    """Each kind of record against each: the pairs computed here are exactly those with plain statistics on both
    sides, neither skipped, at least one side with statistics only (no file, no error); each row is evaluate's."""
    import numpy as np

    file = tmp_path / "t.npy"
    np.save(file, np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8))
    plain = Stats(min=-1.0, max=1.0, mean=0.0, l2=3.3, nan=0, inf=0)

    def side(kind: str) -> Item | None:
        stats = {"no stats": None, "nothing recorded": Stats(), "a None mean": Stats(min=-1.0, max=1.0, mean=None,
                 l2=3.3, nan=0, inf=0)}.get(kind, plain)
        stored = kind.startswith("file")
        record = Record(seq=1, module="m", kind=Kind.FORWARD, dtype="float32", shape=[4, 8], stats=stats,
                        file="t.npy" if stored else None, skipped="unsupported dtype" if kind == "skipped" else None)
        if kind == "missing":
            return None
        if kind == "file refused":
            return Item(record, None, "t.npy: outside the dump")
        return Item(record, file if stored else None)

    kinds = ["stats only", "file with stats", "file refused", "skipped", "no stats", "nothing recorded",
             "a None mean", "missing"]
    computed = set()
    for ka in kinds:
        for kb in kinds:
            pair = Pair(side(ka), side(kb), MatchedBy.NAME)
            (row,) = evaluate_stats([pair], ToleranceSpec())
            if row is not None:
                computed.add((ka, kb))
                assert _same(row, evaluate(pair, ToleranceSpec())), (ka, kb)
    # (a refused file's record keeps its statistics: evaluate compares them with the other side's)
    assert computed == {("stats only", "stats only"), ("stats only", "file with stats"), ("stats only", "file refused"),
                        ("file with stats", "stats only"), ("file refused", "stats only")}


def test_plain_statistics_are_all_computed_here() -> None:
    """A dump's ordinary stats-only records (every statistic a number) never go the slow way."""
    stats = Stats(min=-1.0, max=1.0, mean=0.1, l2=3.0, nan=0, inf=0)
    other = Stats(min=-1.0, max=1.5, mean=0.1, l2=3.0, nan=0, inf=0)
    pairs = [Pair(Item(Record(seq=k, module=f"m.{k}", kind=Kind.FORWARD, dtype="float32", shape=[4], stats=stats)),
                  Item(Record(seq=k, module=f"m.{k}", kind=Kind.FORWARD, dtype="float32", shape=[4],
                              stats=other if k % 2 else stats)), MatchedBy.NAME) for k in range(10)]
    rows = evaluate_stats(pairs, ToleranceSpec())
    assert all(row is not None for row in rows)
    assert [row.diverged for row in rows if row is not None] == [k % 2 == 1 for k in range(10)]
    assert all(_same(row, evaluate(pair, ToleranceSpec())) for pair, row in zip(pairs, rows) if row is not None)
