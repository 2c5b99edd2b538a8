"""A MindSpore dump (CPU target: reads deferred to the flush, session.DEFER) records each tensor as its hook saw it,
even when the model's own code later writes into it in place (aligner.dumping.inplace_mindspore).

Without the guard, a parent's `h[0] = 0` after its child returned `h` made the child's record show the zeroed row: a
compare then blamed the child for its parent's code, and the next child's input linked to that record as if unchanged.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn, ops  # noqa: E402

import aligner  # noqa: E402
from aligner.metrics.stats import tensor_stats  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)

# each writes zeros into (part of) the tensor a child returned, the ways MindSpore's CPU target runs
WRITES: dict[str, Callable[[Any], None]] = {
    "setitem": lambda h: h.__setitem__(0, 0.0),
    "setitem through a view": lambda h: h.reshape(-1).__setitem__(slice(0, 3), 0.0),
    "Tensor.copy_": lambda h: h.copy_(ops.zeros_like(h)),
    "Tensor.assign_value": lambda h: h.assign_value(ops.zeros_like(h)),
    "ops.assign": lambda h: ops.assign(h, ops.zeros_like(h)),
    "an ops.Assign primitive": lambda h: ops.Assign()(h, ops.zeros_like(h)),
}


class Parent(nn.Cell):
    """fc -> (the parent's own write into fc's output) -> head."""

    def __init__(self, write: Callable[[Any], None]) -> None:
        super().__init__()
        self.fc, self.head = nn.Dense(4, 4), nn.Dense(4, 2)
        self.write = write

    def construct(self, x: Any) -> Any:
        h = self.fc(x)
        self.write(h)
        return self.head(h)


X = ms.Tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))


def records(root: Path) -> dict[tuple[str, str], dict[str, Any]]:
    lines = (json.loads(line) for line in (root / "manifest.jsonl").read_text().splitlines()[1:])
    return {(r["module"], r["io"]): r for r in lines if r["kind"] == "forward"}


def data(root: Path, recs: dict[tuple[str, str], dict[str, Any]], key: tuple[str, str]) -> np.ndarray:
    r = recs[key]
    if r["file"] is None:  # a link: the record it names holds the data
        r = next(o for o in recs.values() if o["seq"] == r["same_as"])
    return np.load(root / r["file"])


@pytest.mark.parametrize("how", WRITES)
def test_a_parents_write_into_a_childs_output_is_not_in_the_childs_record(tmp_path: Path, how: str) -> None:
    net = Parent(WRITES[how])
    returned = net.fc(X).asnumpy()  # what fc returns, before any write
    h = ms.Tensor(returned.copy())
    WRITES[how](h)
    written = h.asnumpy()
    assert not np.array_equal(written, returned)  # the write changes the numbers (else the test could not fail)
    want_out = net(X).asnumpy()

    with aligner.dump(net, tmp_path / "full", backward=False):
        out = net(X)
    np.testing.assert_array_equal(out.asnumpy(), want_out)  # the dump changes no number
    recs = records(tmp_path / "full")
    np.testing.assert_array_equal(data(tmp_path / "full", recs, ("fc", "output")), returned)
    # head's input is the written tensor, stored (no link to fc's output), computed in the parent
    head_in = recs[("head", "input")]
    assert head_in["same_as"] is None and head_in["parent"] == ""
    np.testing.assert_array_equal(data(tmp_path / "full", recs, ("head", "input")), written)

    with aligner.dump(net, tmp_path / "stats", backward=False, stats_only=True):
        net(X)
    stats = records(tmp_path / "stats")[("fc", "output")]["stats"]
    want = tensor_stats(returned)
    assert (stats["min"], stats["max"]) == (want.min, want.max)
    assert stats["mean"] == pytest.approx(want.mean, rel=1e-6)


def test_augmented_assignment_returns_a_new_tensor() -> None:
    """Why `x += y` is not guarded: MindSpore's in-place operators other than `__setitem__` leave `x` as it was and
    return a new tensor (if a release changes that, they must be guarded too)."""
    for name in ("__iadd__", "__isub__", "__imul__", "__itruediv__"):
        x = ms.Tensor(np.ones(3, np.float32))
        y = getattr(x, name)(ms.Tensor(np.full(3, 2.0, np.float32)))
        assert y is not x and x.asnumpy().tolist() == [1.0, 1.0, 1.0], name


@pytest.mark.parametrize("ops_too", [False, True])
def test_the_guards_are_removed_at_exit(tmp_path: Path, ops_too: bool) -> None:
    """Every patched entry point is what it was after the context, also under ops=True (which patches the same
    Tensor methods: both are put back, the last made first)."""
    watched = [(ms.Tensor, "__setitem__"), (ms.Tensor, "copy_"), (ms.Tensor, "assign_value"), (ops.Assign, "__call__")]
    before = [vars(owner).get(name) for owner, name in watched]
    net = Parent(WRITES["setitem"])
    with aligner.dump(net, tmp_path / "d", backward=False, ops=ops_too):
        assert all(vars(owner).get(name) is not was for (owner, name), was in zip(watched, before))  # guarded
        net(X)
    assert [vars(owner).get(name) for owner, name in watched] == before


class ZeroesItsInput(nn.Cell):
    def construct(self, x: Any) -> Any:
        x[0] = 0.0
        return x * 1.0


class Caller(nn.Cell):
    """Reads its tensor again after a child wrote into it in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.child, self.head = nn.Dense(4, 4), ZeroesItsInput(), nn.Dense(4, 2)

    def construct(self, x: Any) -> Any:
        h = self.fc(x)
        self.child(h)
        return self.head(h).sum()


@pytest.mark.parametrize("backward", [True, False])
def test_a_cell_writing_its_own_input_under_a_gradient_dump_is_noted(tmp_path: Path, backward: bool) -> None:
    """To record a cell's input gradient the hooks hand it a copy of its input; a write into that copy never reaches
    the caller, whose later read then differs from a run without the dump. The dump says so in the place of that
    input's gradient record (naming the cell and the input, with what to run instead); with backward=False the cell
    gets its own input and the numbers are those of a plain run."""
    net = Caller()
    loss_fn = ms.value_and_grad(net, None, net.trainable_params())
    plain = float(loss_fn(X)[0].asnumpy())
    with aligner.dump(net, tmp_path / "d", backward=backward):
        dumped = float(loss_fn(X)[0].asnumpy())
    lines = [json.loads(line) for line in (tmp_path / "d" / "manifest.jsonl").read_text().splitlines()[1:]]
    noted = [(r["module"], r["kind"], r["io"], r["index"]) for r in lines if r.get("skipped")]
    if backward:  # in the place of that input's gradient record
        assert noted == [("child", "backward", "grad_input", 0)]
        assert dumped != plain  # what the note warns of
    else:
        assert noted == [] and dumped == plain


def test_jit_code_runs_inside_a_guarded_dump(tmp_path: Path) -> None:
    """MindSpore's graph compiler parses what `@mindspore.jit` code calls by name: a guarded `F.assign` made it fail
    on the wrapper (nn.Adam's construct assigns its beta powers) until the wrapper named the original as
    `__wrapped__`. Jit code assigning a Parameter, writing an item, relu-ing with mint, and an Assign primitive in a
    jit construct all run while a dump is open, with the numbers they give without one."""
    import mindspore.mint.nn.functional as mint_f
    import mindspore.ops.functional as F  # noqa: N812  (MindSpore's own spelling, which the optimizers use)

    def made() -> tuple[Callable[..., Any], nn.Cell]:
        """A jit function and a jit cell of their own (each compiles on its first call: inside the dump below)."""
        p = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="p")

        @ms.jit
        def jitted(v: Any, x: Any) -> Any:
            F.assign(p, v)
            x[0] = 5.0
            return mint_f.relu(p * x - 1.0)

        class Assigns(nn.Cell):
            def __init__(self) -> None:
                super().__init__()
                self.q, self.assign = ms.Parameter(ms.Tensor(np.zeros(3, np.float32)), name="q"), ops.Assign()

            @ms.jit
            def construct(self, v: Any) -> Any:
                self.assign(self.q, v)
                return self.q * 2.0

        return jitted, Assigns()

    v = ms.Tensor(np.arange(3, dtype=np.float32))
    fn, cell = made()
    want = (fn(v, ms.Tensor(np.ones(3, np.float32))).asnumpy(), cell(v).asnumpy())
    net = Parent(WRITES["setitem"])
    with aligner.dump(net, tmp_path / "d", backward=False):
        net(X)
        fn, cell = made()
        got = (fn(v, ms.Tensor(np.ones(3, np.float32))).asnumpy(), cell(v).asnumpy())
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_contexts_exited_out_of_order_keep_the_open_one_guarded(tmp_path: Path) -> None:
    """A enters, B enters, A exits: B is still guarded (its child's record is what the child returned, not the
    parent's write after it), and once B exits every entry point is what it was."""
    watched = [(ms.Tensor, "__setitem__"), (ms.Tensor, "copy_"), (ops.Assign, "__call__")]
    before = [vars(owner).get(name) for owner, name in watched]
    first, second = Parent(WRITES["setitem"]), Parent(WRITES["setitem"])
    returned = second.fc(X).asnumpy()
    a = aligner.dump(first, tmp_path / "a", backward=False)
    b = aligner.dump(second, tmp_path / "b", backward=False)
    a.__enter__()
    b.__enter__()
    first(X)
    a.__exit__(None, None, None)
    assert all(vars(owner).get(name) is not was for (owner, name), was in zip(watched, before))  # B still guarded
    second(X)
    b.__exit__(None, None, None)
    assert [vars(owner).get(name) for owner, name in watched] == before
    recs = records(tmp_path / "b")
    np.testing.assert_array_equal(data(tmp_path / "b", recs, ("fc", "output")), returned)
    recs_a = records(tmp_path / "a")
    assert not np.array_equal(data(tmp_path / "a", recs_a, ("head", "input")),
                              data(tmp_path / "a", recs_a, ("fc", "output")))  # A's write was seen too


def test_a_write_into_a_handed_copy_is_noted_for_that_copy_even_once_another_copy_has_its_id() -> None:
    """A copy the hooks hand a cell may be freed during the step while its gradient still comes (MindSpore's graph
    holds the tensor, not the Python object), and a later copy then gets its id: the note of a write goes by the
    token `handed_input` gave the copy written, never to the other copy's gradient."""
    from aligner.dumping.session import Session
    from aligner.dumping.writer import MemorySink

    class Copy:  # weakly referenceable, like a MindSpore tensor
        pass

    session = Session(MemorySink(), 0, mindspore=True)
    written = Copy()
    token = session.handed_input(written, "inplace", "InPlace", 1)
    session.writing_in_place(written)
    freed = id(written)
    del written
    others = [Copy() for _ in range(64)]  # CPython hands the freed block to one of them
    other = next((c for c in others if id(c) == freed), None)
    assert other is not None, "no later object took the freed copy's id: nothing checked"
    other_token = session.handed_input(other, "head", "Dense", 0)
    assert session.written_input(other_token) is None
    note = session.written_input(token)
    assert note is not None and note.startswith("inplace wrote in place into its input 1")


def test_an_entry_point_changed_between_dumps_is_guarded_as_it_is_then(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The guards wrap each entry point as it is when a dump opens (a process keeps one wrapper per entry point): a
    patch of the user's made between two dumps is what the second dump's guard calls, after telling the session, and
    what is left after it."""
    net = Parent(WRITES["ops.assign"])
    returned = net.fc(X).asnumpy()
    with aligner.dump(net, tmp_path / "first", backward=False):
        net(X)
    original, calls = ops.assign, []

    def mine(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(ops, "assign", mine)
    with aligner.dump(net, tmp_path / "second", backward=False):
        assert ops.assign is not mine and inspect.unwrap(ops.assign) is mine
        net(X)
    assert ops.assign is mine and len(calls) == 1
    recs = records(tmp_path / "second")
    np.testing.assert_array_equal(data(tmp_path / "second", recs, ("fc", "output")), returned)
