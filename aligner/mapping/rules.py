"""Built-in layer rules (mappings/torch_mindspore.yaml) and recognising a parameter group's layer type."""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

from aligner.core.frameworks import Framework
from aligner.core.rules import ANY, ListOf, MapOf, OneOf, Opt, load_rules
from aligner.io.base import TensorInfo
from aligner.mapping.transforms import AxisOp, Create, parse_axis_op

RULES_FILE = "torch_mindspore.yaml"      # in the top-level mappings/, shipped inside the wheel as aligner.mappings
FRAMEWORKS = (Framework.PYTORCH, Framework.MINDSPORE)


@dataclasses.dataclass(frozen=True)
class Signature:
    """Which leaves (with ranks) a group must hold for a rule to apply."""

    required: dict[str, int | None]
    optional: dict[str, int | None]
    exact: bool
    name_hint: re.Pattern | None
    same_shape: bool = False               # all present leaves must have one shape (norm weight/bias of any rank)

    @classmethod
    def parse(cls, data: dict[str, Any] | None) -> "Signature | None":
        if data is None:
            return None
        leaves = data["leaves"]
        return cls({k: v for k, v in leaves.items() if not k.endswith("?")},
                   {k[:-1]: v for k, v in leaves.items() if k.endswith("?")},
                   bool(data.get("exact", False)),
                   re.compile(data["name_hint"]) if data.get("name_hint") else None,
                   bool(data.get("same_shape", False)))

    def matches(self, prefix: str, leaves: dict[str, TensorInfo]) -> bool:
        def rank_ok(name: str, rank: int | None) -> bool:
            return rank is None or len(leaves[name].shape) == rank

        if not all(name in leaves and rank_ok(name, rank) for name, rank in self.required.items()):
            return False
        if not all(rank_ok(name, rank) for name, rank in self.optional.items() if name in leaves):
            return False
        if self.exact and not set(leaves) <= set(self.required) | set(self.optional):
            return False
        if self.same_shape and len({leaves[n].shape for n in (*self.required, *self.optional) if n in leaves}) > 1:
            return False
        return self.name_hint is None or bool(self.name_hint.search(prefix))


@dataclasses.dataclass(frozen=True)
class LayerRule:
    """How one layer type's parameters are named and laid out in each framework."""

    type: str
    signatures: dict[str, Signature | None]  # keyed by Framework
    rename: dict[str, str]                 # pytorch leaf -> mindspore leaf
    reshape: dict[str, AxisOp]             # pytorch leaf -> op going pytorch -> mindspore (`.inverse()` back)
    pytorch_only: dict[str, Create]        # leaf -> how to recreate it going to pytorch
    mindspore_infix: str | None
    why: str                               # what the rule cannot tell from names alone

    def leaf_map(self, src: str) -> dict[str, str]:
        """Leaf renames in the direction away from `src`."""
        return dict(self.rename) if src == Framework.PYTORCH else {v: k for k, v in self.rename.items()}


_SIGNATURE = OneOf(None, {"leaves": MapOf(OneOf(int, None)), "exact": Opt(bool), "name_hint": Opt(str),
                          "same_shape": Opt(bool)})
SCHEMA = {"rules": ListOf({
    "type": str, "pytorch": _SIGNATURE, "mindspore": _SIGNATURE, "rename": MapOf(str),
    "reshape": Opt(MapOf({"pytorch_to_mindspore": str})),
    "pytorch_only": Opt(MapOf({"dtype": str, "shape": ListOf(int), "value": ANY})),
    "mindspore_infix": Opt(str), "why": Opt(str)})}


@functools.cache
def load_layer_rules(name: str = RULES_FILE) -> tuple[LayerRule, ...]:
    """The layer rules of a shipped rules file, parsed once (PyYAML is imported only here: reading a dump never
    parses the rules, `align compare`'s start time)."""
    rules = []
    for item in load_rules(name, SCHEMA)["rules"]:
        rules.append(LayerRule(
            type=item["type"],
            signatures={fw: Signature.parse(item.get(fw)) for fw in FRAMEWORKS},
            rename=item.get("rename") or {},
            reshape={leaf: parse_axis_op(spec["pytorch_to_mindspore"])
                     for leaf, spec in (item.get("reshape") or {}).items()},
            pytorch_only={leaf: Create(spec["dtype"], tuple(spec["shape"]), spec["value"])
                          for leaf, spec in (item.get("pytorch_only") or {}).items()},
            mindspore_infix=item.get("mindspore_infix"),
            why=item.get("why", ""),
        ))
    return tuple(rules)


def split_name(name: str) -> tuple[str, str]:
    """('layer1.bn', 'weight') for 'layer1.bn.weight'; ('', 'w') for a top-level 'w', and ('', '.w') for '.w' (a
    leading dot stays in the leaf, so joining the parts back gives the name the reader has)."""
    prefix, _, leaf = name.rpartition(".")
    return (prefix, leaf) if prefix else ("", name)


def group_names(infos: dict[str, TensorInfo]) -> dict[str, dict[str, TensorInfo]]:
    """Parameters grouped by module prefix, groups and leaves in first-seen order."""
    groups: dict[str, dict[str, TensorInfo]] = {}
    for name, info in infos.items():
        prefix, leaf = split_name(name)
        groups.setdefault(prefix, {})[leaf] = info
    return groups


def infer_rule(prefix: str, leaves: dict[str, TensorInfo], framework: str) -> LayerRule | None:
    """The first rule whose `framework`-side signature matches this group, or None (names kept as they are)."""
    for rule in load_layer_rules():
        sig = rule.signatures.get(framework)
        if sig is not None and sig.matches(prefix, leaves):
            return rule
    return None

