"""Pair the records of two sides: by (mapped) module path first, then by content, type and shape in the gaps.

Real migrations do not call the same modules in the same order: a zoo model calls Identity modules the other side
lacks, or reuses one activation cell where the other has one module per call. So, per side, calls that only pass a
tensor through (their outputs are bitwise their inputs or the record before them) are *folded* into their producer
and kept out of the pairing. Records with the same key (kind, module, io, index, step, occurrence; a call's input
keyed by the argument it was passed as, `arg`, instead of its index when both sides record it) on both sides are
matched by name; the name matches that keep execution order (longest increasing subsequence, O(n log n)) anchor the
order; between consecutive anchors, the leftovers are aligned by a weighted sequence alignment whose score needs the
same kind, io and shape and rewards similar content (the recorded statistics), module type and path. A record with
no twin is reported as "only in X" and does not shift the later pairs.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import re
from collections import defaultdict
from typing import Callable, Container, Hashable, Sequence

from msgspec import UNSET

from aligner import io, mapping  # the name planner, loaded only for PyTorch/MindSpore parameter gradients
from aligner.core.frameworks import Framework
from aligner.core.sequences import longest_increasing
from aligner.dumping.manifest import INPUTS, Io, Kind, Record
from aligner.dumping.pair import ops as op_records  # aligner.dump(ops=True) records: see pair/ops.py
from aligner.dumping.read.source import Item, stats_identity
from aligner.metrics.stats import known

Namer = Callable[[Record], "str | None"]  # the name a record is matched under (None: match by order only)
_MAX_DP_CELLS = 250_000
_BAND = 64  # a long gap is aligned within this distance of its diagonal
# Module types that are the same layer under another name in the other framework.
_TYPE_ALIASES = {"dense": "linear", "sequentialcell": "sequential", "celllist": "modulelist", "dropout2d": "dropout",
                 "gelu": "gelu", "softmax": "softmax", "embedding": "embedding", "batchnorm1d": "batchnorm",
                 "batchnorm2d": "batchnorm", "batchnorm3d": "batchnorm", "conv2d": "conv2d", "conv1d": "conv1d"}


class MatchedBy(enum.StrEnum):
    """How a row's two records were paired."""

    NAME = "name"        # by module path (after renames), kind, io, place and occurrence
    CONTENT = "content"  # by the sequence alignment of content and shapes (op records, renamed modules)
    FOLDED = "folded"    # a call that only passes a tensor through, with no twin: not paired


@dataclasses.dataclass(slots=True)  # no __dict__: a streamed compare makes and frees one a row
class Pair:
    """A record of the migrated side `a` and its counterpart on the reference side `b` (either may be missing; the
    JSON's `_a`/`_b` row fields are theirs)."""

    a: Item | None
    b: Item | None
    matched_by: MatchedBy | None = None  # None: a record on one side only

    @property
    def ref(self) -> Item:
        """The item that names the row: the reference side's `b`, else the migrated side's `a`."""
        return self.b if self.b is not None else self.a  # type: ignore[return-value]

    @property
    def elements(self) -> int:
        """Tensor elements stored in files on both sides (what reading the pair costs; 0 for statistics only)."""
        total = 0
        for item in (self.a, self.b):
            if item is not None and item.path is not None:
                try:
                    total += math.prod(item.record.shape or ())
                except TypeError:  # a malformed shape: the pair's row reports it
                    pass
        return total


def namers(first: Sequence[Item], framework_first: str, framework_second: str, second: Sequence[Item],
           rename: Callable[[str], "str | None"] | None = None) -> tuple[Namer, Namer]:
    """The names under which each side's records match the other's.

    The user's renames (`--map`, every record kind: module paths, and full names for parameter gradients) apply to
    the side whose names they carry into the other side's (the one with more such hits; the first on a tie) and win
    over the built-in ones; the other side's records they name keep their names. Parameter-gradient names between
    PyTorch and MindSpore go through the conversion's layer rules (`gamma` <-> `weight`, `embedding_table` <->
    `weight`), always planned from the MindSpore side toward PyTorch's names, so the argument order changes nothing.
    """
    # --- edited for issue 12 (mapping): user renames pick their side by hits and win on both sides ---
    params: dict[str, str] = {}
    ms_first = framework_first == Framework.MINDSPORE
    if {framework_first, framework_second} == {Framework.PYTORCH, Framework.MINDSPORE}:
        ms_items = first if ms_first else second
        params = grad_names({it.record.module: grad_info(it.record) for it in ms_items
                             if it.record.kind == Kind.PARAM_GRAD})

    def renamed(items: Sequence[Item]) -> dict[str, str | None]:
        """{module: new name} for the names of `items` a user rule changes."""
        out: dict[str, str | None] = {}
        for module in dict.fromkeys(it.record.module for it in items):
            new = rename(module) if rename is not None else module
            if new != module:
                out[module] = new
        return out

    by_user: list[dict[str, str | None]] = [{}, {}]
    if rename is not None:  # without a user map there is nothing to pick a side for (100,000 records: 0.1 s)
        by_user = [renamed(first), renamed(second)]
    names = [{it.record.module for it in side} if by_user[1 - i] else set() for i, side in enumerate((first, second))]
    hits = [sum(new in names[1 - i] for new in by_user[i].values()) for i in (0, 1)]
    user_side = 0 if hits[0] >= hits[1] else 1
    claimed = {new for new in by_user[user_side].values() if new is not None}

    def namer(side: int, is_ms: bool) -> Namer:
        mine = by_user[side] if side == user_side else {}
        kept = claimed if side != user_side else set()
        grads = params if is_ms else {}

        def name(record: Record) -> str | None:
            module = record.module
            if module in mine:
                return mine[module]
            if module in kept:
                return module
            return grads.get(module, module) if record.kind == Kind.PARAM_GRAD else module
        return name

    return namer(0, ms_first), namer(1, framework_second == Framework.MINDSPORE)
    # --- end of the issue 12 edit ---


def grad_info(record: Record) -> io.TensorInfo:
    """A parameter gradient's shape and dtype, as the name planner reads them."""
    return io.TensorInfo(tuple(record.shape), record.dtype or "float32")


def grad_names(infos: dict[str, io.TensorInfo]) -> dict[str, str]:
    """MindSpore parameter-gradient names -> PyTorch's, planned by the conversion's layer rules over all of them
    (`gamma` -> `weight`): the names a MindSpore side's parameter gradients match under."""
    plan = mapping.build_plan(infos, Framework.MINDSPORE, Framework.PYTORCH).entries if infos else []
    return {entry.sources[0]: entry.target for entry in plan if entry.target and len(entry.sources) == 1}


def spelling(path: str) -> str:
    """A module path up to case and underscores: the same layer spelled by another zoo (`maxpool` / `max_pool`,
    `downsample` / `down_sample`); `path` itself where that changes nothing (one string where a model has ~10^6)."""
    spelt = path.replace("_", "").lower()
    return path if spelt == path else spelt


def wrapper_prefixes(spelled: list[set[str]]) -> tuple[str, str]:
    """The prefix one side's module paths carry and the other's lack, when it wraps most of that side and stripping
    it pairs more names (DDP's `module.`, MindSpore's `_backbone.`, a user's `net.`): ("", "") when nothing does.
    Without it no record would pair by name, and aligning every record by content costs ~200x more. `spelled`: each
    side's names as `spelling` writes them."""
    best = ("", "", len(spelled[0] & spelled[1]))
    if best[2] >= 0.5 * min(len(spelled[0]), len(spelled[1])):
        return "", ""
    for side in (0, 1):
        mine, other = spelled[side], spelled[1 - side]
        counts: dict[str, int] = defaultdict(int)
        for name in mine:
            parts = name.split(".")
            for depth in range(1, min(len(parts), 4)):
                counts[".".join(parts[:depth]) + "."] += 1
        for prefix, count in sorted(counts.items(), key=lambda kv: -kv[1])[:8]:
            if count < 0.5 * len(mine):
                break
            hits = sum(1 for n in mine if n.startswith(prefix) and n[len(prefix):] in other)
            if hits > best[2]:
                best = (prefix, "", hits) if side == 0 else ("", prefix, hits)
    return best[0], best[1]


def _unwrapped(names: list[str | None], prefix: str) -> list[str | None]:
    """Names with a wrapper prefix (as `spelling` writes it) removed where they carry it."""
    if not prefix:
        return names
    depth = prefix.count(".")  # the prefix's path components, as the original (unspelled) name writes them
    return [n.split(".", depth)[depth] if n is not None and n.count(".") >= depth and
            spelling(n).startswith(prefix) else n for n in names]


def named_inputs(items: Sequence[Item]) -> bool:
    """Whether a side's call inputs carry the argument they were passed as (`arg`: aligner dumps from version 2,
    msprobe dumps)."""
    return any(it.record.arg is not None for it in items if it.record.io == Io.INPUT)


def name_keys(items: Sequence[Item], names: Sequence[str | None], spelled: dict[str, str],
          by_arg: bool = False, seen: dict[tuple, int] | None = None) -> list[Hashable | None]:
    """Name keys in order (`names`: each record's name under its side's namer, `spelled`: its spelling by name); the
    nth call of the same module/io/index gets occurrence n. None when renamed away. With `by_arg` (both sides name
    their inputs), an input is keyed by the argument it was passed as instead of its position: transformers and
    mindone pass a decoder layer's keyword arguments in different orders. `seen`: the occurrences counted before
    these records (a stream paired a window at a time), counted on."""
    seen = {} if seen is None else seen
    keys: list[Hashable | None] = []
    append = keys.append
    for item, module in zip(items, names):
        r = item.record
        if module is None or r.kind == _OP:  # op records never pair by name (pair/ops.py)
            append(None)
            continue
        spelt = spelled.get(module)
        if spelt is None:
            spelt = spelled[module] = spelling(module)
        place = r.arg if by_arg and r.io == _INPUT and r.arg is not None else r.index
        base = (r.kind, spelt, r.io, place, r.step)
        n = seen.get(base, 0)
        seen[base] = n + 1
        append((base, n))
    return keys


MODULE_KINDS = (Kind.FORWARD, Kind.BACKWARD)
# bound once for the loops every record goes through (an enum member's lookup is ~50 ns, more than the test)
_OP, _INPUT, _GRAD = Kind.OP, Io.INPUT, Kind.PARAM_GRAD
_NAME, _CONTENT, _FOLDED = MatchedBy.NAME, MatchedBy.CONTENT, MatchedBy.FOLDED


def _inside_leaves(items: Sequence[Item], names: Sequence[str | None], other: Sequence[Item],
                   other_names: Sequence[str | None], spelled: dict[str, str]) -> set[int]:
    """Records of modules inside a module the other side records as a leaf (a MindSpore Swish cell `act` computing
    `x * self.sigmoid(x)`, where PyTorch's `act` is one SiLU): the internals of a composite, with no twin there. They
    stay out of the pairing by content, which would compare a child's output with the whole composite's."""
    recorded = {spelled.get(n) or spelling(n) for it, n in zip(other, other_names)
                if n is not None and it.record.kind in MODULE_KINDS}
    parents = {p for n in recorded for p in ancestors(n)}
    if not recorded - parents:
        return set()
    return {i for i, (it, n) in enumerate(zip(items, names)) if n is not None and it.record.kind in MODULE_KINDS
            and inside_leaf(spelled.get(n) or spelling(n), recorded, parents)}


def ancestors(spelt: str) -> list[str]:
    """A spelled module path's ancestors, the root "" first ("a.b.c": "", "a", "a.b")."""
    parts = spelt.split(".")
    return [".".join(parts[:k]) for k in range(len(parts))]


def inside_leaf(spelt: str, recorded: set[str], parents: set[str]) -> bool:
    """Whether a module (spelled) sits inside one the other side records as a leaf: an ancestor among the other
    side's `recorded` module names that is none of their `parents` (`_inside_leaves`, one name at a time)."""
    return any(p in recorded and p not in parents for p in ancestors(spelt)[1:])


def _signature(item: Item) -> tuple:
    r = item.record
    return r.kind, r.io, tuple(s for s in r.shape if s != 1)


def _tokens(path: str) -> frozenset[str]:
    return frozenset(t for t in re.split(r"[._]", path.lower()) if t)


def layer_type(record: Record) -> str:
    """A record's module type as both frameworks name it ("dense" and "linear" are "linear"; an op record's op)."""
    if op_records.is_op(record):  # the canonical op (pair/ops.py): Tensor.matmul is ops.BatchMatMul
        return op_records.op_type(record)
    name = record.type.lower()
    return _TYPE_ALIASES.get(name, name)


def same_layer(x: Item, y: Item) -> bool:
    """Whether two paired records look like the same layer: the same module type (up to framework spelling) or the
    same kind, io and shape."""
    return (bool(x.record.type) and layer_type(x.record) == layer_type(y.record)) or _signature(x) == _signature(y)


def _content(x: Record, y: Record) -> float:
    """1 for statistics that agree to float noise, falling to 0 as they part (0 when either has none)."""
    sx, sy = x.stats, y.stats
    if not (sx and sy):
        return 0.0
    worst = 0.0
    for vx, vy in ((sx.l2, sy.l2), (sx.mean, sy.mean), (sx.max, sy.max), (sx.min, sy.min)):
        if vx is None or vy is None or vx is UNSET or vy is UNSET:
            return 0.0
        scale = max(abs(vx), abs(vy), (known(sx.l2) or 0.0) / math.sqrt(max(math.prod(x.shape or [1]), 1)), 1e-30)
        worst = max(worst, abs(vx - vy) / scale)
    return 1.0 if worst < 1e-4 else 0.7 if worst < 1e-2 else 0.3 if worst < 1e-1 else 0.0


def _score(x: Item, y: Item, name_x: str | None, name_y: str | None) -> float:
    """How good a pair two unnamed leftovers make: 0 when they cannot pair (kind, io or shape differ)."""
    if _signature(x) != _signature(y):
        return 0.0
    rx, ry = x.record, y.record
    tx, ty = _tokens(name_x or rx.module), _tokens(name_y or ry.module)
    path = len(tx & ty) / len(tx | ty) if tx or ty else 0.0
    return 1.0 + 3.0 * _content(rx, ry) + 1.0 * (layer_type(rx) == layer_type(ry) and bool(rx.type)) + 1.0 * path


def by_role(gap: list[int], items: Sequence[Item]) -> list[int]:
    """`gap` with each op call's inputs in its op's role order where the op table gives one (`pair/ops.py`
    `input_rank`), so that two sides' inputs of an op that orders them differently align by role."""
    rank = {i: r for i in gap if (r := op_records.input_rank(items[i].record)) is not None}
    if not rank:
        return gap
    out: list[int] = []
    # a run of ranked inputs of one call is sorted by rank; every other record is a run of its own, left in place
    for _, run in itertools.groupby(gap, key=lambda i: ("call", items[i].record.call) if i in rank else ("own", i)):
        out.extend(sorted(run, key=lambda i: rank.get(i, 0)))
    return out


def _align_gap(ga: list[int], gb: list[int], score: Callable[[int, int], float]) -> list[tuple[int, int]]:
    """The order-keeping pairing of two runs of leftovers with the highest total score (unpaired costs nothing);
    a long run is aligned within a band around its diagonal, so the work stays linear in the run's length."""
    if not ga or not gb:
        return []
    n, m = len(ga), len(gb)
    band = None if n * m <= _MAX_DP_CELLS else _BAND + abs(n - m)

    def cells(x: int) -> range:
        if band is None:
            return range(m)
        centre = x * m // n
        return range(max(0, centre - band), min(m, centre + band + 1))

    best: dict[tuple[int, int], float] = {}
    table = [[0.0] * (m + 1) for _ in range(n + 1)] if band is None else None

    def get(x: int, y: int) -> float:
        if x >= n or y >= m:
            return 0.0
        return table[x][y] if table is not None else best.get((x, y), 0.0)

    for x in range(n - 1, -1, -1):
        for y in reversed(cells(x)):
            s = score(ga[x], gb[y])
            value = max(get(x + 1, y), get(x, y + 1), get(x + 1, y + 1) + s if s > 0 else 0.0)
            if table is not None:
                table[x][y] = value
            else:
                best[(x, y)] = value
    out, x, y = [], 0, 0
    while x < n and y < m:
        s = score(ga[x], gb[y])
        here = get(x, y)
        if s > 0 and here == get(x + 1, y + 1) + s:
            out.append((ga[x], gb[y]))
            x, y = x + 1, y + 1
        elif get(x + 1, y) >= get(x, y + 1):
            x += 1
        else:
            y += 1
    return out


def _same(item: Item) -> Hashable | None:
    """What identifies a record's tensor for folding: its content link, up to unit dimensions (a Flatten of
    [1, C, 1, 1] into [1, C] passes the tensor through; the digest, which covers the shape, differs)."""
    r = item.record
    if r.stats and r.shape is not None:
        return "stats", r.dtype, tuple(s for s in r.shape if s != 1), stats_identity(r.stats)
    return item.link


def passthrough(items: Sequence[Item]) -> dict[int, int]:
    """Records of calls that only pass a tensor through: {index: index of the record holding that tensor}.

    A call is a run of consecutive records of one module and kind; it is a pass-through when each of its output
    records holds the same tensor as one of its input records or as the record just before the call, up to unit
    dimensions (same dtype, same statistics, same shape once the 1s are dropped: a Flatten/squeeze of [1, C, 1, 1]).
    Parameter gradients and probes never fold.
    """
    folded: dict[int, int] = {}
    records = [it.record for it in items]
    modules, kinds = [r.module for r in records], [r.kind for r in records]
    same: list[Hashable | None] = [None] * len(items)  # _same of each record, computed when a call needs it
    i, n = 0, len(items)
    while i < n:
        rec = records[i]
        j = i
        while j + 1 < n and modules[j + 1] == modules[i] and kinds[j + 1] == kinds[i]:
            j += 1
        if rec.kind in MODULE_KINDS and i > 0 and i == j:  # one record: an output equal to the one before
            before = records[i - 1].stats
            if rec.io not in INPUTS and not (rec.stats and before and known(rec.stats.l2) != known(before.l2)):
                for k in (i - 1, i):  # (a different L2 norm already tells most records from the one before)
                    if same[k] is None:
                        same[k] = _same(items[k])
                if same[i] is not None and same[i] == same[i - 1]:
                    folded[i] = i - 1
        elif rec.kind in MODULE_KINDS and i > 0:
            for k in range(i - 1, j + 1):
                if same[k] is None:
                    same[k] = _same(items[k])
            sources = {same[k]: k for k in range(i, j + 1) if records[k].io in INPUTS}
            if same[i - 1] is not None:
                sources.setdefault(same[i - 1], i - 1)
            outputs = [k for k in range(i, j + 1) if records[k].io not in INPUTS]
            if outputs and all(same[k] is not None and same[k] in sources for k in outputs):
                for k in range(i, j + 1):
                    folded[k] = sources[same[k]] if k in outputs else i - 1
        i = j + 1
    return folded


def returns_input(items: Sequence[Item], k: int, calls: dict[tuple[int, str, int], list[int]]
                   ) -> tuple[bool, bool] | None:
    """(whether the call of record k hands back one of its own input tensors: its outputs link to what its inputs
    are, an Identity; whether its outputs hold its inputs' numbers: that, or a Dropout in eval, or a layer whose
    weights happen to be an identity); None when the dump has no call ids (version 1)."""
    r = items[k].record
    ks = calls.get((r.step, r.module, r.call)) if r.call is not None else None
    if not ks:
        return None
    ins = [items[j] for j in ks if items[j].record.io in INPUTS]
    outs = [items[j] for j in ks if items[j].record.io not in INPUTS]
    if not ins or not outs:
        return None
    tensors = {it.record.seq for it in ins} | {it.record.same_as for it in ins if it.record.same_as is not None}
    numbers = {_same(it) for it in ins}
    return (all(it.record.same_as in tensors for it in outs), all(_same(it) in numbers for it in outs))


def _by_call(items: Sequence[Item], wanted: set[str]) -> dict[tuple[int, str, int], list[int]]:
    """(step, module, call id) -> the indices of that call's records, for the modules in `wanted`."""
    out: dict[tuple[int, str, int], list[int]] = defaultdict(list)
    for k, it in enumerate(items):
        r = it.record
        if r.module in wanted and r.call is not None and r.kind in MODULE_KINDS:
            out[(r.step, r.module, r.call)].append(k)
    return out


def match(items_a: Sequence[Item], items_b: Sequence[Item], name_a: Namer | None = None,
          name_b: Namer | None = None) -> list[Pair]:
    """All records of both sides as pairs, in the reference side's (`b`) execution order, unmatched and folded ones
    included."""
    names_a: list[str | None] = [name_a(it.record) for it in items_a] if name_a else \
        [it.record.module for it in items_a]
    names_b: list[str | None] = [name_b(it.record) for it in items_b] if name_b else \
        [it.record.module for it in items_b]
    distinct = {*filter(None, names_a), *filter(None, names_b)}
    spelled = dict(zip(distinct, map(spelling, distinct)))  # each distinct name spelled once
    strip_a, strip_b = wrapper_prefixes([set(map(spelled.__getitem__, filter(None, names)))
                                          for names in (names_a, names_b)])
    names_a, names_b = _unwrapped(names_a, strip_a), _unwrapped(names_b, strip_b)
    by_arg = named_inputs(items_a) and named_inputs(items_b)  # else inputs pair by position
    # records kept out of the pairing by content: the internals of a composite the other side records as one leaf,
    # and blocks' statistics (every block of a stack hands back the same shape: only a name tells them apart)
    inner_a = _inside_leaves(items_a, names_a, items_b, names_b, spelled) | \
        {i for i, it in enumerate(items_a) if it.record.kind == Kind.BLOCK}
    inner_b = _inside_leaves(items_b, names_b, items_a, names_a, spelled) | \
        {i for i, it in enumerate(items_b) if it.record.kind == Kind.BLOCK}

    def apart(odd: list[tuple[int, int]]) -> set[tuple[int, int]]:
        calls_a = _by_call(items_a, {items_a[i].record.module for i, _ in odd})
        calls_b = _by_call(items_b, {items_b[j].record.module for _, j in odd})
        return {(i, j) for i, j in odd if parts_ways(returns_input(items_a, i, calls_a),
                                                     returns_input(items_b, j, calls_b))}

    keyed_a = Keyed(items_a, names_a, name_keys(items_a, names_a, spelled, by_arg), passthrough(items_a), inner_a)
    keyed_b = Keyed(items_b, names_b, name_keys(items_b, names_b, spelled, by_arg), passthrough(items_b), inner_b)
    return pair_keyed(keyed_a, keyed_b, apart).rows


def parts_ways(mine: tuple[bool, bool] | None, theirs: tuple[bool, bool] | None) -> bool:
    """Whether two calls paired by name part ways (`returns_input` of each): one hands its input back, the other
    computes other numbers."""
    return mine is not None and theirs is not None and (mine[0] and not theirs[1] or theirs[0] and not mine[1])


@dataclasses.dataclass
class Keyed:
    """One side's records with what pairing reads of each: its name, its name key (`name_keys`), the pass-through calls
    folded away (`passthrough`) and the records kept out of the pairing by content."""

    items: Sequence[Item]
    names: Sequence[str | None]
    keys: list[Hashable | None]
    fold: dict[int, int]
    inner: Container[int]


@dataclasses.dataclass
class Matched:
    """What `pair_keyed` decided: the rows, and how (a stream paired a window at a time checks where it may cut)."""

    rows: list[Pair]
    named: list[tuple[int, int]]       # the pairs by name, by `a`'s order
    anchors: dict[bool, list[tuple[int, int]]]  # per stream (parameter gradients or not): the name pairs that anchor


def pair_keyed(a: Keyed, b: Keyed, apart: Callable[[list[tuple[int, int]]], set[tuple[int, int]]]) -> Matched:
    """`match` once each side's records are keyed: pairs by name, then by content in the gaps between the name pairs
    that keep both sides' order; `apart` picks, of the name pairs where a side folds a pass-through call, those
    whose calls part ways."""
    items_a, items_b, names_a, names_b = a.items, b.items, a.names, b.names
    where_b = {k: i for i, k in enumerate(b.keys) if k is not None}
    # a call that hands back its own input never pairs by name with one that computes other numbers (timm's Swin
    # stage starts with an Identity `downsample` where mindcv's `downsample` merges patches): each folds or pairs by
    # content
    named = [(i, where_b[k]) for i, k in enumerate(a.keys) if k is not None and k in where_b]  # sorted by i
    odd = [(i, j) for i, j in named if i in a.fold or j in b.fold]  # a pass-through on a side: look closer
    if odd:
        away = apart(odd)
        named = [p for p in named if p not in away]
    partner = dict(named)  # record of `a` -> its twin in `b`
    by_content: set[int] = set()  # the records of `a` paired by content (the others by name)
    used_b = set(partner.values())
    anchored: dict[bool, list[tuple[int, int]]] = {}

    def score(ia: int, ib: int) -> float:
        return _score(items_a[ia], items_b[ib], names_a[ia], names_b[ib])

    # Parameter gradients and module records are aligned as two separate streams: where a parameter's hook fires
    # relative to its module's backward records is the framework's choice (MindSpore: parameter gradients, then the
    # cell's grad_output and grad_input together; PyTorch: grad_output, parameter gradients, grad_input), so a
    # parameter-gradient anchor would put a module's grad_output in different gaps on the two sides.
    grads_a = [it.record.kind == _GRAD for it in items_a]
    grads_b = [it.record.kind == _GRAD for it in items_b]
    for stream in (True, False):
        in_a = grads_a if stream else [not g for g in grads_a]
        in_b = grads_b if stream else [not g for g in grads_b]
        if not (any(in_a) and any(in_b)):  # one side has none of this stream: nothing to align
            anchored[stream] = []
            continue
        lis = longest_increasing([(ia, ib) for ia, ib in named if in_a[ia]])
        anchored[stream] = lis
        anchors = [(-1, -1)] + lis + [(len(items_a), len(items_b))]
        for (a0, b0), (a1, b1) in zip(anchors, anchors[1:]):
            if a1 - a0 < 2 or b1 - b0 < 2:  # consecutive anchors on one side: an empty gap
                continue
            gap_a = [i for i in range(a0 + 1, a1) if in_a[i] and i not in partner and i not in a.fold and
                     i not in a.inner]
            gap_b = [j for j in range(b0 + 1, b1) if in_b[j] and j not in used_b and j not in b.fold and
                     j not in b.inner]
            for ia, ib in _align_gap(by_role(gap_a, items_a), by_role(gap_b, items_b), score):
                partner[ia] = ib
                by_content.add(ia)
                used_b.add(ib)
    # rows in the reference's order; a record only in `a` sits right after the row of its predecessor's partner
    after: dict[int, list[Pair]] = defaultdict(list)  # reference row -> the `a`-only rows after it, in `a`'s order
    last = -1  # (-1: before the first reference row)
    for ia, item in enumerate(items_a):
        if ia in partner:
            last = partner[ia]
        else:
            after[last].append(Pair(item, None, _FOLDED if ia in a.fold else None))
    by_b = dict(zip(partner.values(), partner))  # record of `b` -> its twin in `a`
    rows = after.pop(-1, [])
    for ib, item in enumerate(items_b):
        twin = by_b.get(ib)
        if twin is not None:
            rows.append(Pair(items_a[twin], item, _CONTENT if twin in by_content else _NAME))
        else:
            rows.append(Pair(None, item, _FOLDED if ib in b.fold else None))
        if ib in after:
            rows += after[ib]
    return Matched(rows, named, anchored)
