"""Checkpoint diff as a library call: map A's names onto B's, compare every parameter, count, and check updates.

`diff_checkpoints(a, b)` returns a `CheckpointDiff`; it knows nothing about printing. B is the reference: relative
errors divide by B, and A's names are mapped into B's framework with the same rules (and `--map`) as `align convert`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from aligner.metrics.measure import Metrics, compare_arrays
from aligner.pipelines.convert import plan_conversion
from aligner.core.errors import AlignerError
from aligner.io import TensorSource, open_checkpoint
from aligner.mapping import Plan
from aligner.mapping.rules import split_name

# Leaves that are buffers (running statistics, counters), never trained by an optimizer, in either framework.
BUFFER_LEAVES = frozenset({"running_mean", "running_var", "num_batches_tracked", "moving_mean", "moving_variance"})
# Row statuses that are differences between A and B ("equal", "created", "dropped" are not).
DIFFERENT = ("different", "shape mismatch", "missing", "unexpected", "ambiguous", "update differs")


@dataclasses.dataclass
class ParamDiff:
    """One parameter: B's name, the A tensor(s) it came from, how they compare and whether each side moved from init."""

    name: str
    sources: list[str]
    status: str                      # equal different shape mismatch missing unexpected ambiguous update differs created dropped
    numel: int = 0
    trainable: bool | None = None    # None: unknown (MindSpore checkpoints store buffers as Parameters too)
    metrics: Metrics | None = None
    updated_a: bool | None = None    # changed from --init (None without --init or when init lacks it)
    updated_b: bool | None = None
    reason: str = ""

    @property
    def differs(self) -> bool:
        return self.status in DIFFERENT

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["metrics"] = self.metrics.to_dict() if self.metrics else None
        out["differs"] = self.differs
        return out


@dataclasses.dataclass
class SideCounts:
    """Tensors and elements of one checkpoint; trainable ones where the format tells (None: unknown)."""

    path: str
    framework: str | None
    tensors: int
    elements: int
    trainable_tensors: int | None
    trainable_elements: int | None


@dataclasses.dataclass
class CheckpointDiff:
    """Everything `align diff` reports."""

    a: SideCounts
    b: SideCounts
    params: list[ParamDiff]
    rtol: float | None
    atol: float | None
    init: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def differences(self) -> list[ParamDiff]:
        return [p for p in self.params if p.differs]

    @property
    def frozen_both(self) -> list[ParamDiff]:
        """Trainable parameters that --init shows unchanged on both sides (not a difference, often a mistake)."""
        return [p for p in self.params if p.updated_a is False and p.updated_b is False and p.trainable is not False]

    @property
    def exit_code(self) -> int:
        return 1 if self.differences else 0

    def to_dict(self) -> dict[str, Any]:
        return {"a": dataclasses.asdict(self.a), "b": dataclasses.asdict(self.b), "rtol": self.rtol,
                "atol": self.atol, "init": self.init, "equal": not self.differences,
                "differences": [p.name for p in self.differences],
                "frozen_both": [p.name for p in self.frozen_both], "notes": self.notes,
                "params": [p.to_dict() for p in self.params]}


def is_trainable(name: str, framework: str | None) -> bool | None:
    """False for buffer leaves, True for other PyTorch state, None (unknown) otherwise."""
    if split_name(name)[1] in BUFFER_LEAVES:
        return False
    return True if framework == "pytorch" else None


def side_counts(source: TensorSource) -> SideCounts:
    """Tensor and element counts of a checkpoint, trainable ones only when every entry's status is known."""
    flags = {n: is_trainable(n, source.framework) for n in source.infos}
    known = None not in flags.values()
    return SideCounts(source.path, source.framework, len(source.infos),
                      sum(i.numel for i in source.infos.values()),
                      sum(flags.values()) if known else None,
                      sum(i.numel for n, i in source.infos.items() if flags[n]) if known else None)


def _check_same_model(plan: Plan, a: TensorSource, b: TensorSource, what: str) -> None:
    """Refuse two checkpoints of different models: more than half of the keys without a counterpart."""
    unmatched = sum(1 for e in plan.entries if e.status in ("missing", "unexpected", "shape mismatch", "ambiguous"))
    total = max(len(a.infos), len(b.infos), 1)
    if unmatched * 2 > total:
        raise AlignerError(f"{a.path} and {b.path} look like checkpoints of different models: {unmatched} of "
                           f"{total} {what} keys have no counterpart")


def _mapped(source: TensorSource, like: TensorSource, map_path: str | None, what: str) -> tuple[Plan, dict]:
    """Plan `source` into `like`'s names and load the mapped tensors {target name: array}."""
    plan = plan_conversion(source, like=like, map_path=map_path)
    _check_same_model(plan, source, like, what)
    return plan, dict(plan.tensors(source))


def _row(entry: Any, arrays_a: dict[str, np.ndarray], b: TensorSource, rtol: float | None,
         atol: float | None) -> ParamDiff:
    """The ParamDiff of one plan entry (the comparison itself for paired tensors)."""
    name = entry.target or entry.sources[0]
    numel = entry.info.numel if entry.info else b.infos[name].numel if name in b.infos else 0
    row = ParamDiff(name, list(entry.sources), entry.status, numel, reason=entry.reason)
    if entry.status in ("shape mismatch", "missing", "ambiguous", "created", "dropped", "unexpected"):
        return row
    row.metrics = compare_arrays(arrays_a[name], b.get(name), rtol, atol)
    row.status = "different" if row.metrics.diverged else "equal"
    return row


def _mark_updates(rows: list[ParamDiff], arrays_a: dict[str, np.ndarray], b: TensorSource,
                  init: dict[str, np.ndarray]) -> None:
    """Set updated_a/updated_b (exactly changed from init) and flag parameters updated on one side only."""
    for row in rows:
        if row.name not in init or row.name not in arrays_a or row.status not in ("equal", "different"):
            continue
        start = init[row.name]
        row.updated_a = not np.array_equal(np.asarray(arrays_a[row.name]).reshape(start.shape), start)
        row.updated_b = not np.array_equal(np.asarray(b.get(row.name)).reshape(start.shape), start)
        if row.updated_a != row.updated_b:
            row.status = "update differs"
            row.reason = f"updated in {'A' if row.updated_a else 'B'}, NOT updated in {'B' if row.updated_a else 'A'}"


def diff_checkpoints(path_a: str, path_b: str, *, map_path: str | None = None, init_path: str | None = None,
                     rtol: float | None = None, atol: float | None = None,
                     allow_pickle: bool = False) -> CheckpointDiff:
    """Compare checkpoint A against the reference B, parameter by parameter, after mapping A's names onto B's."""
    with open_checkpoint(path_a, allow_pickle=allow_pickle) as a, \
            open_checkpoint(path_b, allow_pickle=allow_pickle) as b:
        plan, arrays_a = _mapped(a, b, map_path, "parameter")
        rows = [_row(e, arrays_a, b, rtol, atol) for e in plan.entries]
        for row in rows:
            row.trainable = _trainable(row, a.framework, b.framework)
        result = CheckpointDiff(side_counts(a), side_counts(b), rows, rtol, atol, init_path, list(plan.notes))
        if init_path:
            with open_checkpoint(init_path, allow_pickle=allow_pickle) as init:
                _, init_arrays = _mapped(init, b, map_path if init.framework == a.framework else None, "--init")
            _mark_updates(rows, arrays_a, b, init_arrays)
    return result


def _trainable(row: ParamDiff, framework_a: str | None, framework_b: str | None) -> bool | None:
    """Whether a row is trainable, from whichever side's checkpoint can tell."""
    flags = [is_trainable(row.name, framework_b)] + [is_trainable(s, framework_a) for s in row.sources]
    if False in flags:
        return False
    return True if True in flags else None
