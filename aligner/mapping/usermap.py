r"""User mapping files (`--map mymap.yaml`): exact and regex renames, drops and tensor transforms.

    rename:   {source.name: target.name}        # or a list of targets (tied weights: one tensor, two names)
    regex:    [[pattern, replacement], ...]     # Python re; first match wins; \1 for groups
    drop:     [pattern, ...]                    # regexes of source names to leave out
    transforms:
      - {op: split, source: qkv.weight, axis: 0, targets: [q.weight, k.weight, v.weight]}
      - {op: concat, sources: [a.weight, b.weight], axis: 0, target: ab.weight}
      - {op: reshape, source: x, shape: [4, 1, 3], target: y}
      - {op: transpose, source: x, perm: [1, 0], target: y}
      # regex forms: `pattern` (`patterns` for concat) instead of `source(s)`, targets with \1 backrefs
      - {op: split, pattern: 'blocks\.(\d+)\.attn\.qkv\.weight', axis: 0,
         targets: ['layer.\1.q.weight', 'layer.\1.k.weight', 'layer.\1.v.weight']}
      - {op: concat, patterns: ['mlp\.(\d+)\.gate\.weight', 'mlp\.(\d+)\.up\.weight'], axis: 0,
         target: 'mlp.\1.gate_up.weight'}

A transform pattern must match a whole source name, and must match at least one (a typo is an error, not a no-op).
A concat's patterns must have the same groups: the names they match are joined per captured groups, each pattern
contributing exactly one name per group. A name a regex transform takes may not be taken by another transform, and
no two transforms may write one target.

User rules override the built-in layer rules for the names they match. `--save-map` writes this same format.
In `align compare --map`, parameter renames also rename their modules (`features.0.conv.weight: stem.conv.weight`
renames module `features.0.conv` to `stem.conv`, and `features.0` to `stem`), unless a module's parameters disagree.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Collection, Iterable

from aligner.core.errors import AlignerError
from aligner.core.files import TEXT, read_text
from aligner.core.nesting import NestingError, yaml_loads
from aligner.io.base import TensorInfo
from aligner.mapping.transforms import Concat, Op, OpKind, Reshape, Split, Transpose

# each section's YAML type, and how a message names it
SECTION_TYPES: dict[str, tuple[type, str]] = {"rename": (dict, "mapping of name: target"), "regex": (list, "list"),
                                              "drop": (list, "list"), "transforms": (list, "list")}
SECTIONS = tuple(SECTION_TYPES)
OPS = {OpKind.SPLIT: ("source", "axis", "targets"), OpKind.CONCAT: ("sources", "axis", "target"),
       OpKind.RESHAPE: ("source", "shape", "target"), OpKind.TRANSPOSE: ("source", "perm", "target")}
PATTERN_KEY = {"source": "pattern", "sources": "patterns"}   # the regex form of each source field
_BACKREF = re.compile(r"\\(\d+)|\\g<([^>]*)>")


@dataclasses.dataclass(frozen=True)
class UserTransform:
    """One `transforms:` item: its op kind, its source names (or patterns), and each target with the op that makes it.

    With `regex`, `sources` are patterns that must match whole names and targets are templates (`\\1`, `\\g<name>`).
    """

    number: int                              # position in the file, for messages
    kind: OpKind
    sources: tuple[str, ...]
    outputs: tuple[tuple[str, Op], ...]      # several only for split: one part per target
    regex: bool = False

    @property
    def label(self) -> str:
        return f"transform #{self.number} ({self.kind})"


@dataclasses.dataclass(frozen=True)
class ResolvedTransform:
    """A transform applied to real source names: the names it consumes and each (target, op) it writes."""

    label: str
    sources: tuple[str, ...]
    outputs: tuple[tuple[str, Op], ...]
    regex: bool = False


@dataclasses.dataclass
class UserMap:
    """A parsed, validated user mapping."""

    path: str = "<none>"
    rename: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    regex: list[tuple[re.Pattern, str]] = dataclasses.field(default_factory=list)
    drop: list[re.Pattern] = dataclasses.field(default_factory=list)
    transforms: list[UserTransform] = dataclasses.field(default_factory=list)
    modules: dict[str, str] = dataclasses.field(default_factory=dict)   # module renames implied by the above

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
        """A parameter name or module path through the user rules (unchanged when none match, None when dropped):
        parameter rules first, then the module renames they imply, for the path or its nearest renamed ancestor."""
        found = self.targets(name)
        if found is not None:
            return found[0] if found else None
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            head = ".".join(parts[:cut])
            if head in self.modules:
                return ".".join([self.modules[head], *parts[cut:]])
        return name

    def hits(self, sources: Collection[str], targets: Collection[str]) -> int:
        """How many of the names this map spells out exactly are in `sources` (as sources) or `targets` (as
        targets): which way round a map fits two checkpoints."""
        literal = [t for t in self.transforms if not t.regex]
        return (sum(s in sources for s in self.rename) + sum(t in targets for ts in self.rename.values() for t in ts)
                + sum(s in sources for t in literal for s in t.sources)
                + sum(target in targets for t in literal for target, _ in t.outputs))

    def reversed(self, shapes: dict[str, TensorInfo]) -> "UserMap":
        """The same map read from its targets back to its sources (a `--save-map` file of A -> B used for B -> A):
        renames inverted (a tied second name dropped), splits as concats and back, reshapes to the source's shape
        (`shapes`: the original sources' infos), transposes by the inverse permutation; drops, which name original
        sources, do not apply. AlignerError for what cannot run backwards: regex rules, a reshaped source `shapes`
        lacks, a concat of unequal parts."""
        if self.regex or any(t.regex for t in self.transforms):
            raise AlignerError(f"{self.path}: its names run the other way (from the second checkpoint's tensors to "
                               "the first's), and regex rules cannot be read backwards: write the map from the "
                               "first checkpoint's names")
        back = UserMap(path=self.path)
        for source, targets in self.rename.items():
            back.rename.setdefault(targets[0], []).append(source)
            back.drop += [re.compile(f"^{re.escape(t)}$") for t in targets[1:]]
        back.transforms = [_reversed(self.path, t, shapes) for t in self.transforms]
        back.modules = module_renames([(s, ts[0]) for s, ts in back.rename.items() if len(set(ts)) == 1]
                                      + [(t.sources[0], t.outputs[0][0]) for t in back.transforms
                                         if len(t.sources) == 1 and len(t.outputs) == 1])
        return back

    def resolve_transforms(self, names: Iterable[str]) -> list[ResolvedTransform]:
        """The transforms applied to these source names (patterns expanded); AlignerError for an unknown source, a
        pattern matching nothing, an incomplete or ambiguous concat group, or a name consumed or produced twice."""
        names = list(names)
        known = set(names)
        resolved: list[ResolvedTransform] = []
        for t in self.transforms:
            if not t.regex:
                unknown = [s for s in t.sources if s not in known]
                if unknown:
                    raise AlignerError(f"{self.path}: transform #{t.number} names unknown source(s) "
                                       f"{', '.join(unknown)}{_closest(unknown[0], names)}")
                resolved.append(ResolvedTransform(t.label, t.sources, t.outputs, regex=False))
            else:
                resolved.extend(self._expand(t, names))
        consumer: dict[str, ResolvedTransform] = {}
        producer: dict[str, tuple[str, str]] = {}
        for r in resolved:
            for s in r.sources:
                other = consumer.get(s)
                if other is not None and (other.regex or r.regex):  # two literal entries may reuse one tensor
                    raise AlignerError(f"{self.path}: {s} is matched by both {other.label} and {r.label} "
                                       "(ambiguous: narrow the pattern)")
                consumer[s] = r
            for target, _ in r.outputs:
                if target in producer:
                    raise AlignerError(f"{self.path}: {r.label} writes {target} from {', '.join(r.sources)}, and "
                                       f"{producer[target][0]} from {producer[target][1]} too (use \\1 groups in "
                                       "the targets)")
                producer[target] = (r.label, ", ".join(r.sources))
        return resolved

    def _expand(self, t: UserTransform, names: list[str]) -> list[ResolvedTransform]:
        """One regex transform over the source names: one resolved transform per match (per group, for concat)."""
        patterns = [re.compile(p) for p in t.sources]
        groups: dict[tuple, list[str | None]] = {}
        for j, pattern in enumerate(patterns):
            hits = [m for m in map(pattern.fullmatch, names) if m is not None]
            if not hits:
                raise AlignerError(f"{self.path}: {t.label}: pattern {pattern.pattern!r} matches no source name"
                                   f" (of {len(names)}){_closest(pattern.pattern, names)}")
            for m in hits:  # a concat joins one match per pattern with the same groups; other ops take each match
                key = m.groups() if t.kind == OpKind.CONCAT else (m.string,)
                slot = groups.setdefault(key, [None] * len(patterns))
                if slot[j] is not None:
                    raise AlignerError(f"{self.path}: {t.label}: pattern {pattern.pattern!r} matches both "
                                       f"{slot[j]} and {m.string} with groups {m.groups()} (ambiguous)")
                slot[j] = m.string
        out = []
        for key, members in groups.items():
            absent = [patterns[j].pattern for j, name in enumerate(members) if name is None]
            if absent:
                have = next(name for name in members if name is not None)
                raise AlignerError(f"{self.path}: {t.label}: pattern {absent[0]!r} has no match with groups {key} "
                                   f"(another pattern matched {have})")
            sources = tuple(name for name in members if name is not None)
            match = patterns[0].fullmatch(sources[0])
            assert match is not None
            out.append(ResolvedTransform(t.label, sources, tuple((match.expand(target), op)
                                                                 for target, op in t.outputs), regex=True))
        return out


def _reversed(path: str, t: UserTransform, shapes: dict[str, TensorInfo]) -> UserTransform:
    """One literal transform run from its targets back to its sources (see UserMap.reversed)."""
    targets = tuple(target for target, _ in t.outputs)
    if t.kind == OpKind.SPLIT:
        op = t.outputs[0][1]
        assert isinstance(op, Split)
        return UserTransform(t.number, OpKind.CONCAT, targets, ((t.sources[0], Concat(op.axis)),))
    if t.kind == OpKind.CONCAT:
        op = t.outputs[0][1]
        assert isinstance(op, Concat)
        sizes = {shapes[s].shape for s in t.sources if s in shapes}
        if len(sizes) != 1 or not all(s in shapes for s in t.sources):
            raise AlignerError(f"{path}: {t.label} joins tensors of unequal or unknown shapes; it cannot be split "
                               "back: write the map from the first checkpoint's names")
        return UserTransform(t.number, OpKind.SPLIT, targets, tuple((s, Split(op.axis, len(t.sources), i))
                                                                  for i, s in enumerate(t.sources)))
    op = t.outputs[0][1]
    source = t.sources[0]
    if isinstance(op, Transpose):
        return UserTransform(t.number, OpKind.TRANSPOSE, targets, ((source, op.inverse()),))
    if source not in shapes:
        raise AlignerError(f"{path}: {t.label} reshapes {source}, which the second checkpoint lacks: it cannot be "
                           "reshaped back")
    return UserTransform(t.number, OpKind.RESHAPE, targets, ((source, Reshape(shapes[source].shape)),))


def module_renames(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Module path renames implied by parameter renames (source, target): the owning modules pair up, and so do
    their parents while both sides' last components agree or two child renames say so; a module whose parameters
    point to different target modules gets no rename."""
    found: dict[str, set[str]] = {}
    children: dict[tuple[str, str], set[str]] = {}
    for src, dst in pairs:
        s, d = src.split(".")[:-1], dst.split(".")[:-1]
        while s and d:
            found.setdefault(".".join(s), set()).add(".".join(d))
            if s[-1] != d[-1]:
                if len(s) > 1 and len(d) > 1:
                    children.setdefault((".".join(s[:-1]), ".".join(d[:-1])), set()).add(".".join(s))
                break
            s, d = s[:-1], d[:-1]
    for (parent, target), kids in children.items():
        if len(kids) > 1:
            found.setdefault(parent, set()).add(target)
    return {m: next(iter(t)) for m, t in found.items() if len(t) == 1}


def read_yaml(path: str) -> Any:
    """A mapping file's YAML data ({} when empty); one clear AlignerError naming the file for an unreadable file,
    text that is not UTF-8 or YAML that does not parse."""
    import yaml  # here, not at import: `align compare` without --map never parses YAML (its start time)

    try:
        text = read_text(path, TEXT)  # a regular file under the cap (a FIFO would block, /dev/zero fill memory)
    except OSError as exc:
        raise AlignerError(f"{path}: cannot read mapping file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AlignerError(f"{path}: mapping file is not UTF-8 text") from None
    try:
        return yaml_loads(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise AlignerError(f"{path}: YAML syntax error{where}: {getattr(exc, 'problem', exc)}") from None
    except NestingError as exc:
        raise AlignerError(f"{path}: mapping file {exc}") from None


def load_user_map(path: str) -> UserMap:
    """Read and validate a mapping file; every problem is one clear AlignerError naming the file."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise AlignerError(f"{path}: expected a mapping with sections {', '.join(SECTIONS)}")
    unknown = set(data) - set(SECTIONS)
    if unknown:
        raise AlignerError(f"{path}: unknown section(s) {', '.join(sorted(map(repr, unknown)))} "
                           f"(expected {', '.join(SECTIONS)})")
    for section, (kind, words) in SECTION_TYPES.items():
        if data.get(section) is not None and not isinstance(data[section], kind):
            raise AlignerError(f"{path}: section {section}: must be a {words}, got {type(data[section]).__name__} "
                               f"{str(data[section])[:60]!r}")
    umap = UserMap(path=path)
    for src, dst in (data.get("rename") or {}).items():
        targets = dst if isinstance(dst, list) else [dst]
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise AlignerError(f"{path}: rename of {src!r} must give a name or a list of names")
        umap.rename[str(src)] = targets
    for item in data.get("regex") or []:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise AlignerError(f"{path}: each regex entry must be [pattern, replacement] (two strings), got "
                               f"{str(item)[:80]!r}")
        umap.regex.append((_compile(path, item[0]), str(item[1])))
    if not all(isinstance(p, str) for p in data.get("drop") or []):
        raise AlignerError(f"{path}: section drop: every entry must be a regex string")
    umap.drop = [_compile(path, p) for p in data.get("drop") or []]
    for i, t in enumerate(data.get("transforms") or [], 1):
        umap.transforms.append(_parse_transform(path, i, t))
    one_to_one = [(t.sources[0], t.outputs[0][0]) for t in umap.transforms
                  if not t.regex and len(t.sources) == 1 and len(t.outputs) == 1]
    umap.modules = module_renames([(s, ts[0]) for s, ts in umap.rename.items() if len(set(ts)) == 1] + one_to_one)
    return umap


def _parse_transform(path: str, i: int, t: Any) -> UserTransform:
    """A `transforms:` item, checked: known op, its fields in literal or regex form, and regex groups that exist."""
    if not isinstance(t, dict) or not isinstance(t.get("op"), str) or t["op"] not in OPS:
        raise AlignerError(f"{path}: transform #{i} needs op one of {', '.join(OPS)}, got {t!r}")
    kind = OpKind(t["op"])
    field = OPS[kind][0]
    regex = PATTERN_KEY[field] in t
    if regex and field in t:
        raise AlignerError(f"{path}: transform #{i} ({kind}) gives both {field} and {PATTERN_KEY[field]}: pick one")
    missing = [k for k in OPS[kind] if k not in t and not (regex and k == field)]
    if missing:
        also = f" (or {PATTERN_KEY[field]})" if field in missing else ""
        raise AlignerError(f"{path}: transform #{i} ({kind}) is missing {', '.join(missing)}{also}")
    try:
        parsed = _transform(i, kind, t, regex)
    except (TypeError, ValueError) as exc:
        raise AlignerError(f"{path}: transform #{i} ({kind}): {exc}") from None
    if regex:
        _check_groups(path, parsed)
    return parsed


def _transform(number: int, kind: OpKind, t: dict[str, Any], regex: bool) -> UserTransform:
    """A `transforms:` item as typed ops (TypeError/ValueError for a malformed axis, shape, perm or name list)."""
    field = OPS[kind][0]
    raw = t[PATTERN_KEY[field] if regex else field]
    if kind == OpKind.CONCAT:
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{PATTERN_KEY[field] if regex else field} must be a non-empty list")
        sources = tuple(str(s) for s in raw)
    else:
        sources = (str(raw),)
    outputs: tuple[tuple[str, Op], ...]
    if kind == OpKind.SPLIT:
        if not isinstance(t["targets"], list) or not t["targets"]:
            raise ValueError("targets must be a non-empty list")
        targets = [str(x) for x in t["targets"]]
        outputs = tuple((x, Split(int(t["axis"]), len(targets), j)) for j, x in enumerate(targets))
    elif kind == OpKind.CONCAT:
        outputs = ((str(t["target"]), Concat(int(t["axis"]))),)
    else:
        op: Op = Reshape(tuple(int(n) for n in t["shape"])) if kind == OpKind.RESHAPE else \
            Transpose(tuple(int(n) for n in t["perm"]))
        outputs = ((str(t["target"]), op),)
    return UserTransform(number, kind, sources, outputs, regex)


def _check_groups(path: str, t: UserTransform) -> None:
    """Regex transforms: valid patterns, the same group count in every pattern, targets naming existing groups."""
    patterns = []
    for p in t.sources:
        try:
            patterns.append(re.compile(p))
        except re.error as exc:
            raise AlignerError(f"{path}: {t.label}: bad regex {p!r}: {exc}") from None
    counts = sorted({p.groups for p in patterns})
    if len(counts) > 1:
        raise AlignerError(f"{path}: {t.label}: the patterns capture different numbers of groups ({counts}); "
                           "each must capture the same groups to be joined")
    for target, _ in t.outputs:
        for number, named in _BACKREF.findall(target):
            ok = int(number) <= patterns[0].groups if number else \
                named in patterns[0].groupindex or (named.isdigit() and int(named) <= patterns[0].groups)
            if not ok:
                ref = f"\\{number}" if number else f"\\g<{named}>"
                raise AlignerError(f"{path}: {t.label}: target {target!r} refers to group {ref}, but the pattern "
                                   f"{patterns[0].pattern!r} has {patterns[0].groups} group(s)")


def _closest(wanted: str, names: list[str]) -> str:
    """A hint naming the nearest source name, for a name or pattern that matched nothing."""
    close = difflib.get_close_matches(wanted.replace("\\", ""), names, n=1, cutoff=0.5)
    return f"; closest: {close[0]}" if close else ""


def _compile(path: str, pattern: Any) -> re.Pattern:
    try:
        return re.compile(str(pattern))
    except re.error as exc:
        raise AlignerError(f"{path}: bad regex {pattern!r}: {exc}") from None
