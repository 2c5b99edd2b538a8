"""The canonical op table (mappings/ops_torch_mindspore.yaml): which PyTorch and MindSpore op names compute the same
thing, so that op records of an op-level dump (`aligner.dump(ops=True)`) can be paired across frameworks."""
from __future__ import annotations

import dataclasses
import functools

from aligner.core.frameworks import Framework
from aligner.core.rules import ListOf, MapOf, Opt, load_rules

OPS_FILE = "ops_torch_mindspore.yaml"  # in the top-level mappings/, shipped inside the wheel as aligner.mappings
FRAMEWORKS = (Framework.PYTORCH, Framework.MINDSPORE)
# op -> framework -> names, and optionally name -> the roles of its tensor inputs in positional order
SCHEMA = {"ops": MapOf({**{fw.value: Opt(ListOf(str)) for fw in FRAMEWORKS}, "inputs": Opt(MapOf(ListOf(str)))})}


@dataclasses.dataclass(frozen=True)
class OpTable:
    """Op names as an op-level dump records them -> canonical op, per framework and merged."""

    by_framework: dict[str, dict[str, str]]
    merged: dict[str, str]
    roles: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # name -> its tensor inputs' roles

    def input_role(self, name: str, index: int, arg: str | None) -> int | None:
        """Where op `name`'s tensor input `index` (passed as `arg`: a keyword, or a position) stands in its op's
        role order (the order of the op's first name listed with roles), so that both sides' inputs of ops ordering
        them differently pair by role; None where the table gives no roles for the name."""
        roles = self.roles.get(name)
        if roles is None:
            return None
        order = self._order[self.merged[name]]
        if arg is not None and arg in order:  # passed by keyword: its name is its role
            return order.index(arg)
        return order.index(roles[index]) if index < len(roles) else None

    @functools.cached_property
    def _order(self) -> dict[str, tuple[str, ...]]:
        """canonical op -> the role order its inputs are ranked by."""
        order: dict[str, tuple[str, ...]] = {}
        for name, roles in self.roles.items():
            order.setdefault(self.merged[name], roles)
        return order

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
            if framework == "inputs":
                continue
            for called in names:
                for table in (by_framework[framework], merged):
                    if table.setdefault(called, op) != op:
                        raise ValueError(f"{name}: {called!r} is listed under both {table[called]!r} and {op!r}")
    roles: dict[str, tuple[str, ...]] = {}
    for op, sides in data["ops"].items():
        given = sides.get("inputs") or {}
        for called, names in given.items():
            if merged.get(called) != op or set(names) != set(next(iter(given.values()))):
                raise ValueError(f"{name}: {op}.inputs: {called!r} is not a name of {op!r}, or its roles differ")
            roles[called] = tuple(names)
    return OpTable(by_framework, merged, roles)


def canonical_op(name: str, framework: str | None = None) -> str:
    """The canonical op of a recorded op name (see OpTable.canonical), from the built-in table."""
    return load_op_table().canonical(name, framework)


def input_role(name: str, index: int, arg: str | None) -> int | None:
    """Where a recorded op's tensor input stands in its op's role order (see OpTable.input_role), from the built-in
    table."""
    return load_op_table().input_role(name, index, arg)
