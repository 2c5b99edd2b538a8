"""Tensor operations a mapping entry can carry, on arrays and (for planning) on shapes alone."""
from __future__ import annotations

from typing import Any

import numpy as np

from aligner.core.dtypes import to_numpy
from aligner.core.errors import AlignerError


def apply_ops(arrays: list[np.ndarray], ops: list[dict[str, Any]]) -> np.ndarray:
    """Run an entry's ops: several sources are concatenated first, then each op in turn."""
    out = arrays[0] if len(arrays) == 1 else None
    for op in ops:
        kind = op["op"]
        if kind == "concat":
            out = np.concatenate(arrays, axis=op["axis"])
        elif kind == "create":
            out = np.full(op["shape"], op["value"], dtype=to_numpy(op["dtype"]))
        elif kind == "split":
            out = np.split(out, op["parts"], axis=op["axis"])[op["index"]]
        elif kind == "reshape":
            out = out.reshape(op["shape"])
        elif kind == "transpose":
            out = np.transpose(out, op["perm"])
        elif kind == "unsqueeze":
            out = np.expand_dims(out, op["axis"])
        elif kind == "squeeze":
            out = np.squeeze(out, op["axis"])
        elif kind == "cast":
            out = out.astype(to_numpy(op["dtype"]))
        else:
            raise AlignerError(f"unknown mapping op {kind!r}")
    if out is None:
        raise AlignerError("an entry with several sources must start with concat")
    return out


def shape_after(shapes: list[tuple[int, ...]], ops: list[dict[str, Any]]) -> tuple[int, ...]:
    """The shape `apply_ops` would produce, checked without touching data (bad user transforms fail here)."""
    dummies = [np.broadcast_to(np.empty((), np.bool_), s) for s in shapes]
    try:
        return tuple(apply_ops(dummies, [o for o in ops if o["op"] != "cast"]).shape)
    except (ValueError, IndexError, np.AxisError) as exc:
        raise AlignerError(f"cannot apply {[o['op'] for o in ops]} to shape(s) {shapes}: {exc}") from None
