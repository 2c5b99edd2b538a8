"""MindSpore gradients taken by tensor hooks on each cell's outputs and on a queued copy of each input
(aligner/dumping/mindspore_hooks.py) are those MindSpore's own cell backward hooks give, computed in the same test on
an identical model: several inputs, a keyword tensor, an int tensor and a mask (no gradient: no record), tuple
outputs, the same tensor twice, a cell called twice, an in-place write inside a cell; non-leaf selection; and a
forward-only dump copies nothing."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

import aligner
from aligner.dumping import mindspore_hooks

ms.set_context(mode=ms.PYNATIVE_MODE)


class Multi(nn.Cell):
    """Two float inputs, an int tensor, a keyword tensor; a tuple out."""

    def construct(self, a, b, idx, scale=None):
        y = (a * b + scale) * idx.astype(ms.float32)
        return y, y.sum(axis=-1)


class Twice(nn.Cell):
    """Called with the same tensor twice: two shares of one gradient."""

    def construct(self, a, b):
        return a * b + a


class Masked(nn.Cell):
    """Two float masks beside the input: one computed from it (ones_like), one a constant from outside."""

    def construct(self, x, mask, keep):
        return x * mask * keep


class InPlace(nn.Cell):
    """Writes in place into an intermediate and into its own input."""

    def construct(self, x):
        y = x * 2.0
        y[0] = 0.0
        x[1] = 1.0
        return y + x


class Net(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.shared, self.head = nn.Dense(4, 4), nn.Dense(4, 4), nn.Dense(4, 4), nn.Dense(4, 2)
        self.multi, self.twice, self.masked, self.inplace = Multi(), Twice(), Masked(), InPlace()

    def construct(self, x, idx, s0):
        h, g = self.fc1(x), self.fc2(x)
        y, s = self.multi(h, g, idx, scale=s0)
        z = self.shared(self.shared(y))
        u = self.inplace(self.masked(self.twice(z, z), ops.ones_like(z), KEEP))
        return self.head(u) + s[:, None]


LEAVES = ("fc1", "fc2", "multi", "shared", "twice", "masked", "inplace", "head")
X = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
IDX = np.array([[1, 0, 1, 1]] * 3, np.int32)
S0 = np.full((3, 4), 0.3, np.float32)
KEEP = ms.Tensor(np.ones((3, 4), np.float32))


def make() -> Net:
    """The same weights every time."""
    net = Net()
    rng = np.random.default_rng(0)
    for p in net.trainable_params():
        p.set_data(ms.Tensor(rng.standard_normal(p.shape).astype(np.float32)))
    return net


def step(net: nn.Cell) -> tuple[float, np.ndarray, list[np.ndarray]]:
    """Loss, d loss / d s0 (the keyword tensor) and the parameter gradients."""
    loss, (g_s0, grads) = ms.value_and_grad(lambda a, i, s: net(a, i, s).square().sum(), 2, net.trainable_params())(
        ms.Tensor(X), ms.Tensor(IDX), ms.Tensor(S0))
    return float(loss), g_s0.asnumpy(), [g.asnumpy() for g in grads]


def by_cell_hooks(paths: tuple[str, ...]) -> tuple[dict, list[str], float]:
    """(path, io, index, occurrence) -> gradient from MindSpore's cell backward hooks on `paths`, the order the
    calls' gradients came in, and the loss."""
    net = make()
    got: dict[tuple, np.ndarray] = {}
    order: list[str] = []
    seen: collections.Counter[tuple] = collections.Counter()

    def hook(path: str, cell: nn.Cell, grad_input: tuple, grad_output: tuple) -> None:
        order.append(path)
        for io, grads in (("grad_output", grad_output), ("grad_input", grad_input)):
            for i, g in enumerate(grads):
                if g is not None:
                    got[(path, io, i, seen[(path, io, i)])] = g.asnumpy()
                    seen[(path, io, i)] += 1
    for path, cell in net.cells_and_names():
        if path in paths:
            cell.register_backward_hook(lambda c, gi, go, path=path: hook(path, c, gi, go))
    loss = step(net)[0]
    return got, order, loss


def dumped(root: Path) -> tuple[dict, list[dict]]:
    """(module, io, index, occurrence) -> gradient of every backward record (a link read through to its record's
    file), and every record."""
    recs = [json.loads(line) for line in open(root / "manifest.jsonl", encoding="utf-8")][1:]
    files = {r["seq"]: r["file"] for r in recs}
    got: dict[tuple, np.ndarray] = {}
    seen: collections.Counter[tuple] = collections.Counter()
    for r in recs:
        if r["kind"] == "backward" and not r.get("skipped"):
            k = (r["module"], r["io"], r["index"])
            got[(*k, seen[k])] = np.load(root / (r["file"] or files[r["same_as"]]))
            seen[k] += 1
    return got, recs


def test_gradients_are_those_of_the_cell_backward_hooks(tmp_path: Path) -> None:
    want, want_order, want_loss = by_cell_hooks(LEAVES)
    plain = step(make())
    net = make()
    with aligner.dump(net, tmp_path / "d"):
        loss, g_s0, grads = step(net)
    got, recs = dumped(tmp_path / "d")
    # the one note: InPlace writes `x[1] = 1.0` into its input, which under the dump is the copy handed it for its
    # input gradient (its caller does not see that write; here the caller does not read x again): that gradient's
    # record says so in its place
    noted = [(r["module"], r["io"], r["index"], r["skipped"]) for r in recs if r.get("skipped")]
    assert [n[:3] for n in noted] == [("inplace", "grad_input", 0)], noted
    assert "wrote in place into its input 0" in noted[0][3] and "backward=False" in noted[0][3]
    del want[("inplace", "grad_input", 0, 0)]
    # the dump changes no number (the in-place write into a cell's input included: the cell hook's copy and this
    # copy keep it from the caller alike, and the caller here does not read it again)
    assert loss == plain[0] == want_loss
    for a, b in zip(grads, plain[2]):
        np.testing.assert_array_equal(a, b)
    # the int tensor (multi's input 2) gets no gradient record; the cell hook hands a tensor there, not a gradient
    # (idx has none), so it is left out of the comparison
    assert ("multi", "grad_input", 2, 0) in want and not [k for k in got if k[:3] == ("multi", "grad_input", 2)]
    del want[("multi", "grad_input", 2, 0)]
    # the keyword tensor (input 3), which cell hooks never give, is d loss / d s0 (s0 feeds multi alone)
    np.testing.assert_array_equal(got.pop(("multi", "grad_input", 3, 0)), g_s0)
    # masked's constant mask gets no copy and no record (the cell hook gives none either); its ones_like(z) mask,
    # which MindSpore flags as requiring grad, gets its gradient, d loss / d mask = input 0 * grad_output, in both
    assert ("masked", "grad_input", 2, 0) not in got and ("masked", "grad_input", 2, 0) not in want
    masked_in = next(r for r in recs if (r["module"], r["io"], r["index"]) == ("masked", "input", 0))
    masked_in = np.load(tmp_path / "d" / (masked_in["file"] or next(
        r["file"] for r in recs if r["seq"] == masked_in["same_as"])))
    np.testing.assert_allclose(got[("masked", "grad_input", 1, 0)],
                               masked_in * want[("masked", "grad_output", 0, 0)], rtol=1e-6)
    assert set(got) == set(want)
    for k, w in want.items():
        np.testing.assert_array_equal(got[k], w, err_msg=str(k))
    # the same tensor twice: two shares, not their sum (a * b + a: the first share is b + 1, the second a)
    assert not np.array_equal(got[("twice", "grad_input", 0, 0)], got[("twice", "grad_input", 1, 0)])
    # cells' gradients come in the order the cell hooks ran (a cell called twice: its last call first)
    calls = [r["module"] for r in recs if r["kind"] == "backward" and r["io"] == "grad_output" and r["index"] == 0]
    assert calls == want_order
    assert calls.count("shared") == 2


def test_non_leaf_cells_get_their_gradients_and_children_their_links(tmp_path: Path) -> None:
    """leaves_only=False: the model cell itself gets copies of its inputs too; fc1 and fc2, which read the copy of
    x, still link their input to the model input's record."""
    want, _, _ = by_cell_hooks(("", *LEAVES))
    net = make()
    with aligner.dump(net, tmp_path / "d", leaves_only=False):
        g_s0 = step(net)[1]
    got, recs = dumped(tmp_path / "d")
    # the model's inputs: x is not differentiated (grad_position 2), yet the model cell's backward hook makes a
    # gradient flow to it (and so to fc1's and fc2's inputs), and hands a tensor for the int idx; tensor hooks give
    # neither, and s0's gradient (input 2) is what mindspore.grad gives
    for k in (("", "grad_input", 0, 0), ("", "grad_input", 1, 0), ("fc1", "grad_input", 0, 0),
              ("fc2", "grad_input", 0, 0), ("multi", "grad_input", 2, 0)):
        del want[k]
    # InPlace's write into its input: that gradient's record is the note of it (see the test above)
    del want[("inplace", "grad_input", 0, 0)]
    assert [(r["module"], r["io"]) for r in recs if r.get("skipped")] == [("inplace", "grad_input")]
    np.testing.assert_array_equal(got[("", "grad_input", 2, 0)], g_s0)
    np.testing.assert_array_equal(got.pop(("multi", "grad_input", 3, 0)), g_s0)  # the keyword tensor
    assert set(got) == set(want)
    for k, w in want.items():
        np.testing.assert_array_equal(got[k], w, err_msg=str(k))
    model_input = next(r["seq"] for r in recs if r["module"] == "" and r["io"] == "input" and r["index"] == 0)
    for leaf in ("fc1", "fc2"):
        record = next(r for r in recs if r["module"] == leaf and r["io"] == "input")
        assert record["same_as"] == model_input, leaf


def test_a_forward_only_dump_copies_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """backward=False, and a forward outside mindspore.grad, hand every cell its inputs themselves."""
    copied: list[tuple] = []
    real = mindspore_hooks._copy
    monkeypatch.setattr(mindspore_hooks, "_copy", lambda t: copied.append(t.shape) or real(t))
    net = make()
    with aligner.dump(net, tmp_path / "fwd", backward=False):
        step(net)
    assert copied == []
    with aligner.dump(net, tmp_path / "eval"):
        out = net(ms.Tensor(X), ms.Tensor(IDX), ms.Tensor(S0))
    assert out.shape == (3, 2)
    recs = dumped(tmp_path / "eval")[1]
    assert not [r for r in recs if r["kind"] == "backward" or r.get("skipped")]
    # the model input x keeps a stale requires-grad flag after a differentiated step: one copy, handed back unused
    assert len(copied) <= 1
    copied.clear()
    with aligner.dump(net, tmp_path / "train"):
        step(net)
    # with gradients: a copy of each float input flagged as requiring grad (fc1, fc2: x; multi: h, g, s0, not idx;
    # shared, called twice; twice: z twice; masked: its input and the ones_like(z) mask, not the constant one;
    # inplace; head), and of each of multi's two outputs
    assert len(copied) == 15


def test_ops_inside_a_cell_take_the_copies_as_its_inputs(tmp_path: Path) -> None:
    """ops=True: the copies are aligner's, not the model's ops (no record), and the cell's first op, which reads
    them, links its inputs to the record of the tensor copied (shared's output), as the cell's own input does."""
    net = make()
    with aligner.dump(net, tmp_path / "d", ops=True, scope="twice"):
        step(net)
    recs = dumped(tmp_path / "d")[1]
    ops_ = [r for r in recs if r["kind"] == "op"]
    assert [r["type"] for r in ops_ if r["io"] == "output"] == ["Tensor.__mul__", "Tensor.__add__"]
    shared_out = [r["seq"] for r in recs if (r["module"], r["kind"], r["io"]) == ("shared", "forward", "output")][-1]
    twice_in = [r for r in recs if (r["module"], r["kind"], r["io"]) == ("twice", "forward", "input")]
    mul_in = [r for r in ops_ if r["type"] == "Tensor.__mul__" and r["io"] == "input"]
    assert [r["same_as"] for r in twice_in] == [r["same_as"] for r in mul_in] == [shared_out, shared_out]
