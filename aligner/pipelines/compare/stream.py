"""`align compare` of manifests of any length: both dumps read as record streams (aligner.dumping.read.stream),
paired in step, each pair evaluated and handed to the caller as it comes, and only a bounded window of rows kept for
the verdict.

The two streams are paired a window at a time as `matching.match` pairs the whole lists (aligner.dumping.pair.window:
records on one side only, pass-through calls folded on one side, inputs in another order and records paired by content
resynchronise within the look-ahead). Where that cannot be done exactly (`Fallback`: a record pairing with one far
away, no resynchronising point within the look-ahead, renamed parameter gradients between PyTorch and MindSpore, a
pass-through call whose inputs were let go, a reference that ran BatchNorm in training mode, a manifest out of
execution order, another tool's dump, or --map, --calibrate, --bisect, a cluster engine) compare reads both dumps
whole (`run.compare`), the reason kept in `CompareResult.streamed`.

Memory, the bound: the stream readers' blocks, the records and rows in flight (`BLOCK` records a side, paired and
evaluated at a time), the inputs of the module calls still open, and the rows kept for the verdict: the last
`window` rows; from the first row of each phase that diverged (and the first that diverged with its numbers compared)
the `window` rows before it and the `window` after it; the first rows and the first few of each kind a report names
(errors, skipped, reordered). At the default window (50,000 rows, ~3 KB each) that is at most ~5 regions of 100,000
rows. What else grows is what grows with the model, not the record count: the distinct module paths and the call
records that carry a module's attributes. When no row left the window (a comparison of up to `window` rows) the
verdict is `judge` over every row: the whole-list verdict, exactly; past that it is `judge` over the rows kept, and
only the rows whose every predecessor back to their region's start was kept get a label.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from aligner.core.collect import gc_paused
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework, reference_index
from aligner.core.progress import SILENT, Progress
from aligner.core.tolerance import CALIBRATION_K, ToleranceSpec
from aligner.dumping.manifest import Kind
from aligner.dumping.pair.matching import MatchedBy, Pair, layer_type, same_layer
from aligner.dumping.pair.paired import SAME_MODEL_MIN_PAIRED, SAME_MODEL_MIN_RECORDS, different_models, training_floor
from aligner.dumping.pair.window import OutOfStepError, Resync
from aligner.dumping.read.foreign.layout import detect
from aligner.dumping.read.source import Source
from aligner.dumping.read.stream import Stream, UnorderedError, open_stream
from aligner.pipelines import compare as package  # with_settings: loaded for a finding in dumps with call records
from aligner.pipelines.compare import run
from aligner.pipelines.compare.engine import Engine, LocalEngine
from aligner.pipelines.compare.evaluate import Row, evaluate_stats
from aligner.pipelines.compare.result import CompareResult, Streamed, Tally
from aligner.pipelines.compare.verdict import NanFinding, Verdict, judge, phase_of

BLOCK = 4096     # records of each side read, paired and evaluated at a time (more while the sides resynchronise)
WINDOW = 50_000  # rows kept before and after the first notable row of each phase (~3 KB each: ~150 MB a region)
_KEPT_FIRST = 8  # rows kept of each kind a report names the first of, and first rows (render/compare.py shows 5)
_OP = Kind.OP  # bound once: an enum member looked up on its class costs ~0.1 us a row


class Fallback(enum.Enum):
    """Why a comparison read both dumps whole instead of streaming them."""

    OPTIONS = "options"              # --map, --calibrate, --bisect or a cluster engine
    FOREIGN = "foreign"              # another tool's dump (msprobe's mapping files rename its names)
    ORDER = "order"                  # a record pairs with one paired windows before, or a whole-list naming rule
    WINDOW = "window"                # the two sides do not resynchronise within the look-ahead (window.LOOKAHEAD)
    PARAM_NAMES = "param_names"      # parameter gradients renamed between PyTorch and MindSpore
    PASS_THROUGH = "pass_through"    # a pass-through call's inputs were let go before its outputs passed
    BUFFERS = "buffers"              # the reference's first buffer record (BatchNorm in training mode) came after
    #                                  rows were evaluated without its tolerance floor
    UNORDERED = "unordered"          # a manifest out of execution order (read whole, then sorted)


class NotInStepError(Exception):
    """The two streams do not pair record by record: compare reads them whole."""

    def __init__(self, why: Fallback) -> None:
        super().__init__(why.value)
        self.why = why


class RowSink(Protocol):
    """Where a streamed comparison hands each row as it is made (render/'s report spools): `add` each row, `settled`
    once a row can get no label any more (it left the verdict's window), `restart` before a fallback."""

    def add(self, index: int, row: Row) -> None: ...

    def settled(self, index: int) -> None: ...

    def restart(self) -> None: ...


def pairs_in_step(migrated: Stream, reference: Stream, crossing: bool) -> Iterator[tuple[list[Pair], bool]]:
    """Blocks of the rows `matching.match` makes of the two dumps, in the reference's execution order
    (aligner.dumping.pair.window), each with whether the reference read a buffer record so far; NotInStepError where
    they cannot be paired a window at a time (or either is out of execution order)."""
    mindspore = (0 if migrated.framework == Framework.MINDSPORE else 1) if crossing else None
    resync = Resync(migrated, reference, mindspore, BLOCK)
    try:
        for pairs in resync:
            yield pairs, resync.reference_buffers
    except OutOfStepError as exc:
        raise NotInStepError(Fallback(exc.why.value)) from None
    except UnorderedError:
        raise NotInStepError(Fallback.UNORDERED) from None


@dataclasses.dataclass
class Window:
    """The rows kept for the verdict, by row index (see the module docstring)."""

    size: int
    kept: dict[int, Row] = dataclasses.field(default_factory=dict)  # regions and first rows, kept to the end
    recent: collections.deque = dataclasses.field(default_factory=collections.deque)  # (index, row), the last `size`
    until: int = -1        # rows up to this index are kept (a region after a notable row)
    regions: list = dataclasses.field(default_factory=list)  # [first, last] row of each region kept whole
    phases: set = dataclasses.field(default_factory=set)  # (phase, _notable) of the rows that opened a region
    evicted: int = 0       # rows let go

    def add(self, i: int, row: Row) -> int | None:
        """Take row i; the index of the row that left the window for it (None when none did)."""
        seen = _notable(row)
        if seen and (phase_of(row), seen) not in self.phases and (seen == _COMPARED or i > self.until):
            self.phases.add((phase_of(row), seen))
            if i > self.until:  # a new region, from the rows before it
                self.regions.append([self.recent[0][0] if self.recent else i, i])
            self.kept.update(self.recent)
            self.recent.clear()
            self.until = self.regions[-1][1] = i + self.size
        if i <= self.until or i < _KEPT_FIRST:
            self.kept[i] = row
            return None
        self.recent.append((i, row))
        gone = self._let_go()
        return gone[0] if gone else None

    def add_rows(self, first: int, rows: list[Row]) -> list[int]:
        """`add` of each row, from row `first` on: the indices of the rows that left the window for them. A block
        with no notable row past every region and the first rows is put at once."""
        if first <= self.until or first < _KEPT_FIRST or any(map(_notable, rows)):
            return [gone for i, row in enumerate(rows, first) if (gone := self.add(i, row)) is not None]
        self.recent.extend(zip(range(first, first + len(rows)), rows))
        return self._let_go()

    def _let_go(self) -> list[int]:
        """The rows before the last `size` out of `recent`: the indices of those no region or report keeps."""
        out = []
        while len(self.recent) > self.size:
            gone = self.recent.popleft()[0]
            if gone not in self.kept:
                out.append(gone)
        self.evicted += len(out)
        return out

    def keep(self, i: int, row: Row) -> None:
        """Keep row i to the end (a row a report names)."""
        self.kept[i] = row

    def rows(self) -> dict[int, Row]:
        out = dict(self.kept)
        out.update(self.recent)
        return dict(sorted(out.items()))

    def whole(self, i: int) -> bool:
        """Whether row i sits where every row before it back to its region's start is kept, so that what `judge`
        says of it (its label) is what it says over every row: always when no row was let go."""
        if not self.evicted:
            return True
        if self.recent and self.regions and self.recent[0][0] == self.regions[-1][1] + 1:
            self.regions[-1][1] = self.recent[-1][0]  # the last rows follow the last region without a gap
        return any(first <= i <= last for first, last in self.regions)


_SEEN, _COMPARED = 1, 2  # a row that diverged or holds NaN/Inf; one that diverged with its numbers compared


def _notable(row: Row) -> int:
    """Whether a row may start a finding: _COMPARED when it diverged with numbers set side by side (shapes that
    part say less: the first finding is most often the first such row), _SEEN when it diverged otherwise or holds
    NaN/Inf, 0 when neither. The first row of each of the two kinds in each phase opens a region of kept rows."""
    m = row.metrics
    if m is None:
        return 0
    if m.diverged:
        return _COMPARED if m.method != "none" else _SEEN
    return _SEEN if m.nan_a or m.inf_a or m.nan_b or m.inf_b else 0


class Kept(Sequence[Row]):
    """The rows of a streamed comparison as `CompareResult.rows`: as long as the comparison, holding the kept rows
    (an index not kept raises KeyError)."""

    def __init__(self, rows: dict[int, Row], total: int) -> None:
        self._rows, self._total = rows, total

    def __len__(self) -> int:
        return self._total

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._rows[k] for k in range(*i.indices(self._total)) if k in self._rows]
        if i < 0:
            i += self._total
        return self._rows[i]

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows.values())

    def indices(self) -> list[int]:
        """The kept rows' indices, in order."""
        return list(self._rows)


class _Counter:
    """The counts and first rows `CompareResult` reports, taken as rows pass."""

    def __init__(self) -> None:
        self.matched = {"name": 0, "content": 0, "unmatched_a": 0, "unmatched_b": 0, "folded_a": 0, "folded_b": 0}
        self.compared = 0
        self.firsts: dict[str, list[int]] = {"errors": [], "skipped": [], "reordered": [], "unmatched": []}
        self.counts = {"errors": 0, "skipped": 0, "reordered": 0, "unmatched": 0}
        self.op_parents: set[str] = set()
        self.records = [0, 0]  # of each side (check_same_model)
        self.alike = 0
        self._types: dict[tuple[str, str], bool] = {}  # (type a, type b) -> whether they are one layer type

    def add_rows(self, first: int, rows: list[Row], window: Window) -> None:
        """Count rows `first`... and keep the first of each kind a report names in `window`."""
        matched, records, types_alike = self.matched, self.records, self._types
        compared = alike = paired = 0
        for i, row in enumerate(rows, first):
            pair = row.pair
            a, b, by = pair.a, pair.b, pair.matched_by
            if a is not None and b is not None:
                matched[by or MatchedBy.NAME] += 1
                paired += 1
                types = (a.record.type, b.record.type)  # same_layer's test of the types, once per pair of types
                same = types_alike.get(types)
                if same is None:
                    same = types_alike[types] = bool(types[0]) and layer_type(a.record) == layer_type(b.record)
                alike += same or same_layer(a, b)
            elif by == MatchedBy.FOLDED:
                matched["folded_b" if a is None else "folded_a"] += 1
            else:  # a record on one side only (CompareResult.matched, .unmatched)
                matched["unmatched_b" if a is None else "unmatched_a"] += 1
                records[a is None] += 1
                self._first("unmatched", i, row, window)
            if b is not None and b.record.kind == _OP:
                self.op_parents.add(b.record.parent or "")
            m = row.metrics
            if m is not None:
                compared += 1
            if row.error or row.skipped or m is not None and m.reordered:
                if row.error and a is not None and b is not None:
                    self._first("errors", i, row, window)
                if row.skipped:
                    self._first("skipped", i, row, window)
                if m is not None and m.reordered:
                    self._first("reordered", i, row, window)
        records[0] += paired
        records[1] += paired
        self.compared += compared
        self.alike += alike

    def _first(self, what: str, i: int, row: Row, window: Window) -> None:
        """Count row i as one of `what`, kept in `window` while it is among the first _KEPT_FIRST of them."""
        self.counts[what] += 1
        if len(self.firsts[what]) < _KEPT_FIRST:
            self.firsts[what].append(i)
            window.keep(i, row)

    def tally(self) -> Tally:
        return Tally(dict(self.matched), self.compared, {k: (self.counts[k], tuple(v)) for k, v in self.firsts.items()},
                     frozenset(self.op_parents))


def _check_same_model(counter: _Counter, migrated: Stream, reference: Stream) -> None:
    """`check_same_model` over the counts taken as the rows passed (its message, its numbers)."""
    smaller = min(counter.records)
    if smaller >= SAME_MODEL_MIN_RECORDS and counter.alike < SAME_MODEL_MIN_PAIRED * smaller:
        raise different_models(migrated.root, reference.root, counter.alike, smaller)


def _verdict(rows: dict[int, Row], window: Window) -> Verdict:
    """`judge` over the kept rows, its row numbers turned back into the comparison's; labels only where every row
    before back to the region's start was kept (`Window.whole`)."""
    index = list(rows)
    local = judge(list(rows.values()))

    def g(i: int | None) -> int | None:
        return None if i is None else index[i]

    findings = tuple(dataclasses.replace(f, first=index[f.first], previous=g(f.previous), origin=index[f.origin])
                     for f in local.findings)
    nan = local.nan_origin
    return dataclasses.replace(
        local, findings=findings,
        labels={index[i]: label for i, label in local.labels.items() if window.whole(index[i])},
        nan_origin=NanFinding(index[nan.row], nan.side, nan.count) if nan is not None else None,
        immaterial=tuple(index[i] for i in local.immaterial))


def _evaluated(pairs: list[Pair], tolerance: ToleranceSpec, workers: int | None, advance: Callable[[int], None],
               share: int) -> list[Row]:
    """`run.evaluate_pairs` of a block: its stats-only pairs in one vectorised pass (`evaluate_stats`), the others
    (tensor files, one side only, statistics not plain numbers) as before; `advance(share)` for each pair done."""
    rows = evaluate_stats(pairs, tolerance)
    rest = [p for p, r in zip(pairs, rows) if r is None]
    advance(share * (len(pairs) - len(rest)))
    done = iter(run.evaluate_pairs(rest, tolerance, workers, lambda: advance(share)) if rest else ())
    return [row if row is not None else next(done) for row in rows]


def _stream(migrated: Stream, reference: Stream, tolerance: ToleranceSpec, workers: int | None,
            sink: RowSink | None, window: int, progress: Progress) -> tuple[Window, _Counter, int, ToleranceSpec]:
    crossing = {migrated.framework, reference.framework} == {Framework.PYTORCH, Framework.MINDSPORE}
    kept, counter, i = Window(window), _Counter(), 0
    total = migrated.size + reference.size if migrated.size and reference.size else 0  # the manifests' bytes
    done = 0  # of them (without manifests, of the rows)
    with progress.task("comparing", total=total) as task:
        for pairs, buffers in pairs_in_step(migrated, reference, crossing):
            if buffers and tolerance.floor is None:  # the training-mode floor, known before any row: as read_pair
                if i:
                    raise NotInStepError(Fallback.BUFFERS)
                tolerance = training_floor(tolerance)
            read = migrated.consumed + reference.consumed if total else done + len(pairs)
            share, extra = divmod(read - done, len(pairs) or 1)  # the bytes read for this block, spread over it
            task.advance(extra)
            done = read
            rows = _evaluated(pairs, tolerance, workers, task.advance, share)
            if sink is not None:
                for k, row in enumerate(rows, i):
                    sink.add(k, row)
            counter.add_rows(i, rows, kept)
            gone = kept.add_rows(i, rows)
            if sink is not None:
                for k in gone:
                    sink.settled(k)
            i += len(rows)
    return kept, counter, i, tolerance


@gc_paused()
def compare_streamed(dumps_a: str, dumps_b: str, *, sink: RowSink | None = None, window: int = WINDOW,
                     ref: str | None = None, map_file: str | None = None, tolerance: ToleranceSpec | None = None,
                     bisect: bool = False, workers: int | None = None, strict: bool = False,
                     calibrate: str | None = None, calibrate_k: float = CALIBRATION_K, progress: Progress = SILENT,
                     engine: Engine | None = None, trust_pickle: bool = False) -> CompareResult:
    """`run.compare`, streamed where the dumps allow (see the module docstring): each row goes to `sink` as it is
    made, and the result holds the kept rows (`Kept`) and the counts (`Tally`); else `run.compare`'s result, every
    row, with the reason in `streamed`. `sink.restart()` is called before a fallback that follows rows handed out."""
    def whole(why: Fallback) -> CompareResult:
        if sink is not None:
            sink.restart()
        result = run.compare(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=tolerance, bisect=bisect,
                             workers=workers, strict=strict, calibrate=calibrate, calibrate_k=calibrate_k,
                             progress=progress, engine=engine, trust_pickle=trust_pickle)
        return dataclasses.replace(result, streamed=Streamed(None, why.value))

    if map_file is not None or calibrate is not None or bisect or (engine is not None and
                                                                  engine.name != LocalEngine.name):
        return whole(Fallback.OPTIONS)
    with contextlib.ExitStack() as opened:
        first = opened.enter_context(open_stream(dumps_a, trust_pickle=trust_pickle))  # a missing one named first
        if Path(dumps_a).resolve() == Path(dumps_b).resolve():  # before the second read, which would be the same
            raise AlignerError(f"both arguments name the same directory {dumps_a}")
        if detect(first.root) is not None or detect(Path(dumps_b)) is not None:
            return whole(Fallback.FOREIGN)
        second = opened.enter_context(open_stream(dumps_b, trust_pickle=trust_pickle))
        r = reference_index(ref, (first.framework, second.framework))
        migrated, reference = (second, first) if r == 0 else (first, second)
        tolerance = tolerance or ToleranceSpec()  # (a reference that ran BatchNorm in training mode: its floor)
        try:
            kept, counter, total, tolerance = _stream(migrated, reference, tolerance, workers, sink, window, progress)
        except NotInStepError as exc:
            return whole(exc.why)
    _check_same_model(counter, migrated, reference)
    rows = kept.rows()
    verdict = _verdict(rows, kept)
    if verdict.findings and migrated.calls and reference.calls:  # the blamed module's settings, from its calls
        sides = [Source(s.root, s.framework, s.mode, [x for row in rows.values()
                                                       if (x := getattr(row.pair, half)) is not None], [], s.calls)
                 for s, half in ((migrated, "a"), (reference, "b"))]
        verdict = package.with_settings(verdict, Kept(rows, total), *sides)
    return CompareResult(run.label(migrated.root, migrated.framework), run.label(reference.root, reference.framework),
                         Kept(rows, total), verdict,
                         tuple(migrated.problems + reference.problems), tolerance, strict,
                         streamed=Streamed(kept.evicted, None), tally=counter.tally())
