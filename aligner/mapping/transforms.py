"""Tensor operations a mapping entry can carry, on arrays and (for planning) on shapes alone.

Each op is a frozen dataclass; `to_dict()` gives the JSON form (`{"op": "split", "axis": 0, ...}`) reports show.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

import numpy as np

from aligner.core.dtypes import to_numpy
from aligner.core.errors import AlignerError


class OpKind(str, enum.Enum):
    """The name of an op, as written in JSON reports and user mapping files."""

    CONCAT = "concat"
    CREATE = "create"
    SPLIT = "split"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    UNSQUEEZE = "unsqueeze"
    SQUEEZE = "squeeze"
    CAST = "cast"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Op:
    """One step turning an entry's source arrays into its output array."""

    kind: ClassVar[OpKind]

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        """The output of this step given the current arrays (the sources, or the previous step's one result)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: `op` first, then the fields in declaration order (tuples as lists)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"op": self.kind.value} | {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def _one(arrays: list[np.ndarray]) -> np.ndarray:
    """The single array a one-input op works on; several sources must be combined first."""
    if len(arrays) != 1:
        raise AlignerError("an entry with several sources must start with concat")
    return arrays[0]


@dataclasses.dataclass(frozen=True)
class Concat(Op):
    """Join all the sources along `axis`."""

    kind: ClassVar[OpKind] = OpKind.CONCAT
    axis: int

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(arrays, axis=self.axis)


@dataclasses.dataclass(frozen=True)
class Create(Op):
    """A new constant tensor with no source (a counter the target framework keeps and the source does not)."""

    kind: ClassVar[OpKind] = OpKind.CREATE
    dtype: str
    shape: tuple[int, ...]
    value: float

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return np.full(self.shape, self.value, dtype=to_numpy(self.dtype))


@dataclasses.dataclass(frozen=True)
class Split(Op):
    """Part `index` of the source cut into `parts` equal pieces along `axis`."""

    kind: ClassVar[OpKind] = OpKind.SPLIT
    axis: int
    parts: int
    index: int

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return np.split(_one(arrays), self.parts, axis=self.axis)[self.index]


@dataclasses.dataclass(frozen=True)
class Reshape(Op):
    """The source with a new shape (same elements, C order)."""

    kind: ClassVar[OpKind] = OpKind.RESHAPE
    shape: tuple[int, ...]

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return _one(arrays).reshape(self.shape)


@dataclasses.dataclass(frozen=True)
class Transpose(Op):
    """The source with its axes permuted."""

    kind: ClassVar[OpKind] = OpKind.TRANSPOSE
    perm: tuple[int, ...]

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return np.transpose(_one(arrays), self.perm)


    def inverse(self) -> Transpose:
        """The permutation that puts the axes back."""
        return Transpose(tuple(sorted(range(len(self.perm)), key=self.perm.__getitem__)))

@dataclasses.dataclass(frozen=True)
class Unsqueeze(Op):
    """The source with a unit axis inserted at `axis`."""

    kind: ClassVar[OpKind] = OpKind.UNSQUEEZE
    axis: int

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return np.expand_dims(_one(arrays), self.axis)

    def inverse(self) -> Squeeze:
        return Squeeze(self.axis)


@dataclasses.dataclass(frozen=True)
class Squeeze(Op):
    """The source with its unit axis `axis` removed."""

    kind: ClassVar[OpKind] = OpKind.SQUEEZE
    axis: int

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return np.squeeze(_one(arrays), self.axis)

    def inverse(self) -> Unsqueeze:
        return Unsqueeze(self.axis)


@dataclasses.dataclass(frozen=True)
class Cast(Op):
    """The source converted to the canonical dtype `dtype`."""

    kind: ClassVar[OpKind] = OpKind.CAST
    dtype: str

    def apply(self, arrays: list[np.ndarray]) -> np.ndarray:
        return _one(arrays).astype(to_numpy(self.dtype))


AxisOp = Unsqueeze | Squeeze


def op_from_dict(data: dict[str, Any]) -> Op:
    """The op `Op.to_dict` gave, back (ValueError for an unknown op, TypeError for wrong fields)."""
    kind = OpKind(data["op"])
    cls = next(c for c in (Concat, Create, Split, Reshape, Transpose, Unsqueeze, Squeeze, Cast) if c.kind is kind)
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    if set(data) - {"op"} != set(fields):
        raise TypeError(f"{kind.value}: fields {sorted(set(data) - {'op'})}, expected {sorted(fields)}")
    values: dict[str, Any] = {k: tuple(data[k]) if "tuple" in str(t) else data[k] for k, t in fields.items()}
    return cls(**values)


def parse_axis_op(spec: str) -> AxisOp:
    """A rules-file `unsqueeze:N` / `squeeze:N` as an op."""
    kind, _, axis = spec.partition(":")
    if kind == OpKind.UNSQUEEZE:
        return Unsqueeze(int(axis))
    if kind == OpKind.SQUEEZE:
        return Squeeze(int(axis))
    raise AlignerError(f"unknown reshape {spec!r} in the layer rules (expected unsqueeze:N or squeeze:N)")


def apply_ops(arrays: list[np.ndarray], ops: list[Op]) -> np.ndarray:
    """Run an entry's ops in turn on its source arrays (several sources must start with concat)."""
    for op in ops:
        arrays = [op.apply(arrays)]
    return _one(arrays)


def shape_after(shapes: list[tuple[int, ...]], ops: list[Op]) -> tuple[int, ...]:
    """The shape `apply_ops` would produce, checked without touching data (bad user transforms fail here)."""
    dummies = [np.broadcast_to(np.empty((), np.bool_), s) for s in shapes]
    try:
        return tuple(apply_ops(dummies, [o for o in ops if not isinstance(o, Cast)]).shape)
    except (ValueError, IndexError, np.AxisError) as exc:
        raise AlignerError(f"cannot apply {[o.kind.value for o in ops]} to shape(s) {shapes}: {exc}") from None
