"""The canonical op table (mappings/ops_torch_mindspore.yaml): which PyTorch and MindSpore op names compute the same
thing, so that op records of an op-level dump (`aligner.dump(ops=True)`) can be paired across frameworks."""
from __future__ import annotations

import dataclasses
import functools

from aligner.core.frameworks import Framework
from aligner.core.rules import ListOf, MapOf, Opt, load_rules

OPS_FILE = "ops_torch_mindspore.yaml"  # in the top-level mappings/, shipped inside the wheel as aligner.mappings
FRAMEWORKS = (Framework.PYTORCH, Framework.MINDSPORE)
SCHEMA = {"ops": MapOf({fw.value: Opt(ListOf(str)) for fw in FRAMEWORKS})}   # op -> framework -> names


@dataclasses.dataclass(frozen=True)
class OpTable:
    """Op names as an op-level dump records them -> canonical op, per framework and merged."""

    by_framework: dict[str, dict[str, str]]
    merged: dict[str, str]

    def canonical(self, name: str, framework: str | None = None) -> str:
        """The canonical op of `name` ("Tensor.__matmul__" -> "matmul"); a name the table lacks becomes its last
        component, lower-cased, without surrounding underscores ("ops.Exp" -> "exp")."""
        table = self.merged if framework is None else self.by_framework.get(framework, self.merged)
        found = table.get(name)
        return found if found is not None else name.rpartition(".")[2].strip("_").lower()


@functools.cache
def load_op_table(name: str = OPS_FILE) -> OpTable:
    """Parse an op table of the installed `aligner.mappings` package once. A name listed under two canonical ops
    (within a framework, or across them: the compare side looks names up without knowing the framework) is a
    ValueError: the table would pair it both ways."""
    data = load_rules(name, SCHEMA)   # only when an op record is looked up: plain compares never parse the table
    by_framework: dict[str, dict[str, str]] = {fw: {} for fw in FRAMEWORKS}
    merged: dict[str, str] = {}
    for op, sides in data["ops"].items():
        for framework, names in sides.items():
            for called in names:
                for table in (by_framework[framework], merged):
                    if table.setdefault(called, op) != op:
                        raise ValueError(f"{name}: {called!r} is listed under both {table[called]!r} and {op!r}")
    return OpTable(by_framework, merged)


def canonical_op(name: str, framework: str | None = None) -> str:
    """The canonical op of a recorded op name (see OpTable.canonical), from the built-in table."""
    return load_op_table().canonical(name, framework)
