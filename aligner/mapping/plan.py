"""Build a conversion plan: for every output tensor, its source(s), the ops to apply and why (rule, user, target)."""
from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from typing import Any, Iterator

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.io.base import TensorInfo, TensorSource
from aligner.mapping import fused, structural
from aligner.mapping.fused import FusedSplit
from aligner.mapping.rules import LayerRule, group_names, infer_rule, split_name
from aligner.mapping.transforms import Cast, Op, Reshape, Split, apply_ops, op_from_dict, shape_after
from aligner.mapping.usermap import UserMap


class EntryStatus(str, enum.Enum):
    """What happens to one tensor (a str enum: compares equal to, and serializes as, its value)."""

    UNCHANGED = "unchanged"
    RENAMED = "renamed"
    TRANSFORMED = "transformed"
    CREATED = "created"              # recreated in the target framework (num_batches_tracked as 0)
    DROPPED = "dropped"              # on purpose: no twin in the target framework, tied, or a user drop
    STRUCTURAL = "structural"        # paired with a --like key by module layout
    MISSING = "missing"              # a --like key no source fills
    UNEXPECTED = "unexpected"        # a source with no place in the --like target
    SHAPE_MISMATCH = "shape mismatch"
    AMBIGUOUS = "ambiguous"

    def __str__(self) -> str:
        return self.value


FAILING = (EntryStatus.MISSING, EntryStatus.SHAPE_MISMATCH, EntryStatus.AMBIGUOUS)


@dataclasses.dataclass
class Entry:
    """One row of the plan. `target` None = the source is not written (dropped / unexpected).

    `guessed` marks a layer type read from names and shapes that fit another layer type too (a lone 2-D `weight`:
    a bias-free Linear or an Embedding); `--like` removes the guess.
    """

    target: str | None
    sources: list[str]
    status: EntryStatus
    reason: str = ""
    ops: list[Op] = dataclasses.field(default_factory=list)
    info: TensorInfo | None = None   # output shape/dtype
    guessed: bool = False

    def written_as(self) -> tuple[str, TensorInfo]:
        """(target, output info) of an entry with a target: every such entry knows its output shape and dtype."""
        assert self.target is not None and self.info is not None, f"{self.sources} has no output"
        return self.target, self.info

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "sources": self.sources, "status": self.status.value, "reason": self.reason,
                "ops": [op.to_dict() for op in self.ops], "shape": list(self.info.shape) if self.info else None,
                "dtype": self.info.dtype if self.info else None, "guessed": self.guessed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        """The row `to_dict` gave, back."""
        shape, dtype = data["shape"], data["dtype"]
        return cls(data["target"], [str(s) for s in data["sources"]], EntryStatus(data["status"]), str(data["reason"]),
                   [op_from_dict(op) for op in data["ops"]],
                   None if shape is None else TensorInfo(tuple(int(n) for n in shape), str(dtype)),
                   bool(data["guessed"]))


@dataclasses.dataclass(frozen=True)
class Guess:
    """A module whose layer type was guessed: what it was read as, what else it could be, and why."""

    module: str
    chosen: str
    alternatives: tuple[str, ...]
    why: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"alternatives": list(self.alternatives)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Guess:
        return cls(str(data["module"]), str(data["chosen"]), tuple(map(str, data["alternatives"])), str(data["why"]))


@dataclasses.dataclass
class Plan:
    """All entries, in output order, plus what the user should know."""

    src_framework: str
    dst_framework: str
    entries: list[Entry]
    notes: list[str] = dataclasses.field(default_factory=list)
    guesses: list[Guess] = dataclasses.field(default_factory=list)   # layer types read from names/shapes alone
    splits: list[FusedSplit] = dataclasses.field(default_factory=list)   # fused tensors split to fit --like
    by_position: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (source, target) by position alone

    @property
    def outputs(self) -> list[Entry]:
        return [e for e in self.entries if e.target is not None and e.status not in FAILING]

    @property
    def failures(self) -> list[Entry]:
        return [e for e in self.entries if e.status in FAILING]

    def counts(self) -> Counter:
        return Counter(e.status for e in self.entries)

    def with_status(self, *statuses: EntryStatus) -> list[Entry]:
        return [e for e in self.entries if e.status in statuses]

    def output_infos(self) -> dict[str, TensorInfo]:
        return dict(e.written_as() for e in self.outputs)

    def tensors(self, source: TensorSource) -> Iterator[tuple[str, np.ndarray]]:
        """Stream (target name, array); each source's file pages are dropped once its entry is written."""
        for entry in self.outputs:
            arrays = [source.get(s) for s in entry.sources]
            yield entry.written_as()[0], apply_ops(arrays, entry.ops)
            for a in arrays:
                source.release(a)


def _entry_from_rules(name: str, prefix: str, leaf: str, info: TensorInfo, rule: LayerRule | None, src: str,
                      dst: str) -> Entry:
    """One tensor through its group's layer rule (None: kept as it is)."""
    if rule is None:
        return Entry(name, [name], EntryStatus.UNCHANGED, "no rule applies: same name", info=info)
    if src == Framework.PYTORCH and leaf in rule.pytorch_only:
        return Entry(None, [name], EntryStatus.DROPPED, f"{rule.type}: {leaf} has no MindSpore twin")
    new_leaf = rule.leaf_map(src).get(leaf, leaf)
    new_prefix = prefix
    if dst == Framework.PYTORCH and rule.mindspore_infix and split_name(prefix)[1] == rule.mindspore_infix:
        new_prefix = split_name(prefix)[0]
    ops: list[Op] = []
    pt_leaf = leaf if src == Framework.PYTORCH else new_leaf
    if pt_leaf in rule.reshape:
        reshape = rule.reshape[pt_leaf]
        ops.append(reshape if src == Framework.PYTORCH else reshape.inverse())
    target = f"{new_prefix}.{new_leaf}" if new_prefix else new_leaf
    shape = shape_after([info.shape], ops) if ops else info.shape
    status = EntryStatus.TRANSFORMED if ops else (EntryStatus.RENAMED if target != name else EntryStatus.UNCHANGED)
    return Entry(target, [name], status, f"{rule.type} rule", ops, TensorInfo(shape, info.dtype))


def _user_transforms(user: UserMap, infos: dict[str, TensorInfo]) -> tuple[list[Entry], set[str]]:
    """The entries of the user's `transforms:` (one per target, patterns expanded) with their output shapes checked
    against the sources, and the source names they consume."""
    entries = []
    consumed: set[str] = set()
    for t in user.resolve_transforms(infos):
        shapes = [infos[s].shape for s in t.sources]
        dtype = infos[t.sources[0]].dtype
        consumed.update(t.sources)
        for target, op in t.outputs:
            try:
                shape = shape_after(shapes, [op])
            except AlignerError as exc:
                raise AlignerError(f"{user.path}: {t.label} on {', '.join(t.sources)}: {exc}") from None
            entries.append(Entry(target, list(t.sources), EntryStatus.TRANSFORMED, f"user {t.label}", [op],
                                 TensorInfo(shape, dtype)))
    return entries, consumed


def build_plan(infos: dict[str, TensorInfo], src: str, dst: str, user: UserMap | None = None,
               like: dict[str, TensorInfo] | None = None, tied: dict[str, str] | None = None) -> Plan:
    """Map source names (framework `src`) to framework `dst`: user rules, then layer rules, then the target."""
    user = user or UserMap()
    entries, consumed = _user_transforms(user, infos)
    guesses: list[Guess] = []
    for prefix, leaves in group_names({n: i for n, i in infos.items() if n not in consumed}).items():
        rule = infer_rule(prefix, leaves, src) if src != dst else None
        for leaf, info in leaves.items():
            name = f"{prefix}.{leaf}" if prefix else leaf
            utargets = user.targets(name)
            if utargets is not None:
                if not utargets:
                    entries.append(Entry(None, [name], EntryStatus.DROPPED, "user drop"))
                entries.extend(Entry(t, [name], EntryStatus.RENAMED if t != name else EntryStatus.UNCHANGED,
                                     "user rename", info=info) for t in utargets)
                continue
            entries.append(_entry_from_rules(name, prefix, leaf, info, rule, src, dst))
        if rule is not None and dst == Framework.PYTORCH:
            new_prefix = next((split_name(e.target)[0] for e in entries[::-1] if e.target and e.sources
                               and split_name(e.sources[0])[0] == prefix), prefix)
            for leaf, create in rule.pytorch_only.items():
                target = f"{new_prefix}.{leaf}" if new_prefix else leaf
                entries.append(Entry(target, [], EntryStatus.CREATED,
                                     f"{rule.type}: {leaf} recreated as {create.value}", [create],
                                     TensorInfo(create.shape, create.dtype)))
        guess = _guess(prefix, leaves, rule, src, dst) if like is None and src != dst else None
        if guess is not None:
            guesses.append(guess)
            for entry in entries:
                if entry.sources and split_name(entry.sources[0])[0] == prefix and entry.sources[0] not in consumed:
                    entry.guessed = True
    plan = Plan(src, dst, entries, guesses=guesses)
    if like is not None:
        _reconcile(plan, infos, like, tied or {})
    return plan


def _guess(prefix: str, leaves: dict[str, TensorInfo], rule: LayerRule | None, src: str, dst: str) -> Guess | None:
    """A Guess when this group's leaves and shapes fit more than one layer type whose names differ in `dst`."""
    module = prefix or "<top level>"
    ranks = {leaf: len(info.shape) for leaf, info in leaves.items()}
    chosen = rule.type if rule is not None else None
    if src == Framework.PYTORCH and ranks == {"weight": 2}:
        if chosen == "Embedding":
            return Guess(module, "Embedding (weight -> embedding_table)", ("Linear without bias (keeps weight)",
                         "mindspore.mint.nn.Embedding (keeps weight)"), "a lone 2-D weight; the module name "
                         "looks like an embedding")
        return Guess(module, "Linear without bias (keeps weight)", ("Embedding (MindSpore nn.Embedding and mindcv "
                     "name it embedding_table)",), "a lone 2-D weight; the module name does not say embedding")
    if src == Framework.PYTORCH and ranks == {"weight": 1}:
        prelu = "PReLU (weight -> w)"
        other = "a norm without bias, e.g. LayerNorm(bias=False) or RMSNorm (keeps weight)"
        return Guess(module, prelu if chosen == "PReLU" else other, (other if chosen == "PReLU" else prelu,),
                     "a lone 1-D weight")
    if src == Framework.MINDSPORE and dst == Framework.PYTORCH and chosen is None and "weight" in leaves \
            and len(leaves["weight"].shape) == 4 and leaves["weight"].shape[2] == 1:
        return Guess(module, "Conv2d with kernel height 1 (keeps the 4-D weight)",
                     ("Conv1d/ConvTranspose1d (torch's weight has no unit axis 2)",),
                     "a 4-D weight with a unit axis 2")
    return None


def _fit(entry: Entry, target: str, want: TensorInfo, how: str) -> None:
    """Point an entry at a target key, adding a reshape (unit axes only) or cast where the target needs one."""
    have = entry.written_as()[1]
    entry.target = target
    if have.shape != want.shape:
        if structural.squeeze_shape(have.shape) == structural.squeeze_shape(want.shape):
            entry.ops = entry.ops + [Reshape(want.shape)]
            entry.status, how = EntryStatus.TRANSFORMED, f"{how}; reshaped {list(have.shape)} -> {list(want.shape)}"
        else:
            entry.status = EntryStatus.SHAPE_MISMATCH
            entry.reason = f"{how}; source {list(have.shape)} vs target {list(want.shape)}"
            return
    if have.dtype != want.dtype:
        entry.ops = entry.ops + [Cast(want.dtype)]
        how = f"{how}; cast {have.dtype} -> {want.dtype}"
    entry.info = want
    entry.reason = how


def _split_fused(plan: Plan, by_name: dict[str, Entry], like: dict[str, TensorInfo], claimed: set[str]) -> None:
    """Replace each leftover fused source (qkv, gate_up) that fits one target block's parts by one split entry per
    part; record the split on the plan, and why a fused source was left alone."""
    sources = {n: e.written_as()[1].shape for n, e in by_name.items()
               if len(e.sources) == 1 and e.status != EntryStatus.CREATED}
    splits, notes = fused.detect(sources, {k: v.shape for k, v in like.items() if k not in claimed})
    plan.notes.extend(notes)
    for split in splits:
        entry = by_name.pop(split.source)
        plan.entries.remove(entry)
        have = entry.written_as()[1]
        for i, target in enumerate(split.targets):
            cut = Split(split.axis, len(split.targets), i)
            part = Entry(target, list(entry.sources), EntryStatus.TRANSFORMED, split.why, entry.ops + [cut],
                         TensorInfo(shape_after([have.shape], [cut]), have.dtype))
            _fit(part, target, like[target], split.why)
            plan.entries.append(part)
            claimed.add(target)
        plan.splits.append(dataclasses.replace(split, source=entry.sources[0]))


def _place_by_position(plan: Plan, by_name: dict[str, Entry], like: dict[str, TensorInfo], claimed: set[str],
                       ambiguous: set[str], tied: dict[str, str]) -> None:
    """Fill the target keys still free that are the only unplaced tensor of their shape in a block whose other
    tensors are paired (structural.by_position), and record each such pairing on the plan: it rests on shapes and
    positions alone. Sources tied to another name and names already reported ambiguous are left alone."""
    placed = [(s, e.target) for e in plan.entries if e.target in claimed for s in e.sources]
    origin = {e.sources[0]: key for key, e in by_name.items() if len(e.sources) == 1
              and e.status != EntryStatus.CREATED and e.sources[0] not in tied and key not in ambiguous}
    free = {k: v.shape for k, v in like.items() if k not in claimed and k not in ambiguous}
    shapes = {s: by_name[key].written_as()[1].shape for s, key in origin.items()}
    for source, target, reason in structural.by_position(placed, shapes, free):
        entry = by_name.pop(origin[source])
        entry.status = EntryStatus.STRUCTURAL
        _fit(entry, target, like[target], reason)
        claimed.add(target)
        plan.by_position.append((source, target))
    if plan.by_position:
        shown = ", ".join(f"{s} -> {t}" for s, t in plan.by_position[:3])
        more = len(plan.by_position) - 3
        plan.notes.append(f"{len(plan.by_position)} tensor(s) placed by shape and position alone, each the only "
                          f"unplaced tensor of its shape in a block whose other tensors are paired: {shown}"
                          f"{f' and {more} more' if more > 0 else ''}; check them (--save-map lists them all)")


def _reconcile(plan: Plan, infos: dict[str, TensorInfo], like: dict[str, TensorInfo], tied: dict[str, str]) -> None:
    """Make the plan fill exactly the target's keys: direct hits, then structural matches; report the rest."""
    claimed: set[str] = set()
    leftovers: list[Entry] = []
    for entry in plan.entries:
        if entry.target is None:
            continue
        candidates = [entry.target] + [s for s in entry.sources[:1] if s != entry.target and len(entry.sources) == 1]
        hit = next((c for c in candidates if c in like and c not in claimed), None)
        if hit is None:
            leftovers.append(entry)
            continue
        claimed.add(hit)
        if hit != entry.target:  # e.g. a mint.nn target keeps weight/bias: the original name is right
            entry.ops, entry.info = [], infos[entry.sources[0]]
            entry.status = EntryStatus.UNCHANGED if hit == entry.sources[0] else EntryStatus.RENAMED
        _fit(entry, hit, like[hit], entry.reason or "target key")
    by_name = {e.written_as()[0]: e for e in leftovers}  # created leaves too: a recreated counter follows its module
    _split_fused(plan, by_name, like, claimed)
    free_targets = {k: v for k, v in like.items() if k not in claimed}
    pairs, ambiguous = structural.match({n: e.written_as()[1].shape for n, e in by_name.items()}, free_targets)
    for sname, tname, reason in pairs:
        entry = by_name.pop(sname)
        if entry.status != EntryStatus.CREATED:
            entry.status = EntryStatus.STRUCTURAL
        _fit(entry, tname, like[tname], reason)
        claimed.add(tname)
    _place_by_position(plan, by_name, like, claimed, set(ambiguous) | {c for cs in ambiguous.values() for c in cs},
                       tied)
    for entry in leftovers:
        if entry.target in by_name and entry is by_name[entry.target]:
            src = entry.sources[0] if entry.sources else None
            if entry.status == EntryStatus.CREATED:
                entry.status, entry.reason = EntryStatus.DROPPED, "not in the target"
            elif src in tied:
                entry.status, entry.reason = EntryStatus.DROPPED, f"tied to {tied[src]}"
            else:
                entry.status, entry.reason = EntryStatus.UNEXPECTED, "no place for it in the target"
            entry.target = None
    for key, info in like.items():
        if key in claimed:
            continue
        if key in ambiguous:
            plan.entries.append(Entry(key, [], EntryStatus.AMBIGUOUS, "several sources fit equally: "
                                      + ", ".join(ambiguous[key]) + " (add a --map rename)", info=info))
        else:
            plan.entries.append(Entry(key, [], EntryStatus.MISSING, "no source fits this target key", info=info))
    order = {k: i for i, k in enumerate(like)}
    plan.entries.sort(key=lambda e: order.get(e.target, len(order)) if e.target else len(order))
