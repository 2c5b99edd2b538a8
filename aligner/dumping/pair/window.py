"""Two record streams paired a window at a time, exactly as `matching.match` pairs the whole lists (issue 32).

Each round pairs what each side has read ahead (`BLOCK` records, doubled up to `LOOKAHEAD` while no cut is found)
with `matching.pair_keyed`, then hands out the rows up to the last point where the whole-list pairing provably splits
in two there: a pair by name that ends a run of one module's records on both sides, that every other pair by name
keeps on its own side of (so the longest order-keeping chain of the whole lists runs through it), after which neither
side holds a record still waiting for a partner by content in the gap it closes. The rest is paired again with the
next records. That resynchronises on a record on one side only, Identity and Dropout calls folded on one side, inputs
passed in another order, and records paired by content (op records, renamed layers) within the window. Where the
records read ahead pair record k with record k by name (`_in_step`), they are handed out as such without it.

What the whole lists decide globally is carried across windows, or checked once known: a name key's occurrence
number counts on over the step (`seen`); a key whose twin was paired in an earlier window, a wrapper prefix that the
whole lists' names would strip, inputs keyed by argument on both sides only once a later record names its argument,
or a composite's internals judged with fewer of the other side's modules than the whole lists hold: `OutOfStepError`,
and the caller reads both dumps whole (a late one after rows were handed out). A pass-through name pair is judged
once its calls' records have passed (held back until then). Parameter-gradient names between PyTorch and MindSpore
are planned over the MindSpore side's gradients once its first step holding some was read whole (`_Grads`); a later
gradient the plan lacks: OutOfStepError.

Memory: the records read ahead (at most `LOOKAHEAD` a side, or the rest of the first step with parameter gradients
on the MindSpore side), the batch of items the stream handed out last (a manifest block's, which its reader holds
anyway), the last `_CONTEXT` passed (folding context), the inputs of the module calls still open, and per step the
occurrence counts of the name keys met outside `_in_step`; what grows with the model, not the records: the distinct
module names of each side.

Speed: a side is filled a batch at a time, and what the rules read of a batch (names, kinds, calls opened and closed,
records alike on both sides, pass-through calls) is taken with a set or a map per field, not a loop per record; the
record-by-record code each replaces is in tests/dumping/pair/test_window_batches.py, which holds them equal.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import enum
import itertools
from operator import attrgetter, eq
from typing import Iterable, Iterator, Sequence

from aligner import io
from aligner.dumping.manifest import INPUTS, Io, Kind, Record
from aligner.dumping.pair.matching import (
    MODULE_KINDS,
    Keyed,
    Matched,
    MatchedBy,
    Pair,
    ancestors,
    grad_info,
    grad_names,
    inside_leaf,
    name_keys,
    pair_keyed,
    parts_ways,
    passthrough,
    returns_input,
    spelling,
    wrapper_prefixes,
)
from aligner.dumping.read.source import Item
from aligner.dumping.read.stream import Stream

BLOCK = 4096             # records of each side paired in a round
LOOKAHEAD = 1 << 15      # records of each side a round may read ahead looking for a cut before giving up
_CONTEXT = 64            # records passed kept to fold a pass-through call at the start of a window
_OPEN_CALLS = 1 << 16    # calls whose inputs are held until their outputs pass (a model's depth is far below this)
_SCAN = 256              # records `_in_step` compares at a time (it stops at the first that differ)
# bound once for the loops records go through (an enum member's lookup costs more than the test that reads it)
_PARAM, _BUFFER, _GRAD, _OP, _BLOCK = Kind.PARAM, Kind.BUFFER, Kind.PARAM_GRAD, Kind.OP, Kind.BLOCK
_INPUT = Io.INPUT
_MODULE_KINDS = frozenset(MODULE_KINDS)
_LEFT_OUT = frozenset((_PARAM, _GRAD))  # kinds `_note` takes no name of
_RECORD, _KIND, _MODULE, _ARG, _IO = (attrgetter(name) for name in ("record", "kind", "module", "arg", "io"))
_NORM, _RUN = attrgetter("stats.l2"), attrgetter("module", "kind")
_PLACE = attrgetter("module", "kind", "io", "step", "index")  # what `_in_step` compares, inputs by position
_CALL_OF = attrgetter("step", "module", "call")


class Why(enum.Enum):
    """Why two streams cannot be paired a window at a time as the whole lists would be."""

    ORDER = "order"                # a record pairs by name with one paired in an earlier window, or a rule of the
    #                                whole lists (wrapper prefix, inputs by argument, a composite's internals) changed
    WINDOW = "window"              # no point within LOOKAHEAD records where both sides' pairing splits
    PARAM_NAMES = "param_names"    # parameter gradients renamed between PyTorch and MindSpore (planned over all)
    PASS_THROUGH = "pass_through"  # a pass-through call's inputs were let go (more than _OPEN_CALLS open)


class OutOfStepError(Exception):
    """The streams cannot be paired a window at a time: read them whole."""

    def __init__(self, why: Why) -> None:
        super().__init__(why.value)
        self.why = why


_CallKey = tuple[int, str, int]


@dataclasses.dataclass
class _Side:
    """One side's stream, what it read ahead, and what pairing needs of the records already paired."""

    it: Iterator[list[Item]]  # the stream's items, in batches
    ahead: list[Item] = dataclasses.field(default_factory=list)  # read, not yet paired
    batch: list[Item] = dataclasses.field(default_factory=list)  # the batch read last, from `at` not yet ahead
    at: int = 0
    tail: list[Item] = dataclasses.field(default_factory=list)   # the last records paired (folding context)
    open_calls: collections.OrderedDict[_CallKey, list[Item]] = dataclasses.field(
        default_factory=collections.OrderedDict)
    dropped: bool = False  # an open call's inputs were let go (more than _OPEN_CALLS open)
    done: bool = False
    seen: dict[tuple, int] = dataclasses.field(default_factory=dict)  # name_keys' occurrence counts, paired records
    names: set[str] = dataclasses.field(default_factory=set)     # every module name read, spelled (but gradients')
    grads: set[str] = dataclasses.field(default_factory=set)     # the parameter gradients' names read
    met: set[str] = dataclasses.field(default_factory=set)       # `names` and `modules` as read, not spelled
    met_modules: set[str] = dataclasses.field(default_factory=set)
    modules: set[str] = dataclasses.field(default_factory=set)   # module records' names read, spelled
    parents: set[str] = dataclasses.field(default_factory=set)   # their ancestors
    # `names`, `met_modules` and `modules` are `met` itself while every name read is a module record's and spells as
    # itself (a model's usual names): one set where four would each hold every name (`_note`, `_split`)
    named_inputs: bool = False  # an input read names its argument (`matching.named_inputs`)
    buffers: bool = False  # a buffer record was read (a BatchNorm in training mode)
    inner: dict[str, bool] = dataclasses.field(default_factory=dict)  # inside_leaf of names left to content pairing
    low: int | None = None  # the earliest step whose occurrence counts `seen` holds

    def __post_init__(self) -> None:
        self.names = self.met_modules = self.modules = self.met

    def fill(self, n: int, spelled: dict[str, str]) -> None:
        """Read records until `n` are ahead (parameter values, which compare does not pair, left out), noting the
        names the whole-list rules read."""
        while not self.done and len(self.ahead) < n:
            if self.at == len(self.batch):
                batch = next(self.it, None)
                if batch is None:
                    self.done = True
                self.batch, self.at = batch or [], 0
                continue
            taken = self.batch[self.at:self.at + n - len(self.ahead)]
            self.at += len(taken)
            self._note(taken, spelled)

    def _note(self, taken: list[Item], spelled: dict[str, str]) -> None:
        """Put records read ahead (parameter values left out) and note what the whole-list rules read of them, a set
        of each field at a time."""
        records = list(map(_RECORD, taken))
        kinds = set(map(_KIND, records))
        if _PARAM in kinds:
            taken = [it for it, r in zip(taken, records) if r.kind != _PARAM]
            records = list(map(_RECORD, taken))
        if _BUFFER in kinds:
            self.buffers = True
        self.ahead += taken
        if _GRAD in kinds:  # (named once they are planned: _check_whole)
            self.grads.update(r.module for r in records if r.kind == _GRAD)
            records = [r for r in records if r.kind != _GRAD]
        modules = set(map(_MODULE, records))
        new = modules - self.met
        if self.names is self.met and new and not (
                (kinds - _LEFT_OUT) <= _MODULE_KINDS and all([self._spelt(m, spelled) == m for m in new])):
            self._split()
        if self.names is self.met:  # (one set: `names`, `met_modules` and `modules` are `met`)
            self.met |= new
            self._add_parents(new)
        else:
            spelt_new: dict[str, str] = {}  # (each name spelled once here: a look-up in `spelled` is a cache miss)
            if new:
                self.met |= new
                spelt_new = {m: self._spelt(m, spelled) for m in new}
                self.names.update(spelt_new.values())
            if not kinds <= _MODULE_KINDS:
                modules = {r.module for r in records if r.kind in _MODULE_KINDS}
            new = modules - self.met_modules
            if new:
                self.met_modules |= new
                spelt = [spelt_new[m] if m in spelt_new else self._spelt(m, spelled) for m in new]
                self.modules.update(spelt)
                self._add_parents(spelt)
        if not self.named_inputs and set(map(_ARG, records)) != {None}:
            self.named_inputs = any(r.arg is not None and r.io == _INPUT for r in records)

    def _add_parents(self, spelt: Iterable[str]) -> None:
        """Note the ancestors of module names (spelled): `parents` holds each name's whole chain, so one parent
        there means all are."""
        parents = self.parents
        for name in spelt:
            if name.rpartition(".")[0] not in parents:
                parents.update(ancestors(name))

    def _split(self) -> None:
        """Give `names`, `met_modules` and `modules` sets of their own: a name read that is no module record's, or
        that spells otherwise."""
        self.names, self.met_modules, self.modules = set(self.met), set(self.met), set(self.met)

    @staticmethod
    def _spelt(module: str, spelled: dict[str, str]) -> str:
        spelt = spelled.get(module)
        if spelt is None:
            spelt = spelled[module] = spelling(module)
        return spelt


class Resync:
    """The rows `matching.match` makes of the two whole streams (names as `namers` gives them without a --map), in
    blocks, in the reference's order, as it is iterated; OutOfStepError where that cannot be done a window at a time
    (see the module docstring). `mindspore`: which side is MindSpore's when the other is PyTorch's (0 `migrated`, 1
    `reference`; None when not: parameter gradients keep their names); `lookahead`: LOOKAHEAD when None.
    """

    def __init__(self, migrated: Iterable[Item], reference: Iterable[Item], mindspore: int | None = None,
                 block: int = BLOCK, lookahead: int | None = None) -> None:
        self.a, self.b = _Side(_batches(migrated)), _Side(_batches(reference))
        self.mindspore, self.block, self.lookahead = mindspore, block, lookahead

    @property
    def reference_buffers(self) -> bool:
        """Whether the reference's records read so far (a block's worth past the rows handed out) hold a buffer
        record: what `read_pair` sets the training-mode tolerance floor by, over the whole dump."""
        return self.b.buffers

    def __iter__(self) -> Iterator[list[Pair]]:
        return _rounds(self.a, self.b, self.mindspore, self.block, self.lookahead or LOOKAHEAD)


def _batches(items: Iterable[Item]) -> Iterator[list[Item]]:
    """A stream's items in its batches (`Stream.batches`), other items in lists of BLOCK."""
    if isinstance(items, Stream):
        return items.batches()
    it = iter(items)
    return iter(lambda: list(itertools.islice(it, BLOCK)), [])


@dataclasses.dataclass
class _Grads:
    """The MindSpore side's parameter-gradient names (`matching.grad_names`), planned over the gradients read ahead
    once the first step that has some was read whole; each later gradient must be one of those, of the same shape
    and dtype, so that the plan over the whole dump is this one."""

    infos: dict[str, io.TensorInfo] | None = None
    names: dict[str, str] = dataclasses.field(default_factory=dict)

    def plan(self, side: _Side, spelled: dict[str, str], most: int) -> None:
        """Plan once the side's first gradients are read, reading on to the end of their step (at most `most`
        records ahead: PARAM_NAMES past that); PARAM_NAMES for a gradient read that the plan does not hold."""
        if self.infos is None:
            if not side.grads:  # none read so far
                return
            first = next((it.record.step for it in side.ahead if it.record.kind == _GRAD), None)
            if first is None:
                return
            while not side.done and side.ahead[-1].record.step == first:
                if len(side.ahead) >= most:
                    raise OutOfStepError(Why.PARAM_NAMES)
                side.fill(len(side.ahead) + 1, spelled)
            self.infos = {it.record.module: grad_info(it.record) for it in side.ahead
                          if it.record.kind == _GRAD}
            self.names = grad_names(self.infos)
        for it in side.ahead:
            if it.record.kind == _GRAD and self.infos.get(it.record.module) != grad_info(it.record):
                raise OutOfStepError(Why.PARAM_NAMES)


def _rounds(a: _Side, b: _Side, mindspore: int | None, block: int, most: int) -> Iterator[list[Pair]]:
    spelled: dict[str, str] = {}
    by_arg: bool | None = None
    grads = _Grads()
    uneven: set[tuple] = set()  # name key bases counted more often on one side than on the other (`seen`)
    size = block
    while True:
        a.fill(size, spelled)
        b.fill(size, spelled)
        if not a.ahead and not b.ahead:
            break
        if mindspore is not None:
            grads.plan((a, b)[mindspore], spelled, most)
        now = a.named_inputs and b.named_inputs
        if by_arg is None:
            by_arg = now
        elif now != by_arg:  # the rounds before keyed inputs by position
            raise OutOfStepError(Why.ORDER)
        k = 0 if grads.names else _in_step(a, b, by_arg, {base[1] for base in uneven}, spelled)
        if k:
            yield _pass_in_step(a, b, k)
            size = block
            continue
        window = _Window(a, b, by_arg, spelled, grads.names if mindspore == 0 else {},
                         grads.names if mindspore == 1 else {})
        cut = window.cut()
        if cut is None:
            if size >= most:
                raise OutOfStepError(Why.WINDOW)
            size = min(2 * size, most)
            continue
        yield window.commit(*cut, uneven)
        size = block
    _check_whole(a, b, [grads.names if mindspore == side else {} for side in (0, 1)])


def _check_whole(a: _Side, b: _Side, renamed: list[dict[str, str]]) -> None:
    """OutOfStepError where a rule `match` applies to the whole lists decides otherwise than the rounds did: a wrapper
    prefix to strip, or a name left to content pairing that the other side's full module list puts inside a leaf.
    `renamed`: each side's parameter-gradient names."""
    names = [side.names | {spelling(grads.get(m, m)) for m in side.grads} for side, grads in zip((a, b), renamed)]
    if wrapper_prefixes(names) != ("", ""):
        raise OutOfStepError(Why.ORDER)
    for side, other in ((a, b), (b, a)):
        if any(inside_leaf(name, other.modules, other.parents) != inner for name, inner in side.inner.items()):
            raise OutOfStepError(Why.ORDER)


class _Window:
    """One round: both sides' records read ahead, paired as `match` pairs them, and where that may be cut."""

    def __init__(self, a: _Side, b: _Side, by_arg: bool, spelled: dict[str, str], grads_a: dict[str, str],
                 grads_b: dict[str, str]) -> None:
        self.a, self.b, self.spelled = a, b, spelled
        self.keyed_a = self._keyed(a, b, by_arg, grads_a)
        self.keyed_b = self._keyed(b, a, by_arg, grads_b)
        self.held: list[tuple[int, int]] = []  # pass-through name pairs whose calls have not all passed yet
        self.matched: Matched = pair_keyed(self.keyed_a, self.keyed_b, self._apart)
        self.unnamed = [_unnamed(keyed, {p[side] for p in self.matched.named})  # not paired by name, not folded
                        for side, keyed in enumerate((self.keyed_a, self.keyed_b))]

    def _keyed(self, side: _Side, other: _Side, by_arg: bool, grads: dict[str, str]) -> Keyed:
        """A side's records read ahead keyed as `match` keys them (`grads`: its parameter gradients' names)."""
        items = side.ahead
        names = [grads.get(r.module, r.module) if grads and r.kind == _GRAD else r.module
                 for r in (it.record for it in items)]
        keys = name_keys(items, names, self.spelled, by_arg, dict(side.seen))
        theirs = other.seen
        for key in keys:  # a twin paired in an earlier round: the whole lists pair across the cut made there
            if key is not None and key[1] < theirs.get(key[0], 0):  # type: ignore[index]
                raise OutOfStepError(Why.ORDER)
        return Keyed(items, names, keys, _folded(side, len(items)), _Inner(items, self.spelled, other))

    def _apart(self, odd: list[tuple[int, int]]) -> set[tuple[int, int]]:
        """`match`'s look at the name pairs where a side folds a pass-through call, from each call's records (held
        inputs and those read ahead); a pair whose calls may still have records to come is held back."""
        calls = [_calls(self.a), _calls(self.b)]
        out = set()
        for i, j in odd:
            x, y = _returns(self.a, i, calls[0]), _returns(self.b, j, calls[1])
            if x is _OPEN or y is _OPEN:
                self.held.append((i, j))
            elif parts_ways(x, y):  # type: ignore[arg-type]
                out.add((i, j))
        return out

    def cut(self) -> tuple[int, int] | None:
        """(records of `a`, records of `b`) to hand out: the last cut where the whole-list pairing provably splits
        (module docstring), all of both when both streams ended; None when there is none."""
        a, b, m = self.a, self.b, self.matched
        na, nb = len(a.ahead), len(b.ahead)
        if a.done and b.done and not self.held:
            return na, nb
        limit_a = min((i for i, _ in self.held), default=na)
        limit_b = min((j for _, j in self.held), default=nb)
        loose = [{s: [n for n in self.unnamed[side] if n not in keyed.inner and
                      (keyed.items[n].record.kind == _GRAD) == s] for s in (True, False)}
                 for side, keyed in enumerate((self.keyed_a, self.keyed_b))]
        named = m.named
        most, top = [], -1  # the largest `b` index of the name pairs up to each
        for _, j in named:
            top = max(top, j)
            most.append(top)
        later = nb  # the smallest `b` index of the name pairs after the one looked at
        for t in range(len(named) - 1, -1, -1):
            i, j = named[t]
            ok = i < limit_a and j < limit_b and most[t] == j and later > j
            later = min(later, j)
            if ok and _ends_run(a, i) and _ends_run(b, j) and \
                    all(_closed(m.anchors[s], loose[0][s], loose[1][s], i + 1, j + 1) for s in (True, False)):
                return i + 1, j + 1
        return None

    def commit(self, ka: int, kb: int, uneven: set[tuple]) -> list[Pair]:
        """Hand out the rows of the first `ka` and `kb` records of each side and move both streams on past them;
        `uneven` kept the name key bases whose counts differ between the sides."""
        rows = self.matched.rows
        if ka < len(self.a.ahead) or kb < len(self.b.ahead):  # the rows up to the reference's last record handed out
            end = self.b.ahead[kb - 1]
            rows = rows[:next(n for n, p in enumerate(rows) if p.b is end) + 1]
        paired = sum(1 for p in rows if p.a is not None and p.b is not None)
        if len(rows) != ka + kb - paired:  # never hand out a row the cut does not hold whole
            raise OutOfStepError(Why.WINDOW)
        for side, keyed, k, unnamed in ((self.a, self.keyed_a, ka, self.unnamed[0]),
                                        (self.b, self.keyed_b, kb, self.unnamed[1])):
            for key in keyed.keys[:k]:
                if key is not None:
                    side.seen[key[0]] = key[1] + 1  # type: ignore[index]
            for n in unnamed[:bisect.bisect_left(unnamed, k)]:  # left to content pairing: inside a leaf or not
                r = keyed.items[n].record
                if r.kind in MODULE_KINDS and \
                        side.inner.setdefault(self.spelled[r.module], n in keyed.inner) != (n in keyed.inner):
                    raise OutOfStepError(Why.ORDER)
        for keys in (self.keyed_a.keys[:ka], self.keyed_b.keys[:kb]):
            for key in keys:
                if key is not None:
                    base = key[0]  # type: ignore[index]
                    if self.a.seen.get(base, 0) != self.b.seen.get(base, 0):
                        uneven.add(base)
                    else:
                        uneven.discard(base)
        _passed(self.a, ka)
        _passed(self.b, kb)
        _forget_steps(self.a, self.b, uneven)
        return rows


def _passed(side: _Side, k: int) -> None:
    """Move a side on past its first k records read ahead: the calls they open and close, the folding context."""
    block = side.ahead[:k]
    records = list(map(_RECORD, block))
    ios = set(map(_IO, records))
    if not ios.isdisjoint(INPUTS):
        _note_calls(side, block)
    if side.open_calls and not ios <= INPUTS:
        _close_calls(side, records)
    side.tail = block[-_CONTEXT:] if k >= _CONTEXT else (side.tail + block)[-_CONTEXT:]
    del side.ahead[:k]


def _in_step(a: _Side, b: _Side, by_arg: bool, uneven: set[str], spelled: dict[str, str]) -> int:
    """How many records of both sides to hand out as record k with record k, by name, where that provably is the
    whole-list pairing (0: pair the round as `match` does): the same module, kind, io, place and step, a name none
    of whose keys was counted more often on one side (`uneven`: occurrence numbers that agree), no op record, up to
    the last point where both sides end a run, and no pass-through call there that `match` would look closer at and
    part or hold back. Counts are not taken: both sides' stay equal for these keys (what `name_keys` compares)."""
    xs, ys = a.ahead, b.ahead
    k = _alike(xs, ys, by_arg, uneven, spelled)
    while k and not (_ends_run(a, k - 1) and _ends_run(b, k - 1) and (k < len(xs) or k < len(ys) or
                                                                     a.done and b.done)):
        k -= 1
    if not k:
        return 0
    folds = [set(_folded(side, k)) for side in (a, b)]
    odd = sorted(folds[0] | folds[1])
    if odd:
        calls = [_calls(a), _calls(b)]
        for i in odd:
            mine, theirs = _returns(a, i, calls[0]), _returns(b, i, calls[1])
            if mine is _OPEN or theirs is _OPEN or parts_ways(mine, theirs):  # type: ignore[arg-type]
                return 0
    return k


def _alike(xs: list[Item], ys: list[Item], by_arg: bool, uneven: set[str], spelled: dict[str, str]) -> int:
    """How many records of `xs` and `ys`, from the first, are record for record alike as `_in_step` reads them, in
    pieces of _SCAN (each piece's fields taken at once)."""
    n = min(len(xs), len(ys))
    for start in range(0, n, _SCAN):
        end = min(start + _SCAN, n)
        px, py = [it.record for it in xs[start:end]], [it.record for it in ys[start:end]]
        kx, ky = _places(px, by_arg), _places(py, by_arg)
        end = len(kx) if kx == ky else list(map(eq, kx, ky)).index(False)
        if _OP in set(map(_KIND, px[:end])):
            end = list(map(_KIND, px)).index(_OP)
        if uneven:
            end = next((i for i, r in enumerate(px[:end]) if spelled.get(r.module) in uneven), end)
        if end < len(kx):
            return start + end
    return n


def _places(records: list[Record], by_arg: bool) -> list[tuple]:
    """What `_in_step` compares of each record: module, kind, io, step and place (an input by its argument when
    `by_arg` and it names one, else by its index)."""
    if not by_arg or set(map(_ARG, records)) == {None}:
        return list(map(_PLACE, records))
    return [(r.module, r.kind, r.io, r.step, r.arg if r.io == _INPUT and r.arg is not None else r.index)
            for r in records]


def _folded(side: _Side, k: int) -> dict[int, int]:
    """`passthrough` of the first k records read ahead after the folding context (`tail`): {index: index of the
    record holding its tensor} of those ahead that fold, in `ahead`'s indices. Where no two records in a row are
    one call's and each has an L2 norm, a call (one record) can only fold into the record before it, and only where
    their norms are equal (passthrough's test of a call of one record): those pairs alone are looked at."""
    ahead = side.ahead[:k]
    items = [side.tail[-1], *ahead] if side.tail else ahead
    records = list(map(_RECORD, items))
    modules = list(map(_MODULE, records))
    if not any(map(eq, modules, modules[1:])) or not any(map(eq, runs := list(map(_RUN, records)), runs[1:])):
        try:
            norms = list(map(_NORM, records))
        except AttributeError:  # a record without statistics
            norms = []
        if norms and set(map(type, norms)) == {float}:
            o = len(items) - len(ahead)  # 1 with a tail record before the first one ahead
            return {n - o: n - 1 - o for n in itertools.compress(range(1, len(items)), map(eq, norms, norms[1:]))
                    if passthrough(items[n - 1:n + 1])}
    c = len(side.tail)
    return {i - c: j - c for i, j in passthrough(side.tail + ahead).items() if i >= c}


def _pass_in_step(a: _Side, b: _Side, k: int) -> list[Pair]:
    """The rows of the first k records of both sides, record with record (`_in_step`), and both sides moved on."""
    rows = list(map(Pair, a.ahead[:k], b.ahead[:k], itertools.repeat(MatchedBy.NAME, k)))
    _passed(a, k)
    _passed(b, k)
    return rows


_OPEN = object()  # a call whose records have not all been read


def _calls(side: _Side) -> dict[_CallKey, list[int]]:
    """(step, module, call id) -> the indices of that call's module records read ahead."""
    out: dict[_CallKey, list[int]] = collections.defaultdict(list)
    for k, it in enumerate(side.ahead):
        r = it.record
        if r.call is not None and r.kind in MODULE_KINDS:
            out[(r.step, r.module, r.call)].append(k)
    return out


def _returns(side: _Side, k: int, calls: dict[_CallKey, list[int]]) -> object:
    """`returns_input` of record k's call: its inputs held since they passed and its records read ahead; _OPEN when
    its outputs may go on past what was read."""
    r = side.ahead[k].record
    if r.call is None:
        return None
    key = (r.step, r.module, r.call)
    ins = side.open_calls.get(key, [])
    mine = calls.get(key, [])
    if not ins and side.dropped and all(side.ahead[n].record.io not in INPUTS for n in mine):  # let go?
        raise OutOfStepError(Why.PASS_THROUGH)
    outs = [n for n in mine if side.ahead[n].record.io not in INPUTS]
    if not side.done and (not outs or outs[-1] + 1 >= len(side.ahead)):
        return _OPEN
    listed = list(ins) + [side.ahead[n] for n in mine]
    at = len(ins) + mine.index(k)
    return returns_input(listed, at, {key: list(range(len(listed)))})


def _run_key(item: Item) -> tuple[str, Kind]:
    return item.record.module, item.record.kind


def _ends_run(side: _Side, k: int) -> bool:
    """Whether record k ends a run of one module's records (`passthrough`'s calls): the next one read starts another,
    or the stream ended after it."""
    items = side.ahead
    if k + 1 == len(items):
        return side.done
    return _run_key(items[k + 1]) != _run_key(items[k])


def _unnamed(keyed: Keyed, named: set[int]) -> list[int]:
    """The records with no twin by name that are not folded away, in order."""
    return [n for n in range(len(keyed.items)) if n not in named and n not in keyed.fold]


class _Inner:
    """`match`'s records kept out of the pairing by content (blocks' statistics, and modules inside one the other
    side records as a leaf, of the other side's modules read so far), tested when asked."""

    def __init__(self, items: list[Item], spelled: dict[str, str], other: _Side) -> None:
        self.items, self.spelled, self.other = items, spelled, other

    def __contains__(self, k: object) -> bool:
        r = self.items[k].record  # type: ignore[call-overload]
        return r.kind == _BLOCK or r.kind in MODULE_KINDS and \
            inside_leaf(self.spelled[r.module], self.other.modules, self.other.parents)


def _closed(anchors: list[tuple[int, int]], loose_a: list[int], loose_b: list[int], ka: int, kb: int) -> bool:
    """Whether cutting after ka and kb records leaves no record of this stream waiting for a partner by content
    after the last anchor before the cut (the whole lists' gap would reach past it): `loose_*` those records."""
    t = bisect.bisect_left(anchors, (ka, -1)) - 1
    last_a, last_b = anchors[t] if t >= 0 else (-1, -1)
    t_a, t_b = bisect.bisect_left(loose_a, ka) - 1, bisect.bisect_left(loose_b, kb) - 1
    return (loose_a[t_a] if t_a >= 0 else -1) < last_a + 1 and (loose_b[t_b] if t_b >= 0 else -1) < last_b + 1


def _note_calls(side: _Side, block: Sequence[Item]) -> None:
    """Keep the inputs of each module call until its outputs have passed (what `returns_input` reads)."""
    calls = side.open_calls
    for it in block:
        r = it.record
        if r.call is None or r.kind not in MODULE_KINDS:
            continue
        if r.io in INPUTS:
            calls.setdefault((r.step, r.module, r.call), []).append(it)
            if len(calls) > _OPEN_CALLS:
                calls.popitem(last=False)
                side.dropped = True


def _close_calls(side: _Side, records: Sequence[Record]) -> None:
    """Let go of the inputs of the calls whose outputs these records held (a call's outputs are one run)."""
    calls = side.open_calls
    if len(calls) < len(records):  # each open call looked up among the block's outputs
        outs = {_CALL_OF(r) for r in records if r.call is not None and r.io not in INPUTS}
        for key in [key for key in calls if key in outs]:
            del calls[key]
        return
    for r in records:
        if r.call is not None and r.io not in INPUTS:
            calls.pop((r.step, r.module, r.call), None)


def _forget_steps(a: _Side, b: _Side, uneven: set[tuple]) -> None:
    """Drop the occurrence counts of the steps both sides have passed (a name key holds its step), once a step."""
    steps = [s.ahead[0].record.step if s.ahead else s.tail[-1].record.step for s in (a, b) if s.ahead or s.tail]
    low = min(steps, default=None)
    for side in (a, b):
        if low is not None and side.low != low:
            side.seen = {base: n for base, n in side.seen.items() if base[4] >= low}
            side.low = low
            uneven.difference_update([base for base in uneven if base[4] < low])
