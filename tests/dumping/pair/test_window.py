"""Two record streams paired a window at a time (aligner/dumping/pair/window.py): the rows are `match`'s over the
whole lists, record for record and `matched_by` for `matched_by`, or OutOfStepError; never other rows."""
from __future__ import annotations

import random

import pytest

from aligner.dumping.manifest import Record
from aligner.dumping.pair import window
from aligner.dumping.pair.matching import Pair, match, namers
from aligner.dumping.pair.window import OutOfStepError, Resync, Why
from aligner.dumping.read.source import Item
from aligner.metrics.stats import Stats


def _record(seq: int, module: str, io: str, value: float, call: int, *, kind: str = "forward", shape: int = 8,
            step: int = 0, typ: str = "Linear") -> Item:
    stats = Stats(min=-value, max=value, mean=value / 10, l2=value * 3, nan=0, inf=0)
    return Item(Record(seq=seq, module=module, type=typ, kind=kind, io=io, index=0, dtype="float32", shape=[4, shape],
                       stats=stats, call=call, step=step))


Call = tuple[str, float, str, int]  # module, output value, type, step


def _model(calls: int, steps: int = 1) -> list[Call]:
    """Each call of a chain of layers whose outputs all differ, `steps` times."""
    return [(f"layers.{k // 4}.fc{k % 4}", 1.0 + 0.37 * k + 0.011 * s, "Linear", s)
            for s in range(steps) for k in range(calls)]


def _dump(calls: list[Call]) -> list[Item]:
    """Each call as its input record (the output before it) and its output record."""
    items, before = [], 0.5
    for n, (module, value, typ, step) in enumerate(calls):
        kind = "op" if typ.startswith("Tensor.") else "forward"
        items.append(_record(len(items), module, "input", before, n + 1, kind=kind, step=step, typ=typ))
        items.append(_record(len(items), module, "output", value, n + 1, kind=kind, step=step, typ=typ))
        before = value
    return items


def _rows(pairs: list[Pair]) -> list[tuple]:
    return [(id(p.a) if p.a else None, id(p.b) if p.b else None, p.matched_by) for p in pairs]


def _streamed(a: list[Item], b: list[Item], block: int, lookahead: int = 1 << 10) -> list[Pair]:
    return [p for rows in Resync(iter(a), iter(b), None, block, lookahead) for p in rows]


def _edit(calls: list[Call], rng: random.Random, edits: int) -> list[Call]:
    """The calls with `edits` migration differences: a call on this side only handing back its input (Identity,
    folded), one computing something else (listed only here), a layer renamed (paired by content), two calls in
    another order, a call dumped as an op (paired by content)."""
    out = list(calls)
    for _ in range(edits):
        k = rng.randrange(1, len(out) - 1)
        module, value, typ, step = out[k]
        what = rng.choice(["identity", "extra", "rename", "swap", "op", "drop"])
        if what == "identity":
            out.insert(k + 1, (module + "_id", value, "Identity", step))
        elif what == "extra":
            out.insert(k + 1, (module + "_extra", 100.0 + k, "Extra", step))
        elif what == "rename":
            out[k] = (module.replace("fc", "dense"), value, typ, step)
        elif what == "swap" and out[k + 1][3] == step:
            out[k], out[k + 1] = out[k + 1], out[k]
        elif what == "op":
            out[k] = (module, value, "Tensor.matmul", step)
        else:
            del out[k]
    return out


CASES = {  # what the window resynchronises on: each is read whole by the in-step pairing
    "a record on one side only": lambda c: c[:30] + [("layers.7.extra", 55.0, "Extra", 0)] + c[30:],
    "an Identity folded on one side": lambda c: c[:30] + [(c[29][0] + "_id", c[29][1], "Identity", 0)] + c[30:],
    "a call missing on one side": lambda c: c[:30] + c[31:],
    "two calls in another order": lambda c: c[:30] + [c[31], c[30]] + c[32:],
    "a layer renamed": lambda c: c[:30] + [("layers.7.dense", c[30][1], "Linear", 0)] + c[31:],
    "an op record": lambda c: c[:30] + [(c[30][0], c[30][1], "Tensor.matmul", 0)] + c[31:],
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("block", [3, 8, 64])
def test_each_difference_resynchronises_to_the_whole_list_rows(case: str, block: int) -> None:
    calls = _model(60)
    a, b = _dump(CASES[case](calls)), _dump(calls)
    whole = match(a, b)
    assert any(p.matched_by != "name" for p in whole) or case == "two calls in another order"
    assert _rows(_streamed(a, b, block)) == _rows(whole)
    assert _rows(_streamed(b, a, block)) == _rows(match(b, a))


@pytest.mark.parametrize("seed", range(40))
def test_random_migrations_pair_as_the_whole_lists_or_not_at_all(seed: int) -> None:
    """Random edits over two steps of a 40-call model, windows of 2 to 9 records: the streamed rows are the whole-list
    rows whenever they come (counted in the next test)."""
    rng = random.Random(seed)
    calls = _model(40, steps=2)
    a, b = _dump(_edit(calls, rng, rng.randint(1, 6))), _dump(calls)
    block = rng.randint(2, 9)
    for x, y in ((a, b), (b, a)):
        try:
            got = _streamed(x, y, block, lookahead=32)
        except OutOfStepError:
            continue
        assert _rows(got) == _rows(match(x, y))


def test_random_migrations_mostly_stream() -> None:
    """Of the random cases above, how many the window pairs (the rest read whole): measured 80 of 80, where the
    in-step pairing streamed none (each has an edit; 2,991 of 3,000 in a longer run of 1 to 10 edits over 1 to 3
    steps, windows of 2 to 12 records, every one equal to `match`). At least 60: fewer means the window gave up on
    the differences it is there to resynchronise on."""
    streamed = 0
    for seed in range(40):
        rng = random.Random(seed)
        calls = _model(40, steps=2)
        a, b = _dump(_edit(calls, rng, rng.randint(1, 6))), _dump(calls)
        block = rng.randint(2, 9)
        for x, y in ((a, b), (b, a)):
            try:
                _streamed(x, y, block, lookahead=32)
                streamed += 1
            except OutOfStepError:
                pass
    assert streamed >= 60, streamed


def test_a_twin_windows_back_is_out_of_step() -> None:
    """A call whose twin by name was paired a window before (a module called early on one side and late on the
    other): the whole lists pair them across the cut, so the window refuses (ORDER)."""
    calls = _model(60)
    moved = calls[:5] + calls[6:50] + [calls[5]] + calls[50:]
    with pytest.raises(OutOfStepError) as info:
        _streamed(_dump(moved), _dump(calls), 4)
    assert info.value.why is Why.ORDER
    a, b = _dump(moved), _dump(calls)
    assert _rows(_streamed(a, b, 4096)) == _rows(match(a, b))  # one window holds both


def test_no_cut_within_the_look_ahead_is_out_of_step() -> None:
    """Thirty calls renamed in a row (paired by content): no name pair to cut at within 16 records (WINDOW); a
    64-record look-ahead holds the whole run."""
    calls = _model(60)
    renamed = calls[:10] + [(m.replace("fc", "dense"), v, t, s) for m, v, t, s in calls[10:40]] + calls[40:]
    a, b = _dump(renamed), _dump(calls)
    with pytest.raises(OutOfStepError) as info:
        _streamed(a, b, 4, lookahead=16)
    assert info.value.why is Why.WINDOW
    assert _rows(_streamed(a, b, 4, lookahead=128)) == _rows(match(a, b))


def _backward(grads: dict[str, float], steps: int, framework: str) -> list[Item]:
    """`steps` steps of a forward, then the parameter gradients (MindSpore's names or PyTorch's) among backward
    records, as a training step dumps them."""
    items: list[Item] = []
    for step in range(steps):
        for module, value, typ, _ in _model(12):
            items.append(_record(len(items), module, "output", value, len(items) + 1, step=step, typ=typ))
        for k, (name, value) in enumerate(grads.items()):
            items.append(_record(len(items), f"layers.{k}", "grad_output", value + 7.0, len(items) + 1,
                                 kind="backward", step=step))
            ms_name = name.replace(".weight", ".gamma").replace(".bias", ".beta") if framework == "ms" else name
            items.append(_record(len(items), ms_name, "output", value + step, 0, kind="param_grad", step=step))
    return items


GRADS = {f"layers.{k}.norm.{p}": 0.1 * k + (p == "bias") for k in range(6) for p in ("weight", "bias")}


def _named(ms: list[Item], pt: list[Item], ms_first: bool) -> list[Pair]:
    """`match` with the names `namers` gives a MindSpore and a PyTorch side (gamma -> weight)."""
    first, second = (ms, pt) if ms_first else (pt, ms)
    names = namers(first, "mindspore" if ms_first else "pytorch", "pytorch" if ms_first else "mindspore", second)
    return match(first, second, *names)


@pytest.mark.parametrize("block", [3, 16])
def test_parameter_gradients_across_frameworks_pair_under_their_planned_names(block: int) -> None:
    """MindSpore's `gamma`/`beta` gradients and PyTorch's `weight`/`bias`, over three steps: planned once the first
    step's gradients are read, the rows are `match`'s under `namers`' names, in both orders."""
    ms, pt = _backward(GRADS, 3, "ms"), _backward(GRADS, 3, "pt")
    for first, second, side in ((ms, pt, 0), (pt, ms, 1)):
        got = [p for rows in Resync(iter(first), iter(second), side, block) for p in rows]
        whole = _named(ms, pt, side == 0)
        assert _rows(got) == _rows(whole)
        assert sum(p.matched_by == "name" and p.b.record.kind == "param_grad" for p in got) == 36


def test_a_parameter_gradient_the_plan_lacks_is_out_of_step() -> None:
    """A gradient in a later step that the first step's did not have: the plan over the whole dump may name the
    others otherwise (PARAM_NAMES); one window holding every step pairs as `match`."""
    ms, pt = _backward(GRADS, 2, "ms"), _backward(GRADS, 2, "pt")
    ms.append(_record(len(ms), "head.gamma", "output", 3.0, 0, kind="param_grad", step=1))
    pt.append(_record(len(pt), "head.weight", "output", 3.0, 0, kind="param_grad", step=1))
    with pytest.raises(OutOfStepError) as info:
        list(Resync(iter(ms), iter(pt), 0, 4))
    assert info.value.why is Why.PARAM_NAMES
    assert _rows([p for rows in Resync(iter(ms), iter(pt), 0, 4096) for p in rows]) == _rows(_named(ms, pt, True))


def test_a_pass_through_whose_inputs_were_let_go_is_out_of_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block whose output is its last child's (folded on both sides: `match` looks at the block's inputs to tell a
    pass-through from a computation): with no open call's inputs held (the limit cut to 0), the window cannot look
    and refuses (PASS_THROUGH); with them held, it pairs as `match` does."""
    def side() -> list[Item]:
        children = _dump(_model(12))
        for k, it in enumerate(children):
            it.record.seq = k + 1
        last = children[-1].record.stats.max
        return [_record(0, "block", "input", 0.5, 99, typ="Block"), *children,
                _record(len(children) + 1, "block", "output", last, 99, typ="Block")]

    a, b = side(), side()
    assert _rows(_streamed(a, b, 4)) == _rows(match(a, b))
    monkeypatch.setattr(window, "_OPEN_CALLS", 0)
    with pytest.raises(OutOfStepError) as info:
        _streamed(a, b, 4)
    assert info.value.why is Why.PASS_THROUGH


def test_a_wrapper_prefix_the_whole_lists_strip_is_out_of_step() -> None:
    """Every module of one side under DDP's `module.`: the whole lists strip it and pair by name, known only once
    every name was read; the window pairs by content meanwhile, so the end refuses (ORDER, after rows were handed
    out: the caller restarts its reports)."""
    calls = _model(20)
    wrapped = [("module." + m, v, t, s) for m, v, t, s in calls]
    a, b = _dump(wrapped), _dump(calls)
    assert all(p.matched_by == "name" for p in match(a, b))
    handed: list[Pair] = []
    with pytest.raises(OutOfStepError) as info:
        for rows in Resync(iter(a), iter(b), None, 4096):
            handed += rows
    assert info.value.why is Why.ORDER and len(handed) == len(match(a, b))
