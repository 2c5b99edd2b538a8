"""The error chart of a long `align compare --html`, over every row in bounded memory: a row sink (compare/stream.py's
`RowSink`) that folds each row into one of at most `BUCKETS` buckets of consecutive rows as it is made, so the page
can draw a million rows as ~2,000 points without the rows.

A bucket keeps, per trace (forward, backward, matched near-zero references), the row with the largest relative L2
error (`error_level`): its index and the few fields its hover shows, so a single divergent row among a million is a
point at its own index and height; the worst row outside tolerance and how many there were; the smallest cosine and
where; the tolerance band's lowest rtol and highest top; and the (step, phase) runs its points belong to, so the
chart's lines stop where the page's do. The width of a bucket doubles (neighbours merged in pairs) whenever the rows
would need more than `BUCKETS`, so there are between BUCKETS/2 and BUCKETS of them whatever the row count. The
tolerances the verdict used are counted here too (`ToleranceGroups`): the headline names them for every row.

Memory: BUCKETS buckets of a few hundred bytes each (~2 MB), whatever the row count. Time: ~1-2 us a row.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Sequence

from aligner.core.tolerance import Tolerance, ToleranceSpec
from aligner.pipelines.compare.evaluate import Row, RowStatus
from aligner.pipelines.compare.stream import RowSink
from aligner.pipelines.compare.verdict import FORWARD, error_level

BUCKETS = 2000  # at most this many points per trace; at least half as many once there are more rows
FORWARD_PEAK, BACKWARD_PEAK, NEAR_ZERO_PEAK = 0, 1, 2  # a bucket's peaks: forward, backward, matched near-zero
_OK, _DIVERGED = RowStatus.OK, RowStatus.DIVERGED  # bound once: an enum class attribute costs a lookup a row


def near_zero(row: Row) -> bool:
    """Whether the row's reference is so small that its relative error means nothing: ||b|| <= atol * sqrt(n)."""
    m = row.metrics
    if m is None or m.method == "none" or m.norm_b is None:
        return False
    return m.norm_b <= m.atol * math.sqrt(max(m.numel, 0))


class Peak(NamedTuple):
    """The row a point stands for: its error level and what its hover shows."""

    level: float
    row: int
    status: RowStatus
    module: str
    type: str
    kind: str
    io: str
    nth: int           # the record's index among its call's inputs or outputs
    max_abs_err: float | None
    cosine: float | None
    rtol: float
    atol: float

    @classmethod
    def of(cls, level: float, i: int, status: RowStatus, row: Row) -> Peak:
        rec, m = row.pair.ref.record, row.metrics
        assert m is not None
        return cls(level, i, status, rec.module, rec.type, rec.kind, rec.io, rec.index, m.max_abs_err, m.cosine,
                   m.rtol, m.atol)


@dataclasses.dataclass
class Bucket:
    """What the chart shows of a run of consecutive rows, first to last (see the module docstring)."""

    first: int
    last: int
    peaks: list = dataclasses.field(default_factory=lambda: [None, None, None])  # Peak | None, at *_PEAK
    runs: list = dataclasses.field(default_factory=lambda: [None, None])  # [first, last] run of each phase's rows
    worst: Peak | None = None     # the row outside tolerance with the largest error
    diverged: int = 0             # rows outside tolerance
    compared: int = 0             # rows with metrics
    cosine: tuple[float, int] | None = None  # the smallest cosine and its row
    lo: float = math.inf          # the band: lowest rtol of the rows drawn
    hi: float = -math.inf         # and its highest top, rtol + atol*sqrt(n)/||b||

    def merge(self, other: Bucket) -> None:
        """Take in the bucket of the rows right after this one's."""
        self.last = other.last
        for k, peak in enumerate(other.peaks):
            mine = self.peaks[k]
            if peak is not None and (mine is None or peak.level > mine.level):
                self.peaks[k] = peak
        for k, run in enumerate(other.runs):
            if run is not None:
                self.runs[k] = run if self.runs[k] is None else [self.runs[k][0], run[1]]
        if other.worst is not None and (self.worst is None or other.worst.level > self.worst.level):
            self.worst = other.worst
        self.diverged += other.diverged
        self.compared += other.compared
        if other.cosine is not None and (self.cosine is None or other.cosine[0] < self.cosine[0]):
            self.cosine = other.cosine
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)


class ToleranceGroups:
    """The tolerances the rows were judged by, counted row by row (`add`): `groups()` gives each (rtol, atol) with its
    count, dtypes and whether it is every row's dtype default; `calibrated`, the rows whose tolerance --calibrate
    measured, and their range (what `render.html.tolerance_words` says)."""

    def __init__(self, spec: ToleranceSpec) -> None:
        self.spec = spec
        self._plain = spec.is_default  # no --rtol/--atol: no row's tolerance is the user's
        # (rtol, atol, dtype a, dtype b, whether the user's tolerance applies) -> rows, in the order first seen
        self._counts: dict[tuple[float, float, str, str, bool], int] = {}
        self.calibrated = 0
        self.rtols, self.atols = (math.inf, -math.inf), (math.inf, -math.inf)

    def add(self, row: Row) -> None:
        m = row.metrics
        if m is None:
            return
        if row.noise is not None and self.spec.explicit(row.name) is None:
            default = self.spec.for_dtype(m.dtype_a, m.dtype_b)
            if (m.rtol, m.atol) != (default.rtol, default.atol):
                self.calibrated += 1
                self.rtols = (min(self.rtols[0], m.rtol), max(self.rtols[1], m.rtol))
                self.atols = (min(self.atols[0], m.atol), max(self.atols[1], m.atol))
                return
        key = (m.rtol, m.atol, m.dtype_a, m.dtype_b, not self._plain and self.spec.explicit(row.name) is not None)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def groups(self) -> dict[tuple[float, float], tuple[int, set[str], bool]]:
        """(rtol, atol) -> (rows, their dtypes, whether each is its dtypes' default, the user's tolerance applying to
        none), in the order first seen."""
        out: dict[tuple[float, float], tuple[int, set[str], bool]] = {}
        for (rtol, atol, dtype_a, dtype_b, explicit), count in self._counts.items():
            n, dtypes, default = out.get((rtol, atol), (0, set(), True))
            dtypes.add(dtype_b if dtype_a == dtype_b else f"{dtype_a}/{dtype_b}")
            tol = Tolerance.for_dtype(dtype_a, dtype_b)
            out[(rtol, atol)] = (n + count, dtypes, default and (tol.rtol, tol.atol) == (rtol, atol) and not explicit)
        return out


class ErrorProfile:
    """The chart's buckets and the tolerance groups of a comparison, taken row by row (a `RowSink`; `of` builds one
    from rows at hand)."""

    def __init__(self, spec: ToleranceSpec, buckets: int = BUCKETS) -> None:
        self.spec, self.most = spec, buckets
        self.restart()

    def restart(self) -> None:
        """Forget every row (a streamed comparison that falls back to reading both dumps whole starts again)."""
        self.buckets: list[Bucket] = []
        self.width = 1       # rows per bucket
        self.rows = 0        # rows taken
        self.low = math.inf  # the smallest positive error level or rtol drawn (the chart's floor)
        self.high = 0.0      # the largest error level drawn
        self.hidden = 0      # matched rows whose reference is near zero (their trace is hidden)
        self.backward = False  # whether a backward row was compared
        self.tolerances = ToleranceGroups(self.spec)
        self._run = 0        # the (step, phase) run of the last row drawn, its step and phase
        self._step: int | None = None
        self._forward: bool | None = None
        self._end = 0        # the first row past the last bucket

    @classmethod
    def of(cls, spec: ToleranceSpec, rows: Sequence[tuple[int, Row]], buckets: int = BUCKETS) -> ErrorProfile:
        """The profile of (index, row) pairs at hand, in order."""
        profile = cls(spec, buckets)
        for i, row in rows:
            profile.add(i, row)
        return profile

    def settled(self, index: int) -> None:
        """Nothing to do: a bucket keeps no row."""

    def add(self, index: int, row: Row) -> None:
        self.rows += 1
        if index >= self._end:
            self._open(index)
        b = self.buckets[-1]
        b.last = index
        m = row.metrics
        if m is None:
            return
        self.tolerances.add(row)
        b.compared += 1
        level = error_level(row)
        status = row.status
        rec = row.pair.ref.record
        forward = rec.kind in FORWARD
        if not forward:
            self.backward = True
        cosine = m.cosine
        if cosine is not None and (b.cosine is None or cosine < b.cosine[0]):
            b.cosine = (cosine, index)
        if status is _DIVERGED:
            b.diverged += 1
            if b.worst is None or level > b.worst.level:
                b.worst = Peak.of(level, index, status, row)
        elif status is _OK and near_zero(row):
            self.hidden += 1
            peak = b.peaks[NEAR_ZERO_PEAK]
            if peak is None or level > peak.level:
                b.peaks[NEAR_ZERO_PEAK] = Peak.of(level, index, status, row)
            return
        k = FORWARD_PEAK if forward else BACKWARD_PEAK
        peak = b.peaks[k]
        if peak is None or level > peak.level:
            b.peaks[k] = Peak.of(level, index, status, row)
        if rec.step != self._step or forward is not self._forward:  # another (step, phase) run
            self._run += 1
            self._step, self._forward = rec.step, forward
        run = b.runs[k]
        if run is None:
            b.runs[k] = [self._run, self._run]
        else:
            run[1] = self._run
        rtol = m.rtol
        if 0 < level < self.low:
            self.low = level
        if 0 < rtol < self.low:
            self.low = rtol
        if level > self.high:
            self.high = level
        if rtol < b.lo:
            b.lo = rtol
        hi = rtol + m.atol * math.sqrt(m.numel) / m.norm_b if m.norm_b else math.inf
        if hi > b.hi:
            b.hi = hi

    def _open(self, index: int) -> None:
        """A bucket for row `index`, the buckets merged in pairs until it fits among `most`."""
        while index // self.width >= self.most:
            self.width *= 2
            merged: list[Bucket] = []
            for b in self.buckets:
                if merged and merged[-1].first // self.width == b.first // self.width:
                    merged[-1].merge(b)
                else:
                    merged.append(b)
            self.buckets = merged
        start = index // self.width * self.width
        if self.buckets and self.buckets[-1].first >= start:  # the last bucket widened to take this row
            self._end = start + self.width
            return
        self.buckets.append(Bucket(index, index))
        self._end = start + self.width


class Tee:
    """Rows handed to several row sinks (the reports' spools and the chart's profile), in the order given."""

    def __init__(self, *sinks: RowSink) -> None:
        self.sinks = sinks

    def add(self, index: int, row: Row) -> None:
        for sink in self.sinks:
            sink.add(index, row)

    def settled(self, index: int) -> None:
        for sink in self.sinks:
            sink.settled(index)

    def restart(self) -> None:
        for sink in self.sinks:
            sink.restart()
