"""Fused tensors under `--like`: a source module whose name says it fuses parts (`qkv`, `query_key_value`, `kv`,
`gate_up`) and a target that keeps the parts as sibling modules (`query/key/value`, `q_proj/k_proj/v_proj`, `wq/wk/wv`,
`gate_proj/up_proj`) under one parent block, each leaf a 1/n row slice of the fused one.

Target values are a random init, so detection is structural only: name tokens, parts in the fused name's order,
shapes whose row concatenation (axis 0) is the fused shape, and the block indices in both paths. When more than one
target block fits, or two sources want one block, nothing is split and a note says why.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from aligner.mapping.rules import split_name
from aligner.mapping.structural import neutral_leaf

AXIS = 0
# fused module name (matched on its `_`-separated tokens) -> its parts, in the fused rows' order
FUSED = (("query_key_value", ("q", "k", "v")), ("qkv", ("q", "k", "v")), ("gate_up", ("gate", "up")),
         ("kv", ("k", "v")))
PART_TOKENS = {"q": {"q", "query", "wq"}, "k": {"k", "key", "wk"}, "v": {"v", "value", "wv"}, "gate": {"gate"},
               "up": {"up"}}
PART_NAMES = {"q": "query", "k": "key", "v": "value", "gate": "gate", "up": "up"}


@dataclasses.dataclass(frozen=True)
class FusedSplit:
    """One fused source tensor cut into target tensors along `axis`, in order, and why."""

    source: str
    targets: tuple[str, ...]
    axis: int
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "targets": list(self.targets), "axis": self.axis, "why": self.why}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FusedSplit:
        return cls(str(data["source"]), tuple(map(str, data["targets"])), int(data["axis"]), str(data["why"]))


def _tokens(component: str) -> list[str]:
    return [t for t in component.lower().split("_") if t]


def fused_parts(module: str) -> tuple[str, tuple[str, ...]] | None:
    """(fused name, parts in row order) when the module's last path component names a fused projection."""
    last = split_name(module)[1].lower()
    tokens = _tokens(last)
    for fused, parts in FUSED:
        want = fused.split("_")
        if any(tokens[i:i + len(want)] == want for i in range(len(tokens))) or ("w" + fused) in tokens:
            return fused, parts
    return None


def part_of(module: str) -> str | None:
    """The single part ("q", "k", "v", "gate", "up") a module's last component names, else None."""
    tokens = set(_tokens(split_name(module)[1]))
    found = [p for p, names in PART_TOKENS.items() if tokens & names]
    return found[0] if len(found) == 1 and fused_parts(module) is None else None


def _indices(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"(?:^|\.)(\d+)(?=\.|$)", path))


Group = dict[str, tuple[str, tuple[int, ...]]]   # neutral leaf -> (full name, shape)


def _groups(shapes: dict[str, tuple[int, ...]]) -> dict[str, Group]:
    """module -> its leaves."""
    groups: dict[str, Group] = {}
    for name, shape in shapes.items():
        prefix, leaf = split_name(name)
        groups.setdefault(prefix, {})[neutral_leaf(leaf)] = (name, shape)
    return groups


def _layout(group: Group) -> dict[str, tuple[int, ...]]:
    return {leaf: shape for leaf, (_, shape) in group.items()}


def detect(sources: dict[str, tuple[int, ...]], targets: dict[str, tuple[int, ...]]
           ) -> tuple[list[FusedSplit], list[str]]:
    """Split decisions for leftover sources (name -> shape) into free target keys, and notes on what was left unsplit.

    A fused source module is split into the part modules of exactly one target block: every leaf of the source
    (weight, bias, ...) has its 1/n row slice under each part, and the block's indices equal the source's (or it is
    the only block that fits).
    """
    sgroups, tgroups = _groups(sources), _groups(targets)
    blocks: dict[str, dict[str, list[str]]] = {}   # target parent -> part -> part modules
    kept_fused = []                                # (fused name, layout) of fused tensors the target keeps
    for module, group in tgroups.items():
        part = part_of(module)
        if part is not None:
            blocks.setdefault(split_name(module)[0], {}).setdefault(part, []).append(module)
        elif fused_parts(module) is not None:
            kept_fused.append((fused_parts(module), _layout(group)))
    chosen: dict[str, tuple[str, list[str], str, str]] = {}   # source module -> (block, part modules, how, why)
    notes: list[str] = []
    for module, leaves in sgroups.items():
        fused = fused_parts(module)
        if fused is None or (fused, _layout(leaves)) in kept_fused:
            continue  # not fused, or the target keeps a fused tensor of this layout: structural matching places it
        kind, parts = fused
        n = len(parts)
        want = {leaf: (shape[0] // n, *shape[1:]) for leaf, shape in _layout(leaves).items()
                if shape and shape[0] % n == 0}
        if len(want) != len(leaves):
            continue
        fits = []
        for block, by_part in blocks.items():
            found = [by_part.get(p, []) for p in parts]
            if all(len(m) == 1 and _layout(tgroups[m[0]]) == want for m in found):
                fits.append((block, [m[0] for m in found]))
        same = [f for f in fits if _indices(f[0]) == _indices(module)]
        why = f"fused {kind} split into {', '.join(PART_NAMES[p] for p in parts)} (axis {AXIS}): sibling modules of "
        if len(same) == 1:
            chosen[module] = (*same[0], "same block index" if _indices(module) else "same block", why)
        elif len(fits) == 1 and not same:
            chosen[module] = (*fits[0], "the only block that fits", why)
        elif fits:
            options = ", ".join(b for b, _ in (same or fits)[:3])
            notes.append(f"not split: fused {kind} {module} fits {len(same or fits)} target blocks ({options}); "
                         "add a --map split entry")
    taken: dict[str, list[str]] = {}
    for module, (block, *_) in chosen.items():
        taken.setdefault(block, []).append(module)
    splits = []
    for module, (block, mods, how, why) in chosen.items():
        if len(taken[block]) > 1:
            if module == taken[block][0]:
                notes.append(f"not split: fused sources {', '.join(taken[block])} all fit target block {block}; "
                             "add --map split entries")
            continue
        for leaf, (name, _) in sgroups[module].items():
            splits.append(FusedSplit(name, tuple(tgroups[m][leaf][0] for m in mods), AXIS, f"{why}{block}, {how}"))
    return splits, notes
