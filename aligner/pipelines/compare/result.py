"""What `compare` returns to the CLI and to library users: rows, verdicts, counts and the exit code, no formatting."""
from __future__ import annotations

import dataclasses
import functools
import operator
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import msgspec

from aligner.core.errors import ExitCode
from aligner.core.result import SCHEMAS, PassedByExitCode
from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.manifest import Kind
from aligner.dumping.pair.matching import MatchedBy
from aligner.pipelines import compare as package  # compare/saved.py, loaded only to read a saved result
from aligner.pipelines.compare.evaluate import Row
from aligner.pipelines.compare.verdict import Culprit, Divergence, Verdict

if TYPE_CHECKING:  # only --calibrate makes one (calibrate.py is loaded on that path only)
    from aligner.mapping import MsprobeMap
    from aligner.pipelines.compare.calibrate import Calibration

_ROW_METRICS = ("method", "numel", "mismatched", "mismatch_fraction", "max_abs_err", "max_abs_index", "max_rel_err",
                "mean_abs_err", "rmse", "cosine", "sqnr_db", "rel_l2_err", "nan_a", "nan_b", "inf_a", "inf_b",
                "rtol", "atol")
_ROW_VALUES = operator.attrgetter(*_ROW_METRICS)  # what Metrics.to_dict gives for these, max_abs_index a tuple
_MAX_ABS_INDEX = _ROW_METRICS.index("max_abs_index")


class Firsts(Sequence[int]):
    """Row indices of one kind in a streamed comparison: as long as their count, holding the first few (an index
    past them raises IndexError); what reports read of `errors`, `skipped` and the reordered rows."""

    def __init__(self, count: int, first: tuple[int, ...]) -> None:
        self._count, self._first = count, first

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, k):
        return list(self._first)[k] if isinstance(k, slice) else self._first[k]

    def __iter__(self) -> Iterator[int]:
        return iter(self._first)


@dataclasses.dataclass(frozen=True)
class Tally:
    """What a streamed comparison counted as its rows passed (it keeps only some rows: compare/stream.py)."""

    matched: dict[str, int]
    compared: int
    firsts: dict[str, tuple[int, tuple[int, ...]]]  # "errors" | "skipped" | "reordered" -> (count, first indices)
    op_parents: frozenset[str]  # the parents of the op records (whether a zoom-in was run)

    def of(self, kind: str) -> Firsts:
        return Firsts(*self.firsts[kind])


@dataclasses.dataclass(frozen=True)
class Streamed:
    """How a comparison read its dumps: streamed (`evicted`: rows that left the verdict's window, 0 when the verdict
    saw every row), or whole (`fallback`: why not streamed, a compare/stream.py Fallback value)."""

    evicted: int | None
    fallback: str | None = None


class RowFields(msgspec.Struct, gc=False):
    """One row as flat data, the fields of a JSON/CSV record in their order: a struct, ~0.3 us to build where a dict
    took ~2 (a report writes a million rows); the metrics' fields UNSET (absent) for a row without metrics."""

    row: int
    module: str
    module_a: str | None
    type: str
    kind: Any
    io: Any
    index: int
    step: int
    matched_by: Any
    status: str
    label: Any
    shape_a: Any
    shape_b: Any
    dtype_a: str | None
    dtype_b: str | None
    arg_a: str | None
    arg_b: str | None
    error: str | None
    skipped: str | None
    method: Any = msgspec.UNSET
    numel: Any = msgspec.UNSET
    mismatched: Any = msgspec.UNSET
    mismatch_fraction: Any = msgspec.UNSET
    max_abs_err: Any = msgspec.UNSET
    max_abs_index: Any = msgspec.UNSET
    max_rel_err: Any = msgspec.UNSET
    mean_abs_err: Any = msgspec.UNSET
    rmse: Any = msgspec.UNSET
    cosine: Any = msgspec.UNSET
    sqnr_db: Any = msgspec.UNSET
    rel_l2_err: Any = msgspec.UNSET
    nan_a: Any = msgspec.UNSET
    nan_b: Any = msgspec.UNSET
    inf_a: Any = msgspec.UNSET
    inf_b: Any = msgspec.UNSET
    rtol: Any = msgspec.UNSET
    atol: Any = msgspec.UNSET


_PAIR_FIELDS = RowFields.__struct_fields__.index(_ROW_METRICS[0])  # the fields before the metrics' (row ... skipped)


class CalibratedRowFields(RowFields, gc=False):
    """A row of a calibrated comparison (--calibrate): its reference's own noise against float64 too."""

    calibrated: Any = msgspec.UNSET
    noise_dtype: Any = msgspec.UNSET
    noise_abs: Any = msgspec.UNSET
    noise_rel: Any = msgspec.UNSET
    noise_method: Any = msgspec.UNSET
    above_noise: Any = msgspec.UNSET
    not_calibrated: Any = msgspec.UNSET


def row_values(i: int, row: Row, label: Any = None) -> tuple:
    """Row i's `RowFields` values in their order (the metrics' left out for a row without metrics): what a report's
    writer process is sent (render/report_rows.py), a tuple being cheaper to build and to send than the struct."""
    pair = row.pair
    a, b = pair.a, pair.b
    rec = pair.ref.record
    values = (i, rec.module, a.record.module if a else None, rec.type, rec.kind, rec.io, rec.index, rec.step,
              pair.matched_by, row.status.value, label, a.record.shape if a else None,
              b.record.shape if b else None, a.record.dtype if a else None, b.record.dtype if b else None,
              a.record.arg if a else None, b.record.arg if b else None, row.error, row.skipped)
    if row.metrics is None:
        return values
    metrics = _ROW_VALUES(row.metrics)  # attributes read in one C call: a report writes 100k rows and more
    if metrics[_MAX_ABS_INDEX] is not None:
        metrics = (*metrics[:_MAX_ABS_INDEX], list(metrics[_MAX_ABS_INDEX]), *metrics[_MAX_ABS_INDEX + 1:])
    return values + metrics


def row_record(i: int, row: Row, label: Any, calibration: Calibration | None,
               not_calibrated: str | None = None) -> RowFields:
    """Row i as a `RowFields` (a JSON/CSV record), for a row whose result may not be built yet."""
    values = row_values(i, row, label)
    if calibration is None:
        return RowFields(*values)
    pair, metrics = values[:_PAIR_FIELDS], values[_PAIR_FIELDS:]
    if not metrics:
        metrics = (msgspec.UNSET,) * len(_ROW_METRICS)
    n = row.noise
    noise = (n is not None, n.dtype if n else None, n.max_abs if n else None, n.rel_l2 if n else None,
             n.method if n else None, row.above_noise, not_calibrated)
    fields: list[Any] = [*pair, *metrics, *noise]
    return CalibratedRowFields(*fields)


def as_fields(record: RowFields) -> dict[str, Any]:
    """A row's fields that are set, as a dict of builtins: enums as their values, a str subclass (core.words.Words)
    as its text."""
    return msgspec.to_builtins(record, enc_hook=str)


@dataclasses.dataclass(frozen=True)
class CompareResult(PassedByExitCode):
    """The comparison of the migrated side against the reference side, computed once (each row's Pair.a is the
    migrated side's record, Pair.b the reference's; a row's `_a`/`_b` fields follow them); `bool(result)` is
    `passed`; a `Result` (aligner.core.result): `from_dict` reads a saved one back (compare/saved.py). A streamed
    comparison (compare/stream.py) holds only some rows (`rows[i]` of another raises KeyError) and its counts in
    `tally`; its report's rows were handed out as they were made."""

    migrated: str              # "dumps_ms/ (mindspore)": the side checked against the reference
    reference: str             # "dumps_pt/ (pytorch)"
    rows: Sequence[Row]        # a tuple; a streamed comparison's kept rows (compare/stream.py's Kept)
    verdict: Verdict
    problems: tuple[str, ...]  # manifest lines that did not parse, per side
    tolerance: ToleranceSpec = dataclasses.field(default_factory=ToleranceSpec)
    strict: bool = False       # records on one side only fail the comparison
    calibration: Calibration | None = None  # tolerances measured against a float64 dump (compare --calibrate)
    maps: tuple[MsprobeMap, ...] = ()  # msprobe's mapping files read as the --map
    streamed: Streamed | None = None  # how the dumps were read (None: whole, by run.compare called directly)
    tally: Tally | None = None        # a streamed comparison's counts (None: counted from `rows`)

    @property
    def matched(self) -> dict[str, int]:
        """Pairs matched by name or by content; records only in A or only in the reference B; pass-through calls
        folded away on either side."""
        if self.tally is not None:
            return dict(self.tally.matched)
        out = {"name": 0, "content": 0, "unmatched_a": 0, "unmatched_b": 0, "folded_a": 0, "folded_b": 0}
        for r in self.rows:
            if r.pair.matched_by == MatchedBy.FOLDED:
                out["folded_b" if r.pair.a is None else "folded_a"] += 1
            elif r.pair.a is None:
                out["unmatched_b"] += 1
            elif r.pair.b is None:
                out["unmatched_a"] += 1
            else:
                out[r.pair.matched_by or MatchedBy.NAME] += 1
        return out

    @functools.cached_property  # rows never change once compared; reports ask several times
    def errors(self) -> list[int]:
        """Rows whose tensor files could not be read (status ERROR: tested here directly, as Row.status would test it,
        without a property call per row of a long comparison)."""
        if self.tally is not None:
            return self.tally.of("errors")  # type: ignore[return-value]
        return [i for i, r in enumerate(self.rows) if r.error and r.pair.a is not None and r.pair.b is not None]

    @functools.cached_property
    def unmatched(self) -> list[int]:
        """Rows with a record on one side only (status UNMATCHED)."""
        if self.tally is not None:
            return self.tally.of("unmatched")  # type: ignore[return-value]
        return [i for i, r in enumerate(self.rows)
                if (r.pair.a is None or r.pair.b is None) and r.pair.matched_by != MatchedBy.FOLDED]

    @functools.cached_property
    def skipped(self) -> list[int]:
        """Rows whose two records were read but hold nothing to compare them by (status SKIPPED): listed and counted
        like records on one side only, a failure only with `strict`."""
        if self.tally is not None:
            return self.tally.of("skipped")  # type: ignore[return-value]
        return [i for i, r in enumerate(self.rows) if r.skipped]

    @functools.cached_property
    def compared(self) -> int:
        """How many pairs had their numbers compared: none is never a pass."""
        if self.tally is not None:
            return self.tally.compared
        return sum(1 for r in self.rows if r.metrics is not None)

    @functools.cached_property
    def reordered(self) -> Sequence[int]:
        """Diverged rows that hold the reference's rows in another order."""
        if self.tally is not None:
            return self.tally.of("reordered")
        return [i for i, r in enumerate(self.rows) if r.metrics is not None and r.metrics.reordered]

    @functools.cached_property
    def op_parents(self) -> frozenset[str]:
        """The modules whose forward holds op records (the zoom-in of a module was run)."""
        if self.tally is not None:
            return self.tally.op_parents
        return frozenset(r.pair.ref.record.parent or "" for r in self.rows if r.pair.ref.record.kind == Kind.OP)

    def holds(self, i: int) -> bool:
        """Whether row i is held (a streamed comparison keeps some rows only)."""
        try:
            self.rows[i]
        except KeyError:
            return False
        return True

    @property
    def exit_code(self) -> ExitCode:
        """1 for a divergence (or, with `strict`, a record without partner or numbers); else 2 if inputs were
        unreadable; else 1 when nothing was compared; else 0 (`passed`). NaN/Inf in the same places on both sides
        agree: the NaN origin is reported, but it is not a difference between the frameworks."""
        if self.verdict.findings or (self.strict and (self.unmatched or self.skipped)):
            return ExitCode.FOUND
        if self.errors or self.problems:
            return ExitCode.USAGE
        return ExitCode.OK if self.compared else ExitCode.FOUND

    def module(self, row: int) -> str:
        return self.rows[row].pair.ref.record.module

    def zoom_scopes(self, finding: Divergence) -> tuple[str, str]:
        """(migrated side, reference side) module whose forward an op-level zoom-in records, for the code `finding`
        blames: the blamed module; the parent whose code computed the differing input (parent code, an op); for a
        parameter's gradient, its module."""
        a = self.rows[finding.origin].pair.a
        if a is None:
            return finding.blame, finding.blame
        if finding.culprit in (Culprit.PARENT_CODE, Culprit.OP):
            return a.record.parent or "", finding.blame
        if a.record.kind == Kind.PARAM_GRAD:
            return a.record.module.rpartition(".")[0], finding.blame
        return a.record.module, finding.blame

    def row_record(self, i: int) -> RowFields:
        """One row as a `RowFields` (a JSON/CSV record)."""
        missing = self.calibration.missing.get(i) if self.calibration is not None else None
        return row_record(i, self.rows[i], self.verdict.labels.get(i), self.calibration, missing)

    def row_dict(self, i: int) -> dict[str, Any]:
        """One row as flat data (a JSON/CSV record): `row_record`'s fields that are set, enums as their values."""
        return as_fields(self.row_record(i))

    def finding_dict(self, f: Divergence) -> dict[str, Any]:
        out = dataclasses.asdict(f) | {"reason": f.reason,   # Words stay whole (asdict would take them apart)
                                       "module": self.module(f.first), "origin_module": self.module(f.origin)}
        noise = self.rows[f.origin].noise
        return out | ({"noise_dtype": noise.dtype, "noise_abs": noise.max_abs} if noise is not None else {})

    def to_dict(self, rows: bool = True) -> dict[str, Any]:
        """Everything as plain data (enums as their values; non-finite floats stay floats until rendered); without
        `rows`, all but the rows (a report that streams them: `row_dict`)."""
        v = self.verdict
        return {
            "schema": SCHEMAS["compare"], "migrated": self.migrated, "reference": self.reference,
            "passed": self.passed, "exit_code": int(self.exit_code),
            "counts": self.matched | {"compared": self.compared, "skipped": len(self.skipped)},
            "tolerance": self.tolerance.to_dict(), "strict": self.strict,
            "findings": [self.finding_dict(f) for f in v.findings],
            "nan_origin": dataclasses.asdict(v.nan_origin) | {"module": self.module(v.nan_origin.row)}
            if v.nan_origin else None,
            "calibration": self.calibration.to_dict() if self.calibration is not None else None,
            "msprobe_maps": [m.to_dict() for m in self.maps],
            "bisect_reads": v.bisect_reads, "bisect_confirmed": v.bisect_confirmed,
            "bisect_unread": v.bisect_unread, "immaterial_inputs": v.immaterial,
            "manifest_problems": list(self.problems),
        } | ({"rows": [self.row_dict(i) for i in range(len(self.rows))]} if rows else {})


    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompareResult:
        """A saved comparison read back (its JSON, as `to_dict` and render/ wrote it); NotAResultError, ValueError,
        KeyError or TypeError when `data` is not one."""
        return package.load_result(data)
