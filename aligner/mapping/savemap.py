"""`--save-map`: a conversion plan written back as a user mapping file that reproduces it with `--map`."""
from __future__ import annotations

import re
from typing import Any

import yaml

from aligner.core.atomic import atomic_open
from aligner.mapping.plan import EntryStatus, Plan
from aligner.mapping.transforms import Cast, Concat, OpKind, Split, Transpose


def resolved_map(plan: Plan) -> dict[str, Any]:
    """The plan as a user mapping file (exact renames, drops, transforms) that reproduces it with --map."""
    rename: dict[str, list[str]] = {}
    drop: list[str] = []
    transforms: list[dict[str, Any]] = []
    splits: dict[tuple[str, int, int], dict[int, str]] = {}
    for e in plan.entries:
        ops = [o for o in e.ops if not isinstance(o, Cast)]  # casts come from the target, not from the map
        if e.status in (EntryStatus.DROPPED, EntryStatus.UNEXPECTED) and e.sources:
            drop.append(f"^{re.escape(e.sources[0])}$")
        elif e.target is None or not e.sources or e.status in (EntryStatus.MISSING, EntryStatus.AMBIGUOUS,
                                                                EntryStatus.SHAPE_MISMATCH):
            continue
        elif not ops:
            rename.setdefault(e.sources[0], []).append(e.target)
        elif isinstance(ops[0], Split):
            key = (e.sources[0], ops[0].axis, ops[0].parts)
            splits.setdefault(key, {})[ops[0].index] = e.target
        elif isinstance(ops[0], Concat):
            transforms.append({"op": OpKind.CONCAT.value, "sources": list(e.sources), "axis": ops[0].axis,
                               "target": e.target})
        elif isinstance(ops[0], Transpose) and len(ops) == 1:
            transforms.append({"op": OpKind.TRANSPOSE.value, "source": e.sources[0], "perm": list(ops[0].perm),
                               "target": e.target})
        else:  # unsqueeze/squeeze/reshape chains: the resulting shape says it all
            transforms.append({"op": OpKind.RESHAPE.value, "source": e.sources[0],
                               "shape": list(e.written_as()[1].shape), "target": e.target})
    for (source, axis, parts), targets in splits.items():
        transforms.append({"op": OpKind.SPLIT.value, "source": source, "axis": axis,
                           "targets": [targets[i] for i in range(parts)]})
    return {"rename": {k: v[0] if len(v) == 1 else v for k, v in rename.items()}, "drop": drop,
            "transforms": transforms}


def write_map(plan: Plan, path: str) -> None:
    """Write the resolved mapping for review and reuse (atomic); the renames that rest on shape and position alone
    are listed in its header, to be checked before reuse."""
    header = f"# resolved by align convert: {plan.src_framework} -> {plan.dst_framework}; reuse with --map\n"
    if plan.by_position:
        header += (f"# {len(plan.by_position)} rename(s) below were placed by shape and position alone (each the only "
                   "unplaced tensor of its shape in a block whose other tensors are paired); check them:\n")
        header += "".join(f"#   {source!r} -> {target!r}\n" for source, target in plan.by_position)
    with atomic_open(path, "w") as fh:
        fh.write(header + yaml.safe_dump(resolved_map(plan), sort_keys=False))
