"""A dump never breaks the user's forward (issue 27, item 7): a tensor no reader supports (a rotary module returning
complex64), a tensor layout the hooks cannot read (torch sparse) or an exception in a hook becomes a skipped record
with its reason; the forward and backward give what they give without the dump, and compare lists the record as
not compared, saying why."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import nn, ops

import aligner
from aligner.dumping.manifest import Record, read_manifest
from tests.support.cli import align_in_process

ms.set_context(mode=ms.PYNATIVE_MODE)

COMPLEX = "unsupported dtype complex64"


class TorchRotary(torch.nn.Module):
    """Returns e^(i x) as complex64, as a rotary table built with torch.polar does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.polar(torch.ones_like(x), x)


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.rotary = TorchRotary()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.rotary(self.proj(x))
        return self.head(torch.cat((z.real, z.imag), -1))


class MsRotary(nn.Cell):
    """Returns cos x + i sin x as complex64 (ops.Complex)."""

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return ops.Complex()(ops.cos(x), ops.sin(x))


class MsNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Dense(4, 4)
        self.rotary = MsRotary()
        self.head = nn.Dense(8, 2)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        z = self.rotary(self.proj(x))
        return self.head(ops.cat((ops.real(z), ops.imag(z)), -1))


def twins() -> tuple[TorchNet, MsNet]:
    """The two nets with the same weights."""
    torch.manual_seed(0)
    pt, net = TorchNet(), MsNet()
    for name in ("proj", "head"):
        layer = getattr(pt, name)
        cell = getattr(net, name)
        cell.weight.set_data(ms.Tensor(layer.weight.detach().numpy()))
        cell.bias.set_data(ms.Tensor(layer.bias.detach().numpy()))
    return pt, net


X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


def torch_step(model: torch.nn.Module) -> tuple[np.ndarray, list[np.ndarray]]:
    """Forward and backward: the output and every parameter gradient."""
    model.zero_grad(set_to_none=True)
    out = model(torch.from_numpy(X))
    out.square().sum().backward()
    return out.detach().numpy(), [p.grad.numpy().copy() for p in model.parameters()]


def ms_step(model: nn.Cell) -> tuple[np.ndarray, list[np.ndarray]]:
    """Forward and backward in one value_and_grad: the output and every parameter gradient."""
    def loss(x: ms.Tensor) -> tuple[ms.Tensor, ms.Tensor]:
        out = model(x)
        return out.square().sum(), out

    (_, out), grads = ms.value_and_grad(loss, None, model.trainable_params(), has_aux=True)(ms.Tensor(X))
    return out.asnumpy(), [g.asnumpy() for g in grads]


def dumped(model: Any, step: Any, directory: Path, stats_only: bool) -> tuple[Any, list[Record], Any]:
    """Run `step` inside a dump: what it returned, the dump's records (every line read: none may be a problem) and
    the context (its `skipped` counts)."""
    with aligner.dump(model, directory, stats_only=stats_only) as ctx:
        result = step(model)
    header, records, problems = read_manifest(directory)
    assert header is not None and not problems, problems
    return result, records, ctx


def assert_same(got: tuple[np.ndarray, list[np.ndarray]], want: tuple[np.ndarray, list[np.ndarray]]) -> None:
    """The dumped run's output and gradients are bit for bit those of the run without the dump."""
    np.testing.assert_array_equal(got[0], want[0])
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("stats_only", [True, False], ids=["stats", "full"])
@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_complex_output_is_a_skipped_record(tmp_path: Path, framework: str, stats_only: bool) -> None:
    """The rotary output and its gradient are skipped records naming complex64; every other record is stored."""
    model = twins()[framework == "mindspore"]
    step = ms_step if framework == "mindspore" else torch_step
    want = step(model)
    got, records, ctx = dumped(model, step, tmp_path / "d", stats_only)
    assert_same(got, want)
    skipped = [r for r in records if r.skipped]
    assert {(r.module, r.kind, r.io, r.dtype, r.skipped) for r in skipped} == {
        ("rotary", "forward", "output", "complex64", COMPLEX),
        ("rotary", "backward", "grad_output", "complex64", COMPLEX)}
    assert all(r.file is None and r.stats is None and r.shape == [3, 4] for r in skipped)
    assert sum(ctx.skipped.values()) == len(skipped) and set(ctx.skipped) == {COMPLEX}
    stored = [r for r in records if r.kind != "call" and not r.skipped and r.same_as is None]
    assert {r.module for r in stored if r.kind == "forward"} >= {"proj", "head"}
    assert all((r.file is not None) != stats_only and r.stats is not None for r in stored)


@pytest.mark.parametrize("stats_only", [True, False], ids=["stats", "full"])
def test_compare_lists_the_skipped_records_with_their_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             stats_only: bool) -> None:
    """Both sides skipped the rotary output: compare lists it as not compared, says why, and still compares and
    passes everything else (exit 0 without --strict, exit 1 with it)."""
    pt, net = twins()
    dumped(pt, torch_step, tmp_path / "pt", stats_only)
    dumped(net, ms_step, tmp_path / "ms", stats_only)
    proc = align_in_process(capsys, "compare", tmp_path / "ms", tmp_path / "pt", "--json", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    reasons = {(r["kind"], r["module"]): r["skipped"] for r in report["rows"] if r["status"] == "skipped"}
    both = f"the migrated dump did not store it ({COMPLEX}); the reference dump did not store it ({COMPLEX})"
    assert reasons == {("forward", "rotary"): both, ("backward", "rotary"): both}, reasons
    assert report["counts"]["skipped"] == 2 and report["counts"]["compared"] > 0
    assert {r["status"] for r in report["rows"]} <= {"ok", "skipped", "folded"}
    text = align_in_process(capsys, "compare", tmp_path / "ms", tmp_path / "pt").stdout
    assert "2 record(s) could not be compared" in text and COMPLEX in text
    strict = align_in_process(capsys, "compare", tmp_path / "ms", tmp_path / "pt", "--strict")
    assert strict.returncode == 1


def test_one_side_skipped_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only the MindSpore side returns complex64 (the PyTorch port keeps cos/sin as a real pair): the row says that
    the migrated dump did not store it, and which dtype it was."""

    class RealPair(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat((x.cos(), x.sin()), -1)

    class Flat(TorchNet):
        def __init__(self) -> None:
            super().__init__()
            self.rotary = RealPair()  # type: ignore[assignment]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rotary(self.proj(x)))

    pt, net = twins()
    flat = Flat()
    flat.load_state_dict(pt.state_dict())
    dumped(flat, torch_step, tmp_path / "pt", False)
    dumped(net, ms_step, tmp_path / "ms", False)
    align_in_process(capsys, "compare", tmp_path / "ms", tmp_path / "pt", "--json", tmp_path / "r.json")
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    row = next(r for r in rows if r["module"] == "rotary" and r["kind"] == "forward" and r["io"] == "output")
    assert row["status"] == "skipped" and row["skipped"] == f"the migrated dump did not store it ({COMPLEX})"


class Sparse(torch.nn.Module):
    """Returns a sparse COO tensor: no strided memory, which neither the statistics nor the host copy can read."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).to_sparse()


class SparseNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.sparse = Sparse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sparse(self.proj(x)).to_dense()


@pytest.mark.parametrize("stats_only", [True, False], ids=["stats", "full"])
def test_a_tensor_the_hooks_cannot_read_is_skipped(tmp_path: Path, stats_only: bool) -> None:
    """A sparse output (float32, a supported dtype): the record says which exception reading it met."""
    torch.manual_seed(0)
    model = SparseNet()
    want = torch_step(model)
    got, records, ctx = dumped(model, torch_step, tmp_path / "d", stats_only)
    assert_same(got, want)
    skipped = [r for r in records if r.skipped]
    assert skipped and all(r.module == "sparse" and r.dtype == "float32" for r in skipped)
    forward = next(r for r in skipped if r.kind == "forward")
    assert forward.io == "output" and forward.shape == [3, 4]
    assert forward.skipped.startswith(("RuntimeError: ", "TypeError: ", "NotImplementedError: ")), forward.skipped
    assert "\n" not in forward.skipped and len(forward.skipped) < 260
    assert sum(ctx.skipped.values()) == len(skipped)


class Unprintable:
    """A value whose repr raises: in a list attribute, a call record (full dumps) cannot describe the module holding it
    (an attribute that is such a value alone is left out without its repr being asked for)."""

    def __repr__(self) -> str:
        raise ValueError("no repr for you")


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_an_exception_in_a_hook_is_a_skipped_record(tmp_path: Path, framework: str) -> None:
    """A layer whose attributes the call record cannot describe: the forward runs as without the dump, the call's
    inputs are one skipped record naming the exception, and its output is stored."""
    torch.manual_seed(0)
    model: Any = torch.nn.Sequential(torch.nn.Linear(4, 2)) if framework == "pytorch" else \
        nn.SequentialCell(nn.Dense(4, 2))
    step = ms_step if framework == "mindspore" else torch_step
    want = step(model)
    object.__setattr__(model[0], "odd", [Unprintable()])
    got, records, ctx = dumped(model, step, tmp_path / "d", False)
    assert_same(got, want)
    failed = [r for r in records if r.skipped]
    assert [(r.module, r.kind, r.io, r.skipped) for r in failed] == [("0", "forward", "input",
                                                                      "ValueError: no repr for you")]
    assert any(r.module == "0" and r.io == "output" and r.file for r in records)
    assert ctx.skipped == {"ValueError: no repr for you": 1}
