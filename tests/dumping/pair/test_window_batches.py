"""The window's batch steps (aligner/dumping/pair/window.py: `_Side.fill`, `_alike`, `_folded`, `_passed`), which take
a batch of records with a set or map per field, against the one-record-at-a-time code they replace (written out here,
as it was): the same answers and the same state on random records, pass-through calls and their edge cases included;
and a stream of output records only, where a call that hands back the record before it folds (one record a call)."""
from __future__ import annotations

import collections
import random

import pytest

from aligner.dumping.manifest import INPUTS, Io, Kind, Record
from aligner.dumping.pair import window
from aligner.dumping.pair.matching import MODULE_KINDS, ancestors, match, passthrough, spelling
from aligner.dumping.pair.window import Resync, _Side
from aligner.dumping.read.source import Item
from aligner.metrics.stats import Stats

MODULES = ["enc.fc0", "enc.fc1", "enc.drop", "Enc.Fc_1", "dec.attn.q", "dec.attn"]
KINDS = ["forward"] * 6 + ["backward", "op", "param_grad", "buffer", "block", "param"]
IOS = ["output", "output", "input", "grad_output", "grad_input"]


def _items(rng: random.Random, n: int, modules: list[str], kinds: list[str] = KINDS) -> list[Item]:
    """Random records in execution order: kinds and io as the decoder gives them (enum members) or as plain strings,
    values from a small set (so that a record often holds the one before it), now and then no statistics."""
    items: list[Item] = []
    step, value = 0, 1.0
    for seq in range(n):
        step += rng.random() < 0.01
        kind, io = rng.choice(kinds), rng.choice(IOS)
        value = value if rng.random() < 0.3 else rng.choice([1.0, 2.0, 3.0, 4.5])
        stats = None if rng.random() < 0.03 else Stats(min=-value, max=value, mean=value / 10, l2=value, nan=0, inf=0)
        enum = rng.random() < 0.5
        items.append(Item(Record(
            seq=seq, module=rng.choice(modules), type="Linear", kind=Kind(kind) if enum else kind,
            io=Io(io) if enum else io, index=rng.randrange(2), dtype="float32",
            shape=[4, 8], stats=stats, call=rng.choice([None, *range(1, 12)]), step=step,
            arg=rng.choice([None, None, "0", "x"]) if io == "input" else None)))
    return items


def _alike_one_at_a_time(xs: list[Item], ys: list[Item], by_arg: bool, uneven: set[str],
                         spelled: dict[str, str]) -> int:
    n, k = min(len(xs), len(ys)), 0
    while k < n:
        x, y = xs[k].record, ys[k].record
        if x.module != y.module or x.kind != y.kind or x.io != y.io or x.step != y.step or x.kind == Kind.OP or \
                (x.arg if by_arg and x.io == Io.INPUT and x.arg is not None else x.index) != \
                (y.arg if by_arg and y.io == Io.INPUT and y.arg is not None else y.index) or \
                uneven and spelled.get(x.module) in uneven:
            break
        k += 1
    return k


@pytest.mark.parametrize("seed", range(30))
def test_alike_stops_where_the_record_by_record_loop_stops(seed: int) -> None:
    """Twin records up to a record that differs in one field (or none), an op record, a name counted unevenly."""
    rng = random.Random(seed)
    spelled = {m: spelling(m) for m in MODULES}
    stops = collections.Counter()
    for _ in range(20):
        kinds = ["forward", "backward"] if rng.random() < 0.7 else KINDS  # (op records: 1 in 12 of KINDS)
        xs = _items(rng, rng.randrange(0, 700), MODULES, kinds)
        ys = [Item(x.record) for x in xs] + _items(rng, rng.randrange(0, 5), MODULES)
        if xs and rng.random() < 0.6:
            k = rng.randrange(len(xs))
            field = rng.choice(["module", "io", "index", "arg", "step", "kind"])
            other = {"module": "other", "io": "output", "index": 7, "arg": "y", "step": 99, "kind": "op"}[field]
            ys[k] = Item(Record(**{f: getattr(xs[k].record, f) for f in Record.__struct_fields__} | {field: other}))
        by_arg = rng.random() < 0.5
        uneven = {spelled[rng.choice(MODULES)]} if rng.random() < 0.2 else set()
        want = _alike_one_at_a_time(xs, ys, by_arg, uneven, spelled)
        assert window._alike(xs, ys, by_arg, uneven, spelled) == want
        stops["to the end" if want == len(xs) else "before"] += 1
        stops["past a piece"] += want > window._SCAN
    assert len(stops) == 3, stops  # the test can fail: both ends met, and a stop past a piece


def _side(tail: list[Item], ahead: list[Item]) -> _Side:
    side = _Side(iter([]))
    side.tail, side.ahead = tail, ahead
    return side


@pytest.mark.parametrize("seed", range(30))
def test_folded_is_passthrough_of_the_records_ahead(seed: int) -> None:
    """Records of one module each (the test by L2 norm decides) and of a few modules (runs: passthrough decides)."""
    rng = random.Random(seed)
    outcomes = collections.Counter()
    for _ in range(30):
        many = [f"layers.{i}" for i in range(400)]
        items = _items(rng, rng.randrange(1, 300), many if rng.random() < 0.5 else MODULES)
        if rng.random() < 0.5:  # distinct modules: a module record whose value repeats the one before it folds
            for i, it in enumerate(items):
                it.record.module = f"layers.{i}"
        c = rng.randrange(0, min(70, len(items)))
        side = _side(items[:c], items[c:])
        k = rng.randrange(0, len(side.ahead) + 1)
        want = {i - c: j - c for i, j in passthrough(items[:c + k]).items() if i >= c}
        assert window._folded(side, k) == want
        outcomes["folds" if want else "none"] += 1
    assert outcomes["folds"] and outcomes["none"]


def _fill_one_at_a_time(side: _Side, items: list[Item], n: int, spelled: dict[str, str]) -> None:
    """`_Side.fill` as it was, reading `items` one at a time (`side.it` unused)."""
    while not side.done and len(side.ahead) < n:
        item = items.pop(0) if items else None
        if item is None:
            side.done = True
            continue
        r = item.record
        if r.kind == Kind.PARAM:
            continue
        if r.kind == Kind.BUFFER:
            side.buffers = True
        side.ahead.append(item)
        if r.kind == Kind.PARAM_GRAD:
            side.grads.add(r.module)
            continue
        if r.module not in side.met or r.kind in MODULE_KINDS and r.module not in side.met_modules:
            spelt = spelled.get(r.module)
            if spelt is None:
                spelt = spelled[r.module] = spelling(r.module)
            side.met.add(r.module)
            side.names.add(spelt)
            if r.kind in MODULE_KINDS:
                side.met_modules.add(r.module)
                side.modules.add(spelt)
                side.parents.update(ancestors(spelt))
        if r.arg is not None and r.io == Io.INPUT:
            side.named_inputs = True


def _state(side: _Side) -> tuple:
    return ([id(it) for it in side.ahead], side.done, side.buffers, side.grads, side.met, side.met_modules,
            side.names, side.modules, side.parents, side.named_inputs)


@pytest.mark.parametrize("seed", range(30))
def test_fill_reads_what_the_record_by_record_loop_reads(seed: int) -> None:
    """Batches of any length (empty ones too), filled and passed round by round."""
    rng = random.Random(seed)
    _fill_alike(rng, _items(rng, rng.randrange(0, 400), MODULES + [f"m{i}.x_y" for i in range(30)]))


PLAIN = ["enc.fc0", "enc.fc1", "enc.drop", "dec.attn.q", "dec.attn"]  # names that spell as themselves


@pytest.mark.parametrize("seed", range(30))
def test_fill_shares_one_name_set_exactly_while_it_can(seed: int) -> None:
    """A model's usual records first (module records, parameters and their gradients, names that spell as
    themselves: the one set `_Side` keeps for them), then, from a random point or never, any record (a name spelled
    otherwise, an op, a buffer): the same state as the loop that keeps four sets from the start."""
    rng = random.Random(seed)
    plain = PLAIN + [f"layers.{i}.fc" for i in range(40)]
    items = _items(rng, rng.randrange(0, 300), plain, ["forward", "backward", "param", "param_grad"])
    items += _items(rng, rng.randrange(0, 100) if rng.random() < 0.8 else 0, plain + MODULES)
    _fill_alike(rng, items)


def _fill_alike(rng: random.Random, items: list[Item]) -> None:
    """Fill a side from `items` in random batches and random amounts, and the record-by-record loop beside it."""
    cuts = sorted(rng.randrange(len(items) + 1) for _ in range(rng.randrange(6)))
    batches = [items[i:j] for i, j in zip([0, *cuts], [*cuts, len(items)])]
    new, old, rest = _Side(iter(batches)), _Side(iter([])), list(items)
    old._split()  # the loop keeps the four sets apart from the start (the new side shares one while it can)
    spelled_new: dict[str, str] = {}
    spelled_old: dict[str, str] = {}
    while not (new.done and old.done):
        n = rng.randrange(0, 80)
        new.fill(n, spelled_new)
        _fill_one_at_a_time(old, rest, n, spelled_old)
        assert _state(new) == _state(old)
        k = rng.randrange(len(new.ahead) + 1)
        del new.ahead[:k], old.ahead[:k]
        if n == 0 and not new.ahead:
            new.fill(1, spelled_new)
            _fill_one_at_a_time(old, rest, 1, spelled_old)
    assert spelled_new == spelled_old


def _passed_one_at_a_time(side: _Side, k: int) -> None:
    """`_passed` as it was: `_note_calls` and `_close_calls` a record at a time."""
    block = side.ahead[:k]
    calls = side.open_calls
    for it in block:
        r = it.record
        if r.call is not None and r.kind in MODULE_KINDS and r.io in INPUTS:
            calls.setdefault((r.step, r.module, r.call), []).append(it)
            if len(calls) > window._OPEN_CALLS:
                calls.popitem(last=False)
                side.dropped = True
    for it in block:
        r = it.record
        if r.call is not None and r.io not in INPUTS:
            calls.pop((r.step, r.module, r.call), None)
    side.tail = (side.tail + block)[-window._CONTEXT:]
    del side.ahead[:k]


@pytest.mark.parametrize("seed", range(30))
def test_passed_holds_the_open_calls_the_record_by_record_loop_holds(seed: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(window, "_OPEN_CALLS", rng.choice([4, 1 << 16]))  # (4: calls let go, `dropped`)
    items = _items(rng, rng.randrange(100, 600), MODULES, ["forward", "backward", "op"])
    new, old = _side([], list(items)), _side([], list(items))
    opened = 0
    while new.ahead:
        k = rng.choice([0, 1, rng.randrange(len(new.ahead) + 1), len(new.ahead)])
        window._passed(new, k)
        _passed_one_at_a_time(old, k)
        assert list(new.open_calls.items()) == list(old.open_calls.items())
        assert (new.dropped, new.tail, new.ahead) == (old.dropped, old.tail, old.ahead)
        opened += len(new.open_calls)
    assert opened  # the test can fail: calls were held open between rounds


def _outputs(values: list[tuple[str, float]]) -> list[Item]:
    return [Item(Record(seq=n, module=module, type="Linear", kind=Kind.FORWARD, io=Io.OUTPUT, index=0,
                        dtype="float32", shape=[4, 8], stats=Stats(min=-v, max=v, mean=v / 10, l2=v * 3, nan=0, inf=0),
                        call=n + 1)) for n, (module, v) in enumerate(values)]


@pytest.mark.parametrize("block", [4, 16, 4096])
def test_a_call_of_one_record_handing_back_the_one_before_folds_as_in_the_whole_lists(block: int) -> None:
    """Output records only (a stats-only dump of module outputs): a Dropout after every 7th layer on one side holds
    the record before it (folded, where each other record's L2 norm differs from the one before), a layer every
    11th on the other side holds its own numbers (only there)."""
    calls = [(f"layers.{i}.fc", 1.0 + 0.01 * i) for i in range(200)]
    a = _outputs([c for i, (m, v) in enumerate(calls) for c in [(m, v)] + [(f"layers.{i}.drop", v)] * (i % 7 == 6)])
    b = _outputs([c for i, (m, v) in enumerate(calls) for c in [(m, v)] + [(f"layers.{i}.x", 9 + v)] * (i % 11 == 3)])
    whole = match(a, b)
    assert sum(p.matched_by == "folded" for p in whole) == 28
    for x, y, rows in ((a, b, whole), (b, a, match(b, a))):
        got = [p for batch in Resync(iter(x), iter(y), None, block, 1 << 10) for p in batch]
        assert [(id(p.a), id(p.b), p.matched_by) for p in got] == [(id(p.a), id(p.b), p.matched_by) for p in rows]
