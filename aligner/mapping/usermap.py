"""User mapping files (`--map mymap.yaml`): exact and regex renames, drops and tensor transforms.

    rename:   {source.name: target.name}        # or a list of targets (tied weights: one tensor, two names)
    regex:    [[pattern, replacement], ...]     # Python re; first match wins; \\1 for groups
    drop:     [pattern, ...]                    # regexes of source names to leave out
    transforms:
      - {op: split, source: qkv.weight, axis: 0, targets: [q.weight, k.weight, v.weight]}
      - {op: concat, sources: [a.weight, b.weight], axis: 0, target: ab.weight}
      - {op: reshape, source: x, shape: [4, 1, 3], target: y}
      - {op: transpose, source: x, perm: [1, 0], target: y}

User rules override the built-in layer rules for the names they match. `--save-map` writes this same format.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from aligner.core.errors import AlignerError
from aligner.mapping.transforms import Concat, Op, OpKind, Reshape, Split, Transpose

SECTIONS = ("rename", "regex", "drop", "transforms")
OPS = {OpKind.SPLIT: ("source", "axis", "targets"), OpKind.CONCAT: ("sources", "axis", "target"),
       OpKind.RESHAPE: ("source", "shape", "target"), OpKind.TRANSPOSE: ("source", "perm", "target")}


@dataclasses.dataclass(frozen=True)
class UserTransform:
    """One `transforms:` item: its op kind, its source(s), and each target with the op that makes it."""

    kind: OpKind
    sources: tuple[str, ...]
    outputs: tuple[tuple[str, Op], ...]   # several only for split: one part per target


@dataclasses.dataclass
class UserMap:
    """A parsed, validated user mapping."""

    path: str = "<none>"
    rename: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    regex: list[tuple[re.Pattern, str]] = dataclasses.field(default_factory=list)
    drop: list[re.Pattern] = dataclasses.field(default_factory=list)
    transforms: list[UserTransform] = dataclasses.field(default_factory=list)

    def targets(self, name: str) -> list[str] | None:
        """Target names a user rule gives `name`: [] when dropped, None when no user rule matches."""
        if name in self.rename:
            return self.rename[name]
        if any(p.search(name) for p in self.drop):
            return []
        for pattern, repl in self.regex:
            if pattern.search(name):
                return [pattern.sub(repl, name)]
        return None

    def rename_path(self, name: str) -> str | None:
        """One name through the user rules (unchanged when none match, None when dropped); used for module paths."""
        found = self.targets(name)
        if found is None:
            return name
        return found[0] if found else None

    def transform_sources(self) -> set[str]:
        """Source names the transforms consume (the layer rules leave them alone)."""
        return {s for t in self.transforms for s in t.sources}


def load_user_map(path: str) -> UserMap:
    """Read and validate a mapping file; every problem is one clear AlignerError naming the file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AlignerError(f"{path}: cannot read mapping file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise AlignerError(f"{path}: YAML syntax error{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise AlignerError(f"{path}: expected a mapping with sections {', '.join(SECTIONS)}")
    unknown = set(data) - set(SECTIONS)
    if unknown:
        raise AlignerError(f"{path}: unknown section(s) {', '.join(sorted(map(str, unknown)))} "
                           f"(expected {', '.join(SECTIONS)})")
    umap = UserMap(path=path)
    for src, dst in (data.get("rename") or {}).items():
        targets = dst if isinstance(dst, list) else [dst]
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise AlignerError(f"{path}: rename of {src!r} must give a name or a list of names")
        umap.rename[str(src)] = targets
    for item in data.get("regex") or []:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise AlignerError(f"{path}: each regex entry must be [pattern, replacement], got {item!r}")
        umap.regex.append((_compile(path, item[0]), str(item[1])))
    umap.drop = [_compile(path, p) for p in data.get("drop") or []]
    for i, t in enumerate(data.get("transforms") or [], 1):
        if not isinstance(t, dict) or t.get("op") not in OPS:
            raise AlignerError(f"{path}: transform #{i} needs op one of {', '.join(OPS)}, got {t!r}")
        kind = OpKind(t["op"])
        missing = [k for k in OPS[kind] if k not in t]
        if missing:
            raise AlignerError(f"{path}: transform #{i} ({kind}) is missing {', '.join(missing)}")
        try:
            umap.transforms.append(_transform(kind, t))
        except (TypeError, ValueError) as exc:
            raise AlignerError(f"{path}: transform #{i} ({kind}): {exc}") from None
    return umap


def _transform(kind: OpKind, t: dict[str, Any]) -> UserTransform:
    """A validated `transforms:` item as typed ops (TypeError/ValueError for a malformed axis, shape or perm)."""
    if kind == OpKind.SPLIT:
        targets = [str(x) for x in t["targets"]]
        return UserTransform(kind, (str(t["source"]),),
                             tuple((x, Split(int(t["axis"]), len(targets), j)) for j, x in enumerate(targets)))
    if kind == OpKind.CONCAT:
        return UserTransform(kind, tuple(str(s) for s in t["sources"]), ((str(t["target"]), Concat(int(t["axis"]))),))
    op: Op = Reshape(tuple(int(n) for n in t["shape"])) if kind == OpKind.RESHAPE else \
        Transpose(tuple(int(n) for n in t["perm"]))
    return UserTransform(kind, (str(t["source"]),), ((str(t["target"]), op),))


def _compile(path: str, pattern: Any) -> re.Pattern:
    try:
        return re.compile(str(pattern))
    except re.error as exc:
        raise AlignerError(f"{path}: bad regex {pattern!r}: {exc}") from None
