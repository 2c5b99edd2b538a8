"""Pairing the op records of op-level dumps (`aligner.dump(ops=True)`) across frameworks.

Op records are never paired by name and occurrence: two faithful implementations often order the same arithmetic
differently (timm scales q before `q @ k^T`, mindcv scales the product after its BatchMatMul), so "the nth matmul"
on each side can hold different numbers without any bug, and a forced pair would report a divergence that is not
there. Instead, op records are aligned in the gaps between the module records (which do pair by name) by the
content/shape sequence alignment of `matching`, where agreeing content weighs most and the same canonical op
(mappings/ops_torch_mindspore.yaml: `Tensor.matmul` is `ops.BatchMatMul`) counts as the same module type does.
"""
from __future__ import annotations

from aligner import mapping  # the op table, loaded when the first op record is looked up
from aligner.dumping.manifest import Io, Kind, Record


def is_op(record: Record) -> bool:
    """Whether a record is one op call's input or output (kind "op")."""
    return record.kind == Kind.OP


def op_type(record: Record) -> str:
    """The canonical op of an op record ("ops.BatchMatMul" and "Tensor.matmul" are both "matmul")."""
    return mapping.canonical_op(record.type)


def input_rank(record: Record) -> int | None:
    """Where an op record's input stands in its op's role order (mappings/ops_torch_mindspore.yaml `inputs`:
    `ops.BatchNorm` takes scale and bias before the moving statistics, `F.batch_norm` after them); None for an output,
    a module record or an op without roles."""
    if record.kind != Kind.OP or record.io != Io.INPUT:
        return None
    return mapping.input_role(record.type, record.index, record.arg)
