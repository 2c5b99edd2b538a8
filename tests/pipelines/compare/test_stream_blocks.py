"""The streamed compare's block steps (aligner/pipelines/compare/stream.py: `Window.add_rows`, `_Counter.add_rows`)
against the row-at-a-time code: the same rows kept, let go and counted, on random rows (matched, diverged, NaN,
one-sided, errors), random blocks, random window sizes and rows kept by a report in between."""
from __future__ import annotations

import collections
import dataclasses
import random

import pytest
from msgspec.structs import replace

from aligner.dumping.manifest import Kind, Record
from aligner.dumping.pair.matching import MatchedBy, Pair
from aligner.dumping.read.source import Item
from aligner.metrics.measure import compare_stats
from aligner.metrics.stats import Stats
from aligner.pipelines.compare.evaluate import Row
from aligner.pipelines.compare.stream import Window, _Counter

_OK = Stats(min=-1.0, max=1.0, mean=0.1, l2=3.0, nan=0, inf=0)
_SIDES = {"ok": _OK, "diverged": replace(_OK, l2=4.0), "nan": replace(_OK, nan=1)}


def _row(rng: random.Random, seq: int) -> Row:
    kind = rng.choice([Kind.FORWARD] * 4 + [Kind.BACKWARD, Kind.OP])
    record = Record(seq=seq, module=f"m.{seq % 7}", type=rng.choice(["Linear", "Dense", "Conv2d"]), kind=kind,
                    dtype="float32", shape=[4, 8], stats=_OK, parent="m")
    a, b = Item(record), Item(replace(record, stats=_SIDES[rng.choice(["ok"] * 8 + ["diverged", "nan"])]))
    shape = rng.random()
    if shape < 0.08:
        return Row(Pair(a, None, None) if rng.random() < 0.5 else Pair(None, b, None))  # a record on one side
    if shape < 0.12:
        return Row(Pair(None, b, MatchedBy.FOLDED))
    if shape < 0.16:
        return Row(Pair(a, b, MatchedBy.NAME), error="cannot read", read=True)
    if shape < 0.2:
        return Row(Pair(a, b, MatchedBy.NAME), skipped="unsupported dtype complex64")
    metrics = compare_stats(a.record.stats, b.record.stats, [4, 8], [4, 8], "float32", "float32", None)
    if rng.random() < 0.03:
        metrics = dataclasses.replace(metrics, reordered=True)
    return Row(Pair(a, b, rng.choice([MatchedBy.NAME, MatchedBy.CONTENT])), metrics, read=True)


def _plain(seq: int) -> Row:
    """A row that matched: what most blocks of a long comparison hold only."""
    record = Record(seq=seq, module="m.0", type="Linear", kind=Kind.FORWARD, dtype="float32", shape=[4, 8], stats=_OK)
    metrics = compare_stats(_OK, _OK, [4, 8], [4, 8], "float32", "float32", None)
    return Row(Pair(Item(record), Item(record), MatchedBy.NAME), metrics, read=True)


def _state(window: Window) -> tuple:
    return window.kept, list(window.recent), window.until, window.regions, window.phases, window.evicted


@pytest.mark.parametrize("seed", range(40))
def test_blocks_keep_and_count_what_rows_one_at_a_time_do(seed: int) -> None:
    rng = random.Random(seed)
    quiet = rng.random() < 0.5  # mostly plain rows: long runs of blocks with no notable row (the fast path)
    rows = [_row(rng, seq) if not quiet or rng.random() < 0.02 else _plain(seq) for seq in range(rng.randrange(400))]
    size = rng.randrange(1, 30)
    blocks, one, counter_blocks, counter_one = Window(size), Window(size), _Counter(), _Counter()
    gone_blocks: list[int] = []
    gone_one: list[int] = []
    i = 0
    while i < len(rows):
        n = rng.randrange(1, 60)
        block = rows[i:i + n]
        counter_blocks.add_rows(i, block, blocks)
        gone_blocks += blocks.add_rows(i, block)
        for k, row in enumerate(block, i):  # the row-at-a-time order: counted, then put
            counter_one.add_rows(k, [row], one)
            gone = one.add(k, row)
            if gone is not None:
                gone_one.append(gone)
        i += len(block)
        assert _state(blocks) == _state(one)
    assert gone_blocks == gone_one
    # every row is held to the end (a region, a report's first rows), among the last `size`, or let go: one of them
    recent = [i for i, _ in blocks.recent]
    assert len(recent) <= size and blocks.evicted == len(gone_blocks) == len(set(gone_blocks))
    assert set(gone_blocks).isdisjoint(blocks.kept) and set(gone_blocks).isdisjoint(recent)
    assert set(gone_blocks) | set(blocks.kept) | set(recent) == set(range(len(rows)))
    assert vars(counter_blocks) == vars(counter_one)
    counted = [r.pair for r in rows if r.pair.matched_by != MatchedBy.FOLDED]  # (a folded call is no record's twin)
    assert counter_blocks.records == [sum(p.a is not None for p in counted), sum(p.b is not None for p in counted)]
    assert counter_blocks.compared == sum(r.metrics is not None for r in rows)
    kinds = {"unmatched": [i for i, r in enumerate(rows) if (r.pair.a is None or r.pair.b is None)
                           and r.pair.matched_by != MatchedBy.FOLDED],
             "errors": [i for i, r in enumerate(rows) if r.error and r.pair.a is not None and r.pair.b is not None],
             "skipped": [i for i, r in enumerate(rows) if r.skipped],
             "reordered": [i for i, r in enumerate(rows) if r.metrics is not None and r.metrics.reordered]}
    assert counter_blocks.counts == {what: len(at) for what, at in kinds.items()}
    assert counter_blocks.firsts == {what: at[:8] for what, at in kinds.items()}
    by = collections.Counter(r.pair.matched_by for r in rows)
    assert counter_blocks.matched["content"] == by[MatchedBy.CONTENT]
    assert counter_blocks.matched["folded_b"] == by[MatchedBy.FOLDED]
    assert counter_blocks.matched["unmatched_a"] + counter_blocks.matched["unmatched_b"] == len(kinds["unmatched"])
