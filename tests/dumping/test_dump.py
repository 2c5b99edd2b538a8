"""aligner.dump / aligner.save on real torch and MindSpore runs of the twin models."""
from __future__ import annotations

import functools
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import aligner
from aligner.core.dtypes import from_stored
from aligner.core.errors import AlignerError
from aligner.dumping import writer
from aligner.dumping.manifest import MANIFEST, Record, iter_manifest
from aligner.metrics.stats import tensor_stats
from tests.support.twin_models import NAME_MAPS, example_input, make_twins

ms.set_context(mode=ms.PYNATIVE_MODE)


def read(directory: Path, calls: bool = False) -> tuple[dict, list[Record]]:
    """Header and tensor records (call signatures too with `calls`); an input recorded as a link (`same_as`) gets its
    producer's file and stats, as compare reads it."""
    lines = [item for _, item in iter_manifest(directory)]
    assert not [x for x in lines if isinstance(x, ValueError)]
    if not calls:
        lines = lines[:1] + [r for r in lines[1:] if r.kind != "call"]
    by_seq = {r.seq: r for r in lines[1:]}
    for r in lines[1:]:
        if r.same_as is not None:
            r.file, r.stats = by_seq[r.same_as].file, by_seq[r.same_as].stats
    return lines[0], lines[1:]


def load(directory: Path, rec: Record) -> np.ndarray:
    return from_stored(np.load(directory / rec.file), rec.dtype)


def torch_step(model: torch.nn.Module, x: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward + backward; returns the output and every parameter gradient."""
    model.zero_grad(set_to_none=True)
    out = model(torch.from_numpy(x))
    aligner.save("out", out)
    (out * out).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def ms_step(model: ms.nn.Cell, x: np.ndarray) -> tuple[ms.Tensor, tuple]:
    """Forward + backward through mindspore.value_and_grad; returns the loss and every parameter gradient."""
    def loss_fn(inp: ms.Tensor) -> ms.Tensor:
        out = model(inp)
        aligner.save("out", out)
        return (out * out).sum()

    return ms.value_and_grad(loss_fn, None, model.trainable_params())(ms.Tensor(x))


@pytest.fixture(scope="module", params=["cnn", "block"])
def twin_dumps(request, tmp_path_factory):
    """Both frameworks' full dumps (inputs too) of one training step of the same model."""
    kind = request.param
    tnet, mnet = make_twins(kind)
    x = example_input(kind)
    root = tmp_path_factory.mktemp(kind)
    with aligner.dump(tnet, root / "pt", inputs=True):
        torch_step(tnet, x)
    with aligner.dump(mnet, root / "ms", inputs=True):
        ms_step(mnet, x)
    return kind, tnet, root / "pt", root / "ms"


def key(rec: Record) -> tuple:
    return rec.module, rec.kind, rec.io, rec.index, rec.dtype, tuple(rec.shape)


def test_both_frameworks_record_the_same_tensors_in_the_same_order(twin_dumps):
    kind, _, pt, ms_dir = twin_dumps
    (hpt, rpt), (hms, rms) = read(pt), read(ms_dir)
    assert (hpt["framework"], hms["framework"]) == ("pytorch", "mindspore")
    assert hpt["mode"] == hms["mode"] == "full"
    for recs in (rpt, rms):
        assert [r.seq for r in recs] == sorted(r.seq for r in recs)
    for kind_ in ("forward", "backward", "probe"):
        assert [key(r) for r in rpt if r.kind == kind_] == [key(r) for r in rms if r.kind == kind_]
    # the same records are links in both (a gradient that is the one recorded just before it; in the block, the
    # Dropout (p=0) handing back its very input), though MindSpore hands tensors over as new Python objects: a cell
    # gets a copy of each input its gradients are taken on (linked by identity, the MindSpore hooks naming the
    # copies), a gradient views the same memory (linked at the flush, session.DEFER)
    # (a block's statistics records link by each framework's own object identity: left out)
    linked_pt = [key(r) for r in rpt if r.same_as is not None and r.kind != "block"]
    linked_ms = [key(r) for r in rms if r.same_as is not None and r.kind != "block"]
    assert linked_pt == linked_ms
    assert "grad_output" in {k[2] for k in linked_pt}
    assert "input" not in {k[2] for k in linked_pt + linked_ms}  # inputs=True: every input stored


@pytest.mark.parametrize("kind", ["cnn", "block"])
def test_both_frameworks_link_the_same_inputs(kind, tmp_path):
    """With the default inputs=None, an input that is an earlier output is a link in both frameworks: the MindSpore
    hooks record a cell's inputs before handing it copies, and name each copy to the session (identity, no wait for
    the op): the very same records are links."""
    tnet, mnet = make_twins(kind)
    x = example_input(kind)
    with aligner.dump(tnet, tmp_path / "pt"):
        torch_step(tnet, x)
    with aligner.dump(mnet, tmp_path / "ms"):
        ms_step(mnet, x)
    (_, rpt), (_, rms) = read(tmp_path / "pt"), read(tmp_path / "ms")
    # (a block's statistics records link by each framework's own object identity: left out)
    linked = [key(r) for r in rpt if r.same_as is not None and r.kind != "block"]
    linked_ms = [key(r) for r in rms if r.same_as is not None and r.kind != "block"]
    assert linked == linked_ms
    for keys in (linked, linked_ms):  # block: also a pass-through's output and grad_input (Dropout p=0)
        assert {("forward", "input"), ("backward", "grad_output")} <= {(k[1], k[2]) for k in keys} <= {
            ("forward", "input"), ("backward", "grad_output"), ("forward", "output"), ("backward", "grad_input")}
    # parameter names differ by framework (BatchNorm/LayerNorm gamma/beta): map them, order follows each autograd
    pgrad_pt = {(NAME_MAPS[kind][r.module], r.dtype, tuple(r.shape)) for r in rpt if r.kind == "param_grad"}
    pgrad_ms = {(r.module, r.dtype, tuple(r.shape)) for r in rms if r.kind == "param_grad"}
    assert pgrad_pt == pgrad_ms and len(pgrad_pt) == len([n for n in NAME_MAPS[kind].values() if "moving" not in n])
    assert all(r.dtype == "float32" for r in rpt + rms)


def test_every_module_has_forward_and_backward_records(twin_dumps):
    _, tnet, pt, _ = twin_dumps
    leaves = {n for n, m in tnet.named_modules() if n and next(m.children(), None) is None}
    _, recs = read(pt)
    for kind_, io in (("forward", "output"), ("backward", "grad_output")):
        assert {r.module for r in recs if (r.kind, r.io) == (kind_, io)} == leaves
    # every leaf's input is recorded, and the model's own input ("") too, as data or as a link to the record of the
    # call that returned it
    assert {r.module for r in recs if (r.kind, r.io) == ("forward", "input")} == leaves | {""}
    first = next(r.module for r in recs if r.kind == "forward" and r.module)  # fed data: no gradient flows out
    assert {r.module for r in recs if r.io == "grad_input"} == leaves - {first}
    assert {r.module for r in recs if r.kind == "param_grad"} == {n for n, _ in tnet.named_parameters()}


def test_dumped_values_are_the_models_values_in_both_frameworks(twin_dumps):
    kind, tnet, pt, ms_dir = twin_dumps
    (_, rpt), (_, rms) = read(pt), read(ms_dir)
    fwd_pt = [r for r in rpt if r.kind not in ("param_grad", "block")]  # a block record holds statistics only
    fwd_ms = [r for r in rms if r.kind not in ("param_grad", "block")]
    for a, b in zip(fwd_pt, fwd_ms):
        np.testing.assert_allclose(load(pt, a), load(ms_dir, b), rtol=1e-4, atol=1e-5, err_msg=str(key(a)))
    grads = {r.module: load(pt, r) for r in rpt if r.kind == "param_grad"}
    for name, p in tnet.named_parameters():  # the step inside the dump left these gradients
        assert np.array_equal(grads[name], p.grad.numpy())
    assert np.array_equal(load(pt, rpt[0]), example_input(kind))  # first record: the model input


class _Branchy(torch.nn.Module):
    """A chain, an `nn.Identity` handing its input to an in-place ReLU, a residual add and an output read by two
    modules: the gradient a module hands back is passed on unchanged (a chain, a pass-through), changed in place's
    stead, or summed over two consumers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
        self.skip, self.act = torch.nn.Identity(), torch.nn.ReLU(inplace=True)
        self.head1, self.head2 = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.skip(self.fc2(self.fc1(x))))
        h = self.fc3(h) + h
        return self.head1(h) * self.head2(h)


def test_gradients_linked_to_the_record_holding_them_are_the_modules_own(tmp_path):
    """Gradients recorded as links (the very memory of the gradient recorded before them) read back as exactly the
    gradients with respect to each module's output and input, computed independently by torch.autograd.grad; a
    gradient summed over two consumers is not linked. The Identity's output is its input (a link in forward too)."""
    torch.manual_seed(0)
    net, x = _Branchy(), torch.randn(4, 6, requires_grad=True)
    with aligner.dump(net, tmp_path / "d"):
        net(x).square().sum().backward()
    _, recs = read(tmp_path / "d")
    links = {(r.module, r.io) for r in recs if r.same_as is not None}
    assert {("fc1", "grad_output"), ("fc2", "grad_output"), ("skip", "grad_input"), ("skip", "output")} <= links
    assert ("head1", "grad_output") not in links
    outputs: dict[str, torch.Tensor] = {}
    inputs: dict[str, torch.Tensor] = {}

    def keep(name: str, module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        outputs[name], inputs[name] = out, args[0]
    handles = [m.register_forward_hook(functools.partial(keep, n)) for n, m in net.named_modules() if n]
    net.act.inplace = False  # the reference: fc2's output its own tensor (a grad_output is w.r.t. the value returned)
    loss = net(x).square().sum()
    for h in handles:
        h.remove()
    names = list(outputs)
    want = torch.autograd.grad(loss, [outputs[n] for n in names] + [inputs[n] for n in names])
    for io, wanted in (("grad_output", want[:len(names)]), ("grad_input", want[len(names):])):
        got = {r.module: load(tmp_path / "d", r) for r in recs if r.io == io}
        for name, w in zip(names, wanted):
            if name in ("fc3", "head1", "head2"):  # inputs read by two modules: the module's share is not the total
                continue
            np.testing.assert_array_equal(got[name], w.numpy(), err_msg=f"{name} {io}")


@pytest.mark.parametrize("kind", ["cnn", "block"])
def test_dump_does_not_change_torch_numbers(kind, tmp_path):
    tnet, _ = make_twins(kind)
    x = example_input(kind)
    out0, grads0 = torch_step(tnet, x)
    with aligner.dump(tnet, tmp_path / "d", leaves_only=False, inputs=True):
        out1, grads1 = torch_step(tnet, x)
    assert torch.equal(out0, out1)
    assert all(torch.equal(grads0[n], grads1[n]) for n in grads0)


@pytest.mark.parametrize("kind", ["cnn", "block"])
def test_dump_does_not_change_mindspore_numbers(kind, tmp_path):
    _, mnet = make_twins(kind, train=False)  # eval: BatchNorm statistics do not move between the two steps
    x = example_input(kind)
    loss0, grads0 = ms_step(mnet, x)
    with aligner.dump(mnet, tmp_path / "d", leaves_only=False, inputs=True):
        loss1, grads1 = ms_step(mnet, x)
    assert loss0.asnumpy().tobytes() == loss1.asnumpy().tobytes()
    assert all(a.asnumpy().tobytes() == b.asnumpy().tobytes() for a, b in zip(grads0, grads1))


class InplaceResidual(torch.nn.Module):
    """In-place activations and `+=` on a module output: what breaks register_full_backward_hook; an `nn.Identity`
    handing its input to an in-place activation (timm's `drop_block` before `act1`); an in-place module that
    changes nothing (Dropout in eval mode)."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
        self.act1, self.act2 = torch.nn.ReLU(inplace=inplace), torch.nn.ReLU(inplace=inplace)
        self.drop, self.act3 = torch.nn.Identity(), torch.nn.Dropout(0.5, inplace=inplace).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act1(self.drop(self.fc1(x)))
        z = self.act3(self.fc2(y))
        z += y
        return self.act2(z)


def test_torch_inplace_ops_keep_numbers_and_gradients(tmp_path):
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(0), requires_grad=True)
    results = {}
    for inplace in (True, False):
        torch.manual_seed(1)
        net = InplaceResidual(inplace)
        plain = net(x)
        with aligner.dump(net, tmp_path / str(inplace)):
            out = net(x)
            out.sum().backward()
        assert torch.equal(plain, out)
        _, recs = read(tmp_path / str(inplace))
        results[inplace] = {(r.kind, r.module, r.io): load(tmp_path / str(inplace), r) for r in recs}
    assert results[True].keys() == results[False].keys()
    assert ("backward", "act2", "grad_input") in results[True]
    for k, v in results[False].items():
        assert np.array_equal(results[True][k], v), k


def test_stats_only_writes_no_tensor_files(tmp_path):
    tnet, _ = make_twins("cnn")
    x = example_input("cnn")
    with aligner.dump(tnet, tmp_path / "full"):
        torch_step(tnet, x)
    tnet, _ = make_twins("cnn")
    with aligner.dump(tnet, tmp_path / "stats", stats_only=True):
        torch_step(tnet, x)
    header, stats = read(tmp_path / "stats")
    _, full = read(tmp_path / "full")
    assert header["mode"] == "stats" and os.listdir(tmp_path / "stats") == [MANIFEST]
    assert all(r.file is None for r in stats) and len(stats) == len(full)
    # dumps accumulate mean and L2 in the tensor's own precision (float32 here; float64 is 6x slower on the training
    # thread): within 1e-5 relative of the exact float64 statistics (float32 cascade sums of these few thousand
    # elements are off by ~1e-7 relative: 100x margin); extrema, NaN/Inf counts and fractions (exact below 65536
    # elements, all of this model's tensors) agree exactly
    for s, f in zip(stats, full):
        exact = tensor_stats(load(tmp_path / "full", f)).to_dict()
        for got in (s.stats.to_dict(), f.stats.to_dict()):
            assert {k: v for k, v in got.items() if k not in ("mean", "l2")} == \
                {k: v for k, v in exact.items() if k not in ("mean", "l2")}
            assert got["mean"] == pytest.approx(exact["mean"], rel=1e-5, abs=1e-7)
            assert got["l2"] == pytest.approx(exact["l2"], rel=1e-5)


def test_steps_select_and_append(tmp_path):
    tnet, _ = make_twins("cnn")
    x = example_input("cnn")
    for step in range(3):
        with aligner.dump(tnet, tmp_path / "d", step=step, steps=[0, 2], forward=True, backward=False):
            tnet(torch.from_numpy(x))
    lines = (tmp_path / "d" / MANIFEST).read_text().splitlines()
    assert sum('"format"' in line for line in lines) == 1
    _, recs = read(tmp_path / "d")
    assert sorted({r.step for r in recs}) == [0, 2]
    assert [r.seq for r in recs] == sorted(r.seq for r in recs)
    # training mode: BatchNorm running stats after forward; "block": the statistics of the modules with children
    assert {r.kind for r in recs} == {"forward", "buffer", "block"}


def test_identical_tensors_are_written_once(tmp_path):
    tnet, _ = make_twins("cnn", train=False)
    x = example_input("cnn")
    for step in range(2):  # eval mode, no grad: step 1 computes exactly what step 0 did
        with torch.no_grad(), aligner.dump(tnet, tmp_path / "d", step=step, inputs=False):
            out = tnet(torch.from_numpy(x))
            aligner.save("logits", out)
    _, recs = read(tmp_path / "d")
    files = {r.file for r in recs}
    # per step: 10 leaf outputs, the model's own output (a block record: a link to fc's) and the probe
    assert len(recs) == 2 * 12 and len(files) == len(os.listdir(tmp_path / "d" / "tensors")) < 11
    assert recs[10].kind == "block" and recs[10].same_as == recs[9].seq
    assert recs[9].file == recs[11].file  # fc output == the probe of it


def test_bfloat16_is_stored_losslessly(tmp_path):
    net = torch.nn.Linear(8, 4).to(torch.bfloat16)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with aligner.dump(net, tmp_path / "pt", inputs=False):
        out = net(x)
    cell = ms.nn.Dense(8, 4)
    bf = ms.Tensor(np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)).astype(ms.bfloat16)
    with aligner.dump(cell, tmp_path / "ms"):
        aligner.save("bf", bf)
    (_, [rpt]), (_, [rms]) = read(tmp_path / "pt"), read(tmp_path / "ms")
    assert rpt.dtype == rms.dtype == "bfloat16"
    assert np.load(tmp_path / "pt" / rpt.file).dtype == np.uint16
    assert load(tmp_path / "pt", rpt).tobytes() == out.detach().view(torch.int16).numpy().tobytes()
    assert load(tmp_path / "ms", rms).tobytes() == bf.asnumpy().tobytes()


def test_probes_are_numbered_in_call_order_and_ignored_outside_a_dump(tmp_path):
    aligner.save("outside", torch.ones(2))  # no active dump: nothing happens
    net = torch.nn.Linear(2, 2)
    with aligner.dump(net, tmp_path / "d", forward=False):
        for i in range(3):
            aligner.save("h", torch.full((2,), float(i)))
        aligner.save("arr", np.arange(3, dtype=np.int64))
    _, recs = read(tmp_path / "d")
    assert [(r.module, r.kind, r.index, r.dtype) for r in recs] == [
        ("h", "probe", 0, "float32"), ("h", "probe", 1, "float32"), ("h", "probe", 2, "float32"),
        ("arr", "probe", 0, "int64")]
    assert [load(tmp_path / "d", r)[0] for r in recs[:3]] == [0.0, 1.0, 2.0]


def test_include_exclude_and_all_modules(tmp_path):
    tnet, mnet = make_twins("block")
    x = example_input("block")
    with aligner.dump(tnet, tmp_path / "pt", include=r"^attn", exclude=r"\.(k|v)(\.|$)", leaves_only=False):
        torch_step(tnet, x)
    with aligner.dump(mnet, tmp_path / "ms", include=r"^attn", exclude=r"\.(k|v)(\.|$)", leaves_only=False):
        ms_step(mnet, x)
    for d in ("pt", "ms"):
        _, recs = read(tmp_path / d)
        fwd = [r.module for r in recs if r.kind == "forward" and r.io == "output"]
        assert fwd == ["attn.q", "attn.softmax", "attn.drop", "attn.out", "attn"]
        assert {r.module.rsplit(".", 1)[0] for r in recs if r.kind == "param_grad"} == {"attn.q", "attn.out"}
    with aligner.dump(tnet, tmp_path / "root", leaves_only=False, include="^$", backward=False):
        tnet(torch.from_numpy(x))
    assert [(r.module, r.type, r.io) for r in read(tmp_path / "root")[1]] == [
        ("", "TorchBlock", "input"), ("", "TorchBlock", "output")]


def test_refuses_bad_input(tmp_path):
    tnet, _ = make_twins("cnn")
    with pytest.raises(AlignerError, match="torch.nn.Module or a mindspore.nn.Cell, got OrderedDict"):
        aligner.dump(tnet.state_dict(), tmp_path / "a")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(AlignerError, match="not empty.*overwrite=True"):
        aligner.dump(tnet, tmp_path / "busy").__enter__()
    with pytest.raises(AlignerError, match="not an aligner dump"):
        aligner.dump(tnet, tmp_path / "busy", overwrite=True).__enter__()
    with pytest.raises(AlignerError, match="cannot create dump directory"):
        aligner.dump(tnet, tmp_path / "busy" / "notes.txt" / "sub").__enter__()
    with pytest.raises(AlignerError, match="is a file"):
        aligner.dump(tnet, tmp_path / "busy" / "notes.txt").__enter__()
    with pytest.raises(AlignerError, match="not a valid regular expression"):
        aligner.dump(tnet, tmp_path / "b", include="(")
    with pytest.raises(AlignerError, match="records nothing"):
        aligner.dump(tnet, tmp_path / "b", forward=False, backward=False)


def test_overwrite_replaces_a_previous_dump_from_another_process(tmp_path):
    target = tmp_path / "old"
    code = ("import torch, aligner; net = torch.nn.Linear(2, 2)\n"
            f"with aligner.dump(net, {str(target)!r}):\n    net(torch.ones(3, 2)).sum().backward()")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    old_files = set(os.listdir(target / "tensors"))
    net = torch.nn.Linear(2, 2)
    with aligner.dump(net, target, overwrite=True, backward=False, inputs=False):
        net(torch.ones(1, 2))
    header, recs = read(target)
    assert header["format"] == "aligner-dump" and len(recs) == 1
    assert not old_files & set(os.listdir(target / "tensors"))  # every file the old dump wrote is gone


def test_mindspore_graph_mode_is_refused(tmp_path):
    cell = ms.nn.Dense(2, 2)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(AlignerError, match="PYNATIVE_MODE"):
            aligner.dump(cell, tmp_path / "g")
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_write_errors_surface_on_exit(tmp_path):
    net = torch.nn.Linear(2, 2)
    with pytest.raises(AlignerError, match="writing dump .* failed"):
        with aligner.dump(net, tmp_path / "d"):
            (tmp_path / "d" / "tensors").write_text("not a directory")  # the writer cannot create tensors/
            net(torch.ones(1, 2))


def test_stats_only_write_errors_surface_in_one_line(tmp_path):
    net = torch.nn.Linear(2, 2)
    with pytest.raises(AlignerError, match="writing dump .* failed"):
        with aligner.dump(net, tmp_path / "d", stats_only=True):
            net(torch.ones(1, 2)).sum().backward()
            (tmp_path / "d" / MANIFEST).unlink()
            (tmp_path / "d" / MANIFEST).mkdir()  # the manifest cannot be appended to at exit


def test_stats_only_records_appended_in_batches_read_back_whole(tmp_path, monkeypatch):
    """A stats-only dump appends its records every FLUSH_RECORDS and at exit: flushing every 3 records writes the
    same manifest as one batch (seq, stats and all), so where the batches fall changes nothing."""
    tnet, _ = make_twins("cnn")
    tnet.eval()  # running statistics stay put, so both passes compute the same numbers
    x = torch.from_numpy(example_input("cnn"))
    manifests = []
    for flush in (writer.FLUSH_RECORDS, 3):
        monkeypatch.setattr(writer, "FLUSH_RECORDS", flush)
        with aligner.dump(tnet, tmp_path / str(flush), stats_only=True):
            tnet(x).sum().backward()
        manifests.append((tmp_path / str(flush) / MANIFEST).read_text().splitlines()[1:])
    assert len(manifests[0]) > 9 and manifests[0] == manifests[1]


def test_backward_after_the_context_is_not_recorded(tmp_path):
    net = torch.nn.Linear(2, 2)
    with aligner.dump(net, tmp_path / "d", inputs=False):
        out = net(torch.ones(1, 2))
    out.sum().backward()  # the hooks' session is closed: no crash, no record
    assert [r.kind for r in read(tmp_path / "d")[1]] == ["forward"]
    assert json.loads((tmp_path / "d" / MANIFEST).read_text().splitlines()[0])["framework_version"] == torch.__version__


def test_mindspore_jit_construct_is_refused_in_one_line(tmp_path):
    class Jitted(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.dense = ms.nn.Dense(4, 4)

        @ms.jit
        def construct(self, x):
            return self.dense(x)

    net = Jitted()
    with pytest.raises(AlignerError, match=r"construct of the model \(Jitted\) is compiled by @mindspore.jit") as info:
        with aligner.dump(net, tmp_path / "d"):
            net(ms.Tensor(np.ones((2, 4), np.float32)))
    assert len(str(info.value).splitlines()) == 1
    assert not net._forward_pre_hook and not net.dense._forward_hook  # nothing left registered


def test_call_records_say_how_each_module_was_called(tmp_path):
    """A replay calls each module back the way the model did: keyword names, non-tensor arguments, each input's
    place, and (once per step) the module's class and constructor attributes; params=True adds every parameter."""

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
            self.norm = torch.nn.LayerNorm(5, eps=1e-6)

        def forward(self, x: torch.Tensor, scale: float = 1.0, *, pair: tuple = ()) -> torch.Tensor:
            y = self.norm(self.conv(x) * scale)
            return self.norm(y + pair[0])

    model = Scaled()
    x, extra = torch.randn(2, 3, 5, 5), torch.randn(2, 4, 5, 5)
    with aligner.dump(model, tmp_path / "d", params=True, backward=False):
        model(x, 2.5, pair=(extra, "tag"))
    _, recs = read(tmp_path / "d", calls=True)
    calls = [r for r in recs if r.kind == "call"]
    assert [(c.module, c.args) for c in calls] == [
        ("", {"args": [{"tensor": 0}, 2.5], "kwargs": {"pair": {"tuple": [{"tensor": 1}, "tag"]}}}),
        ("conv", {"args": [{"tensor": 0}], "kwargs": {}}),
        ("norm", {"args": [{"tensor": 0}], "kwargs": {}}),
        ("norm", {"args": [{"tensor": 0}], "kwargs": {}})]
    assert calls[1].attrs is not None and calls[1].attrs["class"] == "torch.nn.modules.conv.Conv2d"
    assert calls[1].attrs["kernel_size"] == {"tuple": [3, 3]} and calls[1].attrs["padding"] == {"tuple": [1, 1]}
    assert calls[2].attrs is not None and calls[2].attrs["eps"] == 1e-6
    assert calls[3].attrs is None  # the second call of `norm` in this step: attributes already recorded
    inputs = [(r.module, r.arg) for r in recs if r.kind == "forward" and r.io == "input"]
    assert inputs == [("", "0"), ("", "pair/0"), ("conv", "0"), ("norm", "0"), ("norm", "0")]
    params = {r.module: load(tmp_path / "d", r) for r in recs if r.kind == "param"}
    assert set(params) == {"conv.weight", "norm.weight", "norm.bias"}
    np.testing.assert_array_equal(params["conv.weight"], model.conv.weight.detach().numpy())


def _takes_o_direct(folder: Path) -> bool:
    """Whether `folder`'s file system takes an O_DIRECT write of one aligned block (tmpfs does not)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    block = mmap.mmap(-1, 4096)
    try:
        fd = os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o666)
    except OSError:
        return False
    try:
        return os.write(fd, block) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)
        (folder / ".probe").unlink()


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["float32", "float64", "float16", "int64", "int8", "bool", ">f4", "complex64"]),
       shape=st.lists(st.integers(0, 7), max_size=4), order=st.sampled_from("CF"),
       wide=st.sampled_from([0, 4096 // 8 - 1, 4096 // 8, 3 * 4096 // 8 + 5]))
def test_direct_writes_are_what_np_save_writes(tmp_path_factory, dtype, shape, order, wide):
    """An O_DIRECT tensor file reads back equal to the array, in np.save's bytes for a C-order array (a Fortran-order
    one is written in C order, the same values), whatever the length's alignment (no whole block, a file just short
    of or just past a block boundary, several blocks and a tail); the one buffer is reused."""
    shape = shape + [wide] if wide else shape
    array = np.asarray(np.random.default_rng(0).standard_normal(shape) * 100, order=order).astype(dtype)
    folder = tmp_path_factory.mktemp("direct")
    if not _takes_o_direct(folder):
        pytest.skip("this file system does not take O_DIRECT")
    direct = writer.DirectWriter(min_bytes=0)
    for name in ("a.npy", "b.npy"):  # twice: the reused buffer holds the last file's tail, cut off by the length
        assert direct.save(folder / name, array)
        back = np.load(folder / name)
        assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)
    np.save(folder / "ref.npy", np.array(array, order="C"))  # not ascontiguousarray: it makes a 0-d array 1-d
    assert (folder / "a.npy").read_bytes() == (folder / "ref.npy").read_bytes()


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float32", "float64", "float16", "int64", "int8", "bool", ">f4", "complex64"]),
       shape=st.lists(st.integers(0, 7), max_size=4), order=st.sampled_from("CF"), step=st.sampled_from([1, 2]),
       wide=st.sampled_from([0, writer.SMALL_FILE_BYTES // 8 - 1, writer.SMALL_FILE_BYTES // 8]))
def test_page_cache_writes_are_what_np_save_writes(tmp_path_factory, dtype, shape, order, step, wide):
    """A file under the O_DIRECT size (header and data in one write, or two past SMALL_FILE_BYTES) holds np.save's
    bytes for the C-order array, whatever its order or strides; a 0-d array stays 0-d."""
    shape = shape + [wide] if wide else shape
    array = np.asarray(np.random.default_rng(0).standard_normal(shape) * 100, order=order).astype(dtype)
    if step == 2 and array.ndim:
        array = array[..., ::2]
    folder = tmp_path_factory.mktemp("cached")
    writer.DirectWriter(min_bytes=1 << 62).write(folder / "a.npy", array)
    np.save(folder / "ref.npy", np.array(array, order="C"))
    assert (folder / "a.npy").read_bytes() == (folder / "ref.npy").read_bytes()
    back = np.load(folder / "a.npy")
    assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)


@pytest.mark.parametrize("size", [16, 1 << 20])  # through the page cache; with O_DIRECT where the file system takes it
def test_a_link_planted_at_a_tensor_files_name_is_never_written_through(tmp_path, size):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "a.npy.tmp").symlink_to(victim)
    with pytest.raises(OSError):
        writer.DirectWriter().write(tmp_path / "a.npy.tmp", np.zeros(size, np.float32))
    assert victim.read_text() == "keep"


def test_a_dump_whose_temporary_name_was_taken_by_a_link_fails_in_one_line(tmp_path):
    """Someone who can write into the dump plants a link where the writer will put its next file: the dump refuses
    to write through it (AlignerError at the exit) and the link's target is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    probe = np.arange(4.0)
    with aligner.dump(torch.nn.Linear(2, 2), tmp_path / "d", step=0):
        aligner.save("first", np.zeros(3))  # makes tensors/
    (tmp_path / "d" / "tensors" / f".{writer.digest(probe)}.npy.tmp").symlink_to(victim)
    with pytest.raises(AlignerError, match="writing dump .* failed: .*Too many levels of symbolic links"):
        with aligner.dump(torch.nn.Linear(2, 2), tmp_path / "d", step=1):
            aligner.save("probe", probe)
    assert victim.read_text() == "keep"


def test_a_stats_only_dump_never_appends_through_a_link_planted_at_its_manifest(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    net = torch.nn.Linear(2, 2)
    with pytest.raises(AlignerError, match="writing dump .* failed: .*Too many levels of symbolic links"):
        with aligner.dump(net, tmp_path / "d", stats_only=True):
            net(torch.ones(1, 2)).sum().backward()
            (tmp_path / "d" / MANIFEST).unlink()
            (tmp_path / "d" / MANIFEST).symlink_to(victim)  # appended to at the exit
    assert victim.read_text() == "keep"


def test_only_files_of_min_bytes_or_more_are_written_direct(tmp_path):
    """A file under `min_bytes` of data is left to the caller (the page cache: an O_DIRECT write waits for the disk
    whatever its size); one of `min_bytes` is written direct, in np.save's bytes."""
    if not _takes_o_direct(tmp_path):
        pytest.skip("this file system does not take O_DIRECT")
    direct = writer.DirectWriter(min_bytes=1024)
    assert not direct.save(tmp_path / "small.npy", np.zeros(255, np.float32))
    assert not (tmp_path / "small.npy").exists()
    exact = np.arange(256, dtype=np.float32)
    assert direct.save(tmp_path / "exact.npy", exact)
    np.save(tmp_path / "ref.npy", exact)
    assert (tmp_path / "exact.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    assert writer.DirectWriter().min_bytes == writer.DIRECT_MIN_BYTES


def test_a_dump_on_a_file_system_without_o_direct_is_written_the_usual_way(tmp_path, monkeypatch):
    """Where O_DIRECT is refused (the writer marks it unsupported), tensor files are written with np.save."""
    monkeypatch.setattr(writer, "DIRECT_MIN_BYTES", 0)  # every file direct, where the file system takes it
    tnet, _ = make_twins("cnn")
    with aligner.dump(tnet, tmp_path / "direct"):
        torch_step(tnet, example_input("cnn"))
    refused = writer.DirectWriter.save
    try:
        writer.DirectWriter.save = lambda self, path, array: False  # type: ignore[method-assign]
        tnet, _ = make_twins("cnn")
        with aligner.dump(tnet, tmp_path / "usual"):
            torch_step(tnet, example_input("cnn"))
    finally:
        writer.DirectWriter.save = refused  # type: ignore[method-assign]
    files = {p.name: p.read_bytes() for p in (tmp_path / "direct" / "tensors").iterdir()}
    assert files == {p.name: p.read_bytes() for p in (tmp_path / "usual" / "tensors").iterdir()} and files


def test_a_closed_dump_holds_no_tensor(tmp_path):
    """Once its context has exited, nothing of a dump stays alive: the hooks left on the step's tensors refer back to
    the session, which held the recent outputs for links, so every step's session, writer and tensors used to live on
    (a full dump's memory grew with its length: 70 MiB a step on bench_memory.py's MLP)."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(inplace=True), torch.nn.Identity(),
                                torch.nn.Linear(8, 8))
    x = torch.randn(4, 8)
    sessions = []
    for step in range(3):
        with aligner.dump(model, tmp_path / "d", step=step) as dump:
            sessions.append(weakref.ref(dump.session))
            model(x).square().mean().backward()
    gc.collect()
    assert [s() for s in sessions] == [None, None, None]
