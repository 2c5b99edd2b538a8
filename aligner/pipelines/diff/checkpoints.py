"""Checkpoint diff as a library call: map A's names onto B's, compare every parameter, count, and check updates.

`diff_checkpoints(a, b)` returns a `DiffResult`; it knows nothing about printing. B is the reference: relative
errors divide by B, and A's names are mapped into B's framework with the same rules (and `--map`) as `align convert`.
Known patterns (BatchNorm momentum convention, a learning-rate ratio, a parameter updated on one side only) come back
as `Finding`s in `DiffResult.hints`, so a script gets the same diagnosis as the command line.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

import numpy as np

from aligner.core.buffers import RUNNING_STAT_INIT, is_buffer, leaf
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.findings import Finding, Severity
from aligner.core.result import PassedByExitCode, check_schema, number, typed
from aligner.core.tolerance import ToleranceSpec
from aligner.core.words import words
from aligner.io import TensorSource, open_checkpoint
from aligner.mapping import Plan
from aligner.mapping.plan import EntryStatus
from aligner.metrics.measure import Metrics, compare_arrays
from aligner.pipelines.convert.checkpoint import plan_conversion
from aligner.pipelines.diff.says import Say
from aligner.pipelines.inspect import Counts, source_rows


class DiffStatus(str, enum.Enum):
    """One parameter's verdict (the JSON value is the string)."""

    EQUAL = "equal"
    DIFFERENT = "different"
    SHAPE_MISMATCH = "shape mismatch"
    MISSING = "missing"              # in B only
    UNEXPECTED = "unexpected"        # in A only
    AMBIGUOUS = "ambiguous"          # several A tensors fit this B key equally: not compared
    UPDATE_DIFFERS = "update differs"  # with --init: changed from init on one side only
    CREATED = "created"              # a buffer A's framework does not have (num_batches_tracked): not compared
    DROPPED = "dropped"              # an A buffer B's framework does not have: not compared

    def __str__(self) -> str:
        return self.value


# Always a difference: the numbers disagree, or a key on both sides could not be compared.
FAILING = frozenset({DiffStatus.DIFFERENT, DiffStatus.SHAPE_MISMATCH, DiffStatus.AMBIGUOUS, DiffStatus.UPDATE_DIFFERS})
# A key on one side only: reported, a failure only with strict=True.
ONE_SIDE = frozenset({DiffStatus.MISSING, DiffStatus.UNEXPECTED})
# Statuses taken over from the conversion plan unchanged (not compared).
_FROM_PLAN = {s.value: s for s in (DiffStatus.SHAPE_MISMATCH, DiffStatus.MISSING, DiffStatus.UNEXPECTED,
                                    DiffStatus.AMBIGUOUS, DiffStatus.CREATED, DiffStatus.DROPPED)}

NOISE = 1e-5          # an update smaller than this fraction of the parameter's norm is rounding, not training
FIT_RESIDUAL = 0.05   # A's update must be this close to ratio * B's update for a ratio to mean anything
SAME_RATIO = 0.02     # ratios within 2% of their median count as one constant ratio
MOMENTUM_SWAP = 9.0   # (1 - 0.1) / 0.1: torch momentum 0.1 written as MindSpore momentum=0.1, or the reverse


@dataclasses.dataclass(frozen=True)
class ParamDiff:
    """One parameter: B's name, the A tensor(s) it came from, how they compare and whether each side moved from init."""

    name: str
    sources: tuple[str, ...]
    status: DiffStatus
    numel: int = 0
    trainable: bool | None = None    # False for buffers; None: unknown (a file does not keep requires_grad)
    metrics: Metrics | None = None
    updated_a: bool | None = None    # changed from --init (None without --init or when init lacks it)
    updated_b: bool | None = None
    update_ratio: float | None = None  # with --init: A's update / B's update (least squares), when both moved
    reason: str = ""

    @property
    def differs(self) -> bool:
        """A real difference (always fails) or a key on one side only (fails with --strict)."""
        return self.status in FAILING or self.status in ONE_SIDE

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        out["metrics"] = self.metrics.to_dict() if self.metrics else None
        out["differs"] = self.differs
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParamDiff:
        metrics = data["metrics"]
        return cls(typed(data["name"], str, "name"), tuple(typed(n, str, "source") for n in data["sources"]),
                   DiffStatus(data["status"]), typed(data["numel"], int, "numel"), _flag(data["trainable"]),
                   None if metrics is None else Metrics.from_dict(typed(metrics, dict, "metrics")),
                   _flag(data["updated_a"]), _flag(data["updated_b"]), number(data["update_ratio"]),
                   typed(data["reason"], str, "reason"))


def _flag(value: Any) -> bool | None:
    return None if value is None else typed(value, bool, "flag")


@dataclasses.dataclass(frozen=True)
class SideCounts:
    """One checkpoint's path, naming convention and tensor counts (trainable ones unknown from a file)."""

    path: str
    framework: str | None
    counts: Counts

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "framework": self.framework, **self.counts.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SideCounts:
        framework = data["framework"]
        return cls(typed(data["path"], str, "path"), None if framework is None else typed(framework, str, "framework"),
                   Counts(**{f.name: data[f.name] for f in dataclasses.fields(Counts)}))


@dataclasses.dataclass(frozen=True)
class DiffResult(PassedByExitCode):
    """Everything `align diff` reports; `exit_code` follows from the rows and `strict`; a `Result`
    (aligner.core.result)."""

    a: SideCounts
    b: SideCounts
    params: tuple[ParamDiff, ...]
    tolerance: ToleranceSpec
    init: str | None = None
    strict: bool = False
    notes: tuple[str, ...] = ()
    hints: tuple[Finding, ...] = ()

    @property
    def differences(self) -> list[ParamDiff]:
        """Rows that always fail: values, shapes or updates disagree, or a pairing was ambiguous."""
        return [p for p in self.params if p.status in FAILING]

    @property
    def one_side(self) -> list[ParamDiff]:
        """Keys in one checkpoint only (missing from A, or unexpected in A)."""
        return [p for p in self.params if p.status in ONE_SIDE]

    @property
    def failures(self) -> list[ParamDiff]:
        return self.differences + (self.one_side if self.strict else [])

    @property
    def nothing_compared(self) -> bool:
        """No parameter had a twin whose numbers could be read: never a pass, whatever else holds."""
        return not self.compared

    @property
    def compared(self) -> list[ParamDiff]:
        return [p for p in self.params if p.metrics is not None]

    @property
    def frozen_both(self) -> list[ParamDiff]:
        """Trainable parameters that --init shows unchanged on both sides (not a difference, often a mistake)."""
        return [p for p in self.params if p.updated_a is False and p.updated_b is False and p.trainable is not False]

    @property
    def exit_code(self) -> ExitCode:
        """0 (`passed`) when something was compared and nothing failed (keys on one side only fail with `strict`),
        else 1."""
        return ExitCode.FOUND if self.failures or self.nothing_compared else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "tolerance": self.tolerance.to_dict(),
                "init": self.init, "strict": self.strict, "equal": not self.differences and not self.one_side,
                "passed": self.passed, "compared": len(self.compared),
                "differences": [p.name for p in self.differences],
                "one_side": [p.name for p in self.one_side], "frozen_both": [p.name for p in self.frozen_both],
                "hints": [h.to_dict() for h in self.hints], "notes": list(self.notes),
                "params": [p.to_dict() for p in self.params]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiffResult:
        """A saved `align diff --json` read back; NotAResultError, ValueError, KeyError or TypeError when `data` is
        not one."""
        data = check_schema(data, "diff", ("a", "b", "params", "differences", "one_side"))
        init = data["init"]
        return cls(SideCounts.from_dict(typed(data["a"], dict, "a")), SideCounts.from_dict(typed(data["b"], dict, "b")),
                   tuple(ParamDiff.from_dict(typed(p, dict, "param")) for p in typed(data["params"], list, "params")),
                   ToleranceSpec.from_dict(typed(data["tolerance"], dict, "tolerance")),
                   None if init is None else typed(init, str, "init"), typed(data["strict"], bool, "strict"),
                   tuple(typed(n, str, "note") for n in data["notes"]),
                   tuple(Finding.from_dict(typed(h, dict, "hint")) for h in data["hints"]))


def side_counts(source: TensorSource) -> SideCounts:
    """Tensor, parameter and buffer counts of a checkpoint (buffers by leaf name; trainable unknown)."""
    return SideCounts(source.path, source.framework, Counts.of(source_rows(source)))


def _check_same_model(plan: Plan, a: TensorSource, b: TensorSource, what: str) -> None:
    """Refuse two checkpoints of different models: more than half of the keys without a counterpart."""
    unmatched = sum(1 for e in plan.entries if e.status in (EntryStatus.MISSING, EntryStatus.UNEXPECTED,
                                                            EntryStatus.SHAPE_MISMATCH, EntryStatus.AMBIGUOUS))
    total = max(len(plan.entries), 1)  # the union of both sides' keys, so the count never exceeds it
    if unmatched * 2 > total:
        raise AlignerError(f"{a.path} and {b.path} look like checkpoints of different models: {unmatched} of "
                           f"{total} {what} keys have no counterpart")


def _mapped(source: TensorSource, like: TensorSource, map_path: str | None, what: str) -> tuple[Plan, dict]:
    """Plan `source` into `like`'s names and load the mapped tensors {target name: array}."""
    plan = plan_conversion(source, like=like, map_path=map_path)
    _check_same_model(plan, source, like, what)
    return plan, dict(plan.tensors(source))


def _row(entry: Any, arrays_a: dict[str, np.ndarray], b: TensorSource, tolerance: ToleranceSpec) -> ParamDiff:
    """The ParamDiff of one plan entry (the comparison itself for paired tensors)."""
    name = entry.target or entry.sources[0]
    numel = entry.info.numel if entry.info else b.infos[name].numel if name in b.infos else 0
    status = _FROM_PLAN.get(str(entry.status))
    sources = tuple(entry.sources)
    trainable = False if is_buffer(name) or any(is_buffer(s) for s in sources) else None
    if status is not None:
        return ParamDiff(name, sources, status, numel, trainable, reason=entry.reason)
    tol = tolerance.resolve(name, entry.info.dtype, b.infos[name].dtype)
    metrics = compare_arrays(arrays_a[name], b.get(name), tol)
    return ParamDiff(name, sources, DiffStatus.DIFFERENT if metrics.diverged else DiffStatus.EQUAL, numel, trainable,
                     metrics, reason=entry.reason)


def _fit(update_a: np.ndarray, update_b: np.ndarray) -> tuple[float, float] | None:
    """(ratio, residual): the least-squares `ratio` with update_a ~ ratio * update_b and how far off that is
    (relative to |update_a|); None when B did not move."""
    ua, ub = update_a.astype(np.float64).ravel(), update_b.astype(np.float64).ravel()
    norm_b = float(np.dot(ub, ub))
    if norm_b == 0.0 or not np.isfinite(norm_b):
        return None
    ratio = float(np.dot(ua, ub)) / norm_b
    norm_a = float(np.linalg.norm(ua))
    residual = float(np.linalg.norm(ua - ratio * ub)) / norm_a if norm_a else 1.0
    return ratio, residual


def _ratio(value_a: np.ndarray, value_b: np.ndarray, start: np.ndarray) -> float | None:
    """A's update / B's update from `start`, when B's is more than rounding and A's points the same way."""
    start64 = start.astype(np.float64)
    update_b = value_b - start64
    if float(np.linalg.norm(update_b)) <= NOISE * max(float(np.linalg.norm(start64)), 1e-30):
        return None
    fit = _fit(value_a - start64, update_b)
    return fit[0] if fit is not None and fit[1] < FIT_RESIDUAL else None


def _with_updates(row: ParamDiff, arrays_a: dict[str, np.ndarray], b: TensorSource,
                  init: dict[str, np.ndarray]) -> ParamDiff:
    """The row with updated_a/updated_b (exactly changed from init) and update_ratio; a parameter updated on one side
    only flagged."""
    if row.name not in init or row.name not in arrays_a or row.status not in (DiffStatus.EQUAL, DiffStatus.DIFFERENT):
        return row
    start = init[row.name]
    value_a = np.asarray(arrays_a[row.name]).reshape(start.shape)
    value_b = np.asarray(b.get(row.name)).reshape(start.shape)
    moved_a, moved_b = not np.array_equal(value_a, start), not np.array_equal(value_b, start)
    ratio = _ratio(value_a, value_b, start) if moved_a and moved_b and start.dtype.kind == "f" else None
    if moved_a == moved_b:
        return dataclasses.replace(row, updated_a=moved_a, updated_b=moved_b, update_ratio=ratio)
    return dataclasses.replace(row, updated_a=moved_a, updated_b=moved_b, update_ratio=ratio,
                               status=DiffStatus.UPDATE_DIFFERS,
                               reason=f"updated in {'A' if moved_a else 'B'}, NOT updated in {'B' if moved_a else 'A'}")


def _momentum_hint(rows: list[ParamDiff], arrays_a: dict[str, np.ndarray], b: TensorSource,
                   init: dict[str, np.ndarray] | None) -> Finding | None:
    """BatchNorm running statistics that moved a constant multiple (9 or 1/9: the momentum conventions swapped)."""
    fits: dict[str, float] = {}
    assumed = False
    for row in rows:
        stat = leaf(row.name)
        if stat not in RUNNING_STAT_INIT or row.metrics is None or row.name not in arrays_a:
            continue
        value_b = np.asarray(b.get(row.name), np.float64)
        if init is not None and row.name in init:
            start = np.asarray(init[row.name], np.float64).reshape(value_b.shape)
        elif init is None:  # one step from a fresh layer: mean 0, variance 1
            start, assumed = np.full(value_b.shape, RUNNING_STAT_INIT[stat]), True
        else:
            continue
        fit = _fit(np.asarray(arrays_a[row.name], np.float64).reshape(value_b.shape) - start, value_b - start)
        if fit is not None and fit[1] < FIT_RESIDUAL:
            fits[row.name] = fit[0]
    if not fits:
        return None
    ratios = np.array(list(fits.values()))
    ratio = float(np.median(ratios))
    if abs(ratio - 1) < 0.01 or np.any(np.abs(ratios / ratio - 1) > SAME_RATIO * 2):
        return None
    swapped = next((side for side, want in (("A", MOMENTUM_SWAP), ("B", 1 / MOMENTUM_SWAP))
                    if abs(ratio / want - 1) < 0.05), None)
    message = words(Say.BN_MOMENTUM, ratio=ratio, tensors=len(fits), assumed=assumed, swapped=swapped)
    return Finding("bn-momentum", Severity.WARNING, message, tuple(fits), fix=words(Say.BN_MOMENTUM_FIX))


def _lr_hint(rows: list[ParamDiff]) -> Finding | None:
    """Every updated parameter moved the same multiple (not 1) in A as in B: the learning rates differ."""
    ratios = {r.name: r.update_ratio for r in rows
              if r.update_ratio is not None and r.trainable is not False and not is_buffer(r.name)}
    if len(ratios) < 2 or not any(r.status is DiffStatus.DIFFERENT for r in rows):
        return None
    values = np.array(list(ratios.values()))
    ratio = float(np.median(values))
    if abs(ratio - 1) < 0.005 or np.any(np.abs(values / ratio - 1) > SAME_RATIO):
        return None
    return Finding("learning-rate-ratio", Severity.WARNING, words(Say.LR_RATIO, ratio=ratio, count=len(ratios)),
                   tuple(ratios), fix=words(Say.LR_RATIO_FIX))


def _one_side_hint(rows: list[ParamDiff]) -> list[Finding]:
    """Parameters changed from init on one side only: frozen there, or left out of that side's optimizer."""
    out = []
    for moved, still in (("B", "A"), ("A", "B")):
        names = [r.name for r in rows if r.status is DiffStatus.UPDATE_DIFFERS
                 and (r.updated_b if moved == "B" else r.updated_a)]
        if names:
            out.append(Finding("updated-one-side", Severity.WARNING,
                               words(Say.UPDATED_ONE_SIDE, moved=moved, still=still, names=tuple(names)), tuple(names),
                               fix=words(Say.ONE_SIDE_FIX, still=still)))
    return out


def diff_checkpoints(path_a: str, path_b: str, *, map_path: str | None = None, init_path: str | None = None,
                     tolerance: ToleranceSpec | None = None, strict: bool = False,
                     trust_pickle: bool = False) -> DiffResult:
    """Compare checkpoint A against the reference B, parameter by parameter, after mapping A's names onto B's.

    `tolerance` resolves per B name and dtype (default: torch.testing's per-dtype table); `strict` makes keys on one
    side only fail; `init_path` adds which side updated what, and the learning-rate and momentum hints.
    """
    tolerance = tolerance or ToleranceSpec()
    with open_checkpoint(path_a, allow_pickle=trust_pickle) as a, \
            open_checkpoint(path_b, allow_pickle=trust_pickle) as b:
        plan, arrays_a = _mapped(a, b, map_path, "parameter")
        rows = [_row(e, arrays_a, b, tolerance) for e in plan.entries]
        init_arrays = None
        if init_path:
            with open_checkpoint(init_path, allow_pickle=trust_pickle) as init:
                _, init_arrays = _mapped(init, b, map_path if init.framework == a.framework else None, "--init")
            rows = [_with_updates(row, arrays_a, b, init_arrays) for row in rows]
        hints = [h for h in (_momentum_hint(rows, arrays_a, b, init_arrays), _lr_hint(rows)) if h is not None]
        hints += _one_side_hint(rows)
        return DiffResult(side_counts(a), side_counts(b), tuple(rows), tolerance, init_path, strict,
                          tuple(plan.notes), tuple(hints))
