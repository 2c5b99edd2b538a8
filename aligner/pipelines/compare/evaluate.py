"""Compute the metrics of one matched pair (run.py and parallel.py spread the pairs); bad files mark rows."""
from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Sequence

from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.core.words import words
from aligner.dumping.pair.matching import MatchedBy, Pair
from aligner.dumping.read.source import Item, TensorError, open_tensor
from aligner.metrics.measure import Metrics, StatsItem, compare_stats, compare_stats_many, compare_streams, same_rows
from aligner.pipelines.compare.says import Say

if TYPE_CHECKING:  # only --calibrate makes one (calibrate.py is loaded on that path only)
    from aligner.pipelines.compare.calibrate import Noise


class RowStatus(str, enum.Enum):
    """What comparing one pair gave."""

    OK = "ok"
    DIVERGED = "diverged"
    UNMATCHED = "unmatched"    # the record exists on one side only
    FOLDED = "folded"          # a call that only passes a tensor through, with no twin: not compared
    ERROR = "error"            # a tensor file could not be read
    SKIPPED = "skipped"        # both records read, nothing to compare them by (statistics on one side only, or a
                               # record the dump skipped: a dtype no reader supports)
    UNREAD = "unread"          # not evaluated (bisect reads only a few pairs)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One pair and what comparing it gave: metrics, or the reason it could not be compared (built final: a row is
    never changed once made)."""

    pair: Pair
    metrics: Metrics | None = None
    error: str | None = None
    read: bool = False  # whether this pair was evaluated (bisect reads only a few)
    noise: Noise | None = None  # the reference record's own error against float64 (compare --calibrate)
    # why the two records, both present, hold nothing to compare them by (status SKIPPED); None when they do, or
    # when the row has metrics or an error. Given by a saved result's rows; else found from the pair.
    skipped: str | None = None

    def __post_init__(self) -> None:
        if self.skipped is None and self.metrics is None and not self.error:
            object.__setattr__(self, "skipped", uncomparable(self.pair))

    @property
    def diverged(self) -> bool:
        return self.metrics is not None and self.metrics.diverged

    @property
    def status(self) -> RowStatus:
        if self.pair.a is None or self.pair.b is None:
            return RowStatus.FOLDED if self.pair.matched_by == MatchedBy.FOLDED else RowStatus.UNMATCHED
        if self.error:
            return RowStatus.ERROR
        if self.metrics is None and self.skipped:
            return RowStatus.SKIPPED
        if self.metrics is None:
            return RowStatus.UNREAD
        return RowStatus.DIVERGED if self.metrics.diverged else RowStatus.OK

    @property
    def above_noise(self) -> float | None:
        """How many times the reference's own float64 noise this row's error is (None: not calibrated)."""
        return self.noise.above(self.metrics) if self.noise is not None else None

    @property
    def name(self) -> str:
        """The reference side's module path: what per-name tolerances match."""
        return self.pair.ref.record.module


def _stats_only(item: Item) -> bool:
    return item.path is None and item.record.stats is not None and not item.error


def uncomparable(pair: Pair) -> str | None:
    """Why two records, both present, hold nothing to compare them by (a record the dump skipped, with the dump's
    reason; a boolean mask msprobe keeps no statistics of): listed like a record on one side only, not an unreadable
    file. None when they can be compared. The Words' text: a row is a flat record (compare/result.py's RowFields,
    which msgspec encodes, and msgspec takes no str subclass)."""
    a, b = pair.a, pair.b
    if a is None or b is None:
        return None
    skipped = tuple((side, item.record.skipped) for side, item in (("migrated", a), ("reference", b))
                    if item.record.skipped is not None)
    if skipped:
        return str(words(Say.NOT_STORED, sides=skipped))
    if not (_stats_only(a) or _stats_only(b)) or (a.record.stats and b.record.stats):
        return None
    return str(words(Say.STATS_ONE_SIDE))


def evaluate(pair: Pair, tolerance: ToleranceSpec) -> Row:
    """Compare one pair: streamed tensors, or recorded statistics when either side kept only statistics."""
    a, b = pair.a, pair.b
    if a is None or b is None:
        return Row(pair, read=True)
    why = uncomparable(pair)
    if why:
        return Row(pair, read=True, skipped=why)
    ref = b.record
    tol = tolerance.chosen(ref.module, (ref.step, ref.seq))  # None: the dtypes' defaults, once the files tell them
    if tol is None and tolerance.floor is not None and a.record.dtype and b.record.dtype:
        tol = tolerance.for_dtype(a.record.dtype, b.record.dtype)
    try:
        ra, rb = a.record, b.record
        if ra.stats is not None and rb.stats is not None and (_stats_only(a) or _stats_only(b)):
            metrics = compare_stats(ra.stats, rb.stats, tuple(ra.shape), tuple(rb.shape), ra.dtype, rb.dtype, tol)
        else:
            metrics = compare_streams(open_tensor(a), open_tensor(b), tol)
            if metrics.diverged and metrics.method == "elements" and metrics.dtype_match:  # order-only: apart
                metrics = dataclasses.replace(metrics, reordered=same_rows(open_tensor(a), open_tensor(b), tol))
    except (TensorError, OSError) as exc:
        return Row(pair, read=True, error=str(exc))
    return Row(pair, metrics, read=True)


def evaluate_stats(pairs: Sequence[Pair], tolerance: ToleranceSpec) -> list[Row | None]:
    """`evaluate` of each pair it compares by recorded statistics, from one vectorised `compare_stats_many` over them
    all (the same rows, ~1 us a pair where one `evaluate` takes ~4); None for the others: evaluate those."""
    out: list[Row | None] = [None] * len(pairs)
    at: list[int] = []
    items: list[StatsItem] = []
    floor = tolerance.floor
    # one tolerance for every name (no pattern, nothing calibrated that could apply): `chosen` is not asked per pair
    same = not tolerance.overrides and (tolerance.default is not None or not tolerance.calibrated)
    floors: dict[tuple[str, str], Tolerance] = {}  # (dtype_a, dtype_b) -> the floor's tolerance for them
    for k, pair in enumerate(pairs):  # what `evaluate` tests before it calls compare_stats (uncomparable included)
        a, b = pair.a, pair.b
        if a is None or b is None:
            continue
        ra, rb = a.record, b.record
        if ra.stats is None or rb.stats is None or ra.skipped is not None or rb.skipped is not None or not (
                a.path is None and not a.error or b.path is None and not b.error):
            continue
        try:
            tol = tolerance.default if same else tolerance.chosen(rb.module, (rb.step, rb.seq))
            if tol is None and floor is not None and ra.dtype and rb.dtype:
                dtypes = (ra.dtype, rb.dtype)
                tol = floors[dtypes] if dtypes in floors else floors.setdefault(dtypes, tolerance.for_dtype(*dtypes))
        except Exception:  # evaluate meets it again, in its turn, and raises it
            continue
        at.append(k)
        items.append((ra.stats, rb.stats, ra.shape, rb.shape, ra.dtype, rb.dtype, tol))
    for k, metrics in zip(at, compare_stats_many(items)):
        if metrics is not None:  # statistics both recorded (not all UNSET): `uncomparable` gives None
            out[k] = Row(pairs[k], metrics, None, True)
    return out
