"""MindSpore dumps on a CPU target keep what they record until a flush (aligner.dumping.session.DEFER): the records,
their statistics, their files and their links are those of reading every tensor at once, whatever the bound on the
bytes held; a Parameter is recorded as it was when its hook ran, not as the optimizer left it."""
from __future__ import annotations

from pathlib import Path

import mindspore as ms
import msgspec
import numpy as np
import pytest

import aligner
from aligner.dumping import session
from aligner.dumping.manifest import Record, iter_manifest
from aligner.metrics.stats import tensor_stats
from tests.support.twin_models import example_input, make_twins


def train_step(model: ms.nn.Cell, x: np.ndarray) -> None:
    """Forward, backward and an SGD update (which changes every Parameter in place)."""
    opt = ms.nn.SGD(model.trainable_params(), learning_rate=0.5)
    grads = ms.value_and_grad(lambda v: model(v).square().mean(), None, opt.parameters)(ms.Tensor(x))[1]
    opt(grads)


def records(directory: Path) -> list[dict]:
    """Every record of a dump as a dict (tensor files are named by their content: same data, same name)."""
    items = [item for _, item in iter_manifest(directory)][1:]
    assert all(isinstance(item, Record) for item in items)
    return [msgspec.structs.asdict(item) for item in items]


def dump_both_ways(tmp_path: Path, kind: str, defer_bytes: int, monkeypatch: pytest.MonkeyPatch,
                   **options: object) -> tuple[list[dict], list[dict]]:
    """The same training step of two identical models dumped at once (DEFER off) and deferred."""
    out = []
    for defer in (False, True):
        _, model = make_twins(kind)
        monkeypatch.setattr(session, "DEFER", defer)
        monkeypatch.setattr(session, "DEFER_BYTES", defer_bytes)
        with aligner.dump(model, tmp_path / str(defer), **options):
            train_step(model, example_input(kind))
        out.append(records(tmp_path / str(defer)))
    return out[0], out[1]


@pytest.mark.parametrize("defer_bytes", [1, 256 << 20], ids=["flush-each", "flush-at-exit"])
@pytest.mark.parametrize("stats_only", [True, False], ids=["stats", "full"])
def test_deferred_records_are_those_read_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stats_only: bool,
                                                 defer_bytes: int) -> None:
    at_once, deferred = dump_both_ways(tmp_path, "cnn", defer_bytes, monkeypatch, stats_only=stats_only,
                                       params=True)
    assert len(deferred) == len(at_once) > 40
    assert deferred == at_once  # statistics, files (content-addressed), links, order: all the same
    kinds = {r["kind"] for r in deferred}
    assert {"forward", "backward", "param_grad", "param", "buffer"} <= kinds
    assert any(r["same_as"] is not None for r in deferred if r["kind"] == "backward")  # gradient links kept


def test_a_parameter_is_recorded_before_the_optimizer_changes_it(tmp_path: Path) -> None:
    """params=True records each Parameter as the step starts; the update in place comes after, before the flush."""
    assert session.DEFER
    _, model = make_twins("cnn")
    before = {p.name: p.asnumpy().copy() for p in model.trainable_params()}
    with aligner.dump(model, tmp_path / "d", stats_only=True, params=True):
        train_step(model, example_input("cnn"))
    after = {p.name: p.asnumpy() for p in model.trainable_params()}
    params = {r["module"]: r["stats"].to_dict() for r in records(tmp_path / "d") if r["kind"] == "param"}
    assert set(before) <= set(params)
    for name, value in before.items():
        assert not np.array_equal(value, after[name])  # the optimizer did change it
        assert params[name] == pytest.approx(tensor_stats(value).to_dict(), rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("wait", [True, False])
def test_a_waited_dump_lends_the_writer_mindspore_memory_at_its_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      wait: bool) -> None:
    """The flush at a waited context's exit hands the writer each tensor's memory (no copy: the writer is done before
    the context returns); unwaited, or flushed during the step (DEFER_BYTES reached), it hands copies."""
    from aligner.dumping import writer

    handed: list[np.ndarray] = []
    put_many = writer.BackgroundWriter.put_many

    def spy(self: writer.BackgroundWriter, items: list[tuple[Record, np.ndarray | None]]) -> None:
        handed.extend(array for _, array in items if array is not None)
        put_many(self, items)
    monkeypatch.setattr(writer.BackgroundWriter, "put_many", spy)
    _, model = make_twins("cnn")
    with aligner.dump(model, tmp_path / "exit", wait=wait):
        train_step(model, example_input("cnn"))
    aligner.wait_dumps()
    assert len(handed) > 20
    assert all(a.flags.owndata != wait for a in handed)  # lent: none owns its memory; copies: all do
    handed.clear()
    monkeypatch.setattr(session, "DEFER_BYTES", 1)  # a flush after every record, inside the step
    with aligner.dump(model, tmp_path / "step", wait=wait):
        train_step(model, example_input("cnn"))
    aligner.wait_dumps()
    assert len(handed) > 20 and all(a.flags.owndata for a in handed[:-1])


class _SharedNorm(ms.nn.Cell):
    """One BatchNorm called twice in a forward: its second call rewrites the moving statistics its first call's
    records hold until the flush."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = ms.nn.Conv2d(3, 4, 3, pad_mode="same")
        self.bn = ms.nn.BatchNorm2d(4)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        y = self.bn(self.conv(x))
        return self.bn(y * 3.0 + 1.0)


@pytest.mark.parametrize("stats_only", [True, False], ids=["stats", "full"])
def test_a_buffer_rewritten_later_in_the_step_is_recorded_as_its_call_left_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stats_only: bool) -> None:
    """Each call's buffer records are the moving statistics as that call left them (the held copy is queued behind
    the call's BatchNorm and ahead of the next one), the same as reading them at once."""
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    out = []
    for defer in (False, True):
        ms.set_seed(0)
        model = _SharedNorm()
        model.set_train(True)
        monkeypatch.setattr(session, "DEFER", defer)
        with aligner.dump(model, tmp_path / str(defer), stats_only=stats_only, backward=False):
            model(ms.Tensor(x))
        out.append([r for r in records(tmp_path / str(defer)) if r["kind"] == "buffer"])
    at_once, deferred = out
    assert len(at_once) == 4  # two calls, two statistics each
    first, second = (r for r in at_once if r["io"] == "running_mean")
    assert first["stats"] != second["stats"]  # the second call did rewrite them
    assert deferred == at_once
