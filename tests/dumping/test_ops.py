"""Op-level dumps (`aligner.dump(ops=True, scope=...)`) of real torch and MindSpore models: what is recorded (every
op inside the scope module's forward, with links, data and the calling source line), what is not (metadata calls,
aligner's own tensor calls, ops outside the scope), and that every hook is gone after the context, even when the
forward raises. The twin attention models here are shared with tests/pipelines/compare/test_ops.py."""
from __future__ import annotations

import inspect
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import mint, ops

import aligner
from aligner.core.dtypes import from_stored
from aligner.core.errors import AlignerError
from aligner.dumping.manifest import Record, iter_manifest

ms.set_context(mode=ms.PYNATIVE_MODE)

DIM, HEADS, TOKENS, BATCH = 16, 2, 5, 2
HEAD = DIM // HEADS


# ------------------------------------------------------------------------------------------------ the twin models

class PtAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.scale = HEAD ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, HEADS, HEAD).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = q @ k.transpose(-2, -1) * self.scale  # marker: scale
        attn = attn.softmax(dim=-1)  # marker: softmax
        out = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out)


class PtNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.attn = PtAttention()
        self.head = torch.nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.attn(self.norm(x))))


class MsAttention(ms.nn.Cell):
    """The same attention with MindSpore primitives built in __init__; `factor` and `axis` inject bugs."""

    def __init__(self, factor: float = 1.0, axis: int = -1, functional: bool = False) -> None:
        super().__init__()
        self.qkv = ms.nn.Dense(DIM, 3 * DIM)
        self.proj = ms.nn.Dense(DIM, DIM)
        self.scale = HEAD ** -0.5 * factor
        self.q_matmul_k = ops.BatchMatMul(transpose_b=True)
        self.attn_matmul_v = ops.BatchMatMul()
        self.softmax = ops.Softmax(axis=axis)
        self.axis, self.functional = axis, functional

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        b, n, c = x.shape
        qkv = ops.transpose(self.qkv(x).reshape(b, n, 3, HEADS, HEAD), (2, 0, 3, 1, 4))
        q, k, v = ops.unstack(qkv, axis=0)
        attn = self.q_matmul_k(q, k) * self.scale  # marker: scale
        attn = ops.softmax(attn, axis=self.axis) if self.functional else self.softmax(attn)  # marker: softmax
        out = ops.transpose(self.attn_matmul_v(attn, v), (0, 2, 1, 3)).reshape(b, n, c)
        return self.proj(out)


class MsNet(ms.nn.Cell):
    def __init__(self, **bug: float) -> None:
        super().__init__()
        self.norm = ms.nn.LayerNorm((DIM,), epsilon=1e-5)
        self.attn = MsAttention(**bug)  # type: ignore[arg-type]
        self.head = ms.nn.Dense(DIM, 4)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.head(ops.relu(self.attn(self.norm(x))))


def twins(**bug: float) -> tuple[PtNet, MsNet, np.ndarray]:
    """A torch net, its MindSpore twin holding the same weights (with an optional bug), and an input."""
    torch.manual_seed(0)
    pt = PtNet().eval()
    msn = MsNet(**bug)
    msn.set_train(False)
    weights = {k: v.detach().numpy() for k, v in pt.state_dict().items()}
    names = {"norm.weight": "norm.gamma", "norm.bias": "norm.beta"}
    params = {p.name: p for p in msn.get_parameters()}
    for key, value in weights.items():
        params[names.get(key, key)].set_data(ms.Tensor(value))
    x = np.random.default_rng(0).standard_normal((BATCH, TOKENS, DIM)).astype(np.float32)
    return pt, msn, x


def dump_torch(model: torch.nn.Module, x: np.ndarray, directory: Path, **kw: object) -> None:
    with torch.no_grad(), aligner.dump(model, directory, ops=True, **kw):  # type: ignore[arg-type]
        model(torch.from_numpy(x))


def dump_ms(model: ms.nn.Cell, x: np.ndarray, directory: Path, **kw: object) -> None:
    with aligner.dump(model, directory, ops=True, **kw):  # type: ignore[arg-type]
        model(ms.Tensor(x))


def records(directory: Path) -> list[Record]:
    lines = [item for _, item in iter_manifest(directory)]
    assert not [x for x in lines if isinstance(x, ValueError)]
    return [r for r in lines[1:] if isinstance(r, Record)]


def data(directory: Path, rec: Record, recs: list[Record]) -> np.ndarray:
    """A record's tensor, following a link to the record that holds it."""
    if rec.same_as is not None:
        rec = next(r for r in recs if r.seq == rec.same_as)
    assert rec.file is not None
    return from_stored(np.load(directory / rec.file), rec.dtype)


def marker_line(cls: type, marker: str) -> str:
    """'file:line' of the line of `cls`'s forward/construct holding `# marker: <marker>`."""
    fn = getattr(cls, "forward", None) or cls.construct  # type: ignore[attr-defined]
    lines, start = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if f"# marker: {marker}" in line)
    return f"{inspect.getsourcefile(fn)}:{start + offset}"


def op_calls(recs: list[Record]) -> list[tuple[str, list[Record]]]:
    """The op calls in order: (type, the call's records)."""
    calls: dict[int, list[Record]] = {}
    for r in recs:
        if r.kind == "op":
            assert r.call is not None
            calls.setdefault(r.call, []).append(r)
    return [(rs[0].type, rs) for rs in calls.values()]


# ------------------------------------------------------------------------------------------------------- tests

def test_torch_records_every_op_of_the_scope_in_order(tmp_path: Path) -> None:
    pt, _, x = twins()
    dump_torch(pt, x, tmp_path / "pt", scope="attn")
    recs = records(tmp_path / "pt")
    calls = op_calls(recs)
    attn_ops = [t for t, rs in calls if rs[0].module == "attn"]
    assert attn_ops == ["Tensor.reshape", "Tensor.permute", "Tensor.unbind", "Tensor.transpose", "Tensor.matmul",
                        "Tensor.mul", "Tensor.softmax", "Tensor.matmul", "Tensor.transpose", "Tensor.reshape"]
    # ops inside the scope's children: parent = innermost running module; nothing outside the scope
    assert {rs[0].module for _, rs in calls} == {"attn", "attn.qkv", "attn.proj"}
    assert [t for t, rs in calls if rs[0].module == "attn.qkv"] == ["F.linear"]
    assert all(r.parent == r.module for r in recs if r.kind == "op")
    # one call id per op call, distinct from every module call's
    module_calls = {r.call for r in recs if r.kind == "forward"}
    assert len({rs[0].call for _, rs in calls}) == len(calls) and not module_calls & {rs[0].call for _, rs in calls}
    # the source is the model's line; the mul's input links to the matmul output, the scaled values are right
    scale_call = next(rs for t, rs in calls if t == "Tensor.mul")
    assert {r.source for r in scale_call} == {marker_line(PtAttention, "scale")}
    matmul_out = next(r for t, rs in calls if t == "Tensor.matmul" for r in rs if r.io == "output")
    mul_in = next(r for r in scale_call if r.io == "input")
    mul_out = next(r for r in scale_call if r.io == "output")
    assert mul_in.same_as == matmul_out.seq and mul_in.file is None
    np.testing.assert_allclose(data(tmp_path / "pt", mul_out, recs),
                               data(tmp_path / "pt", matmul_out, recs) * HEAD ** -0.5, rtol=1e-6)
    softmax_out = next(r for t, rs in calls if t == "Tensor.softmax" for r in rs if r.io == "output")
    np.testing.assert_allclose(data(tmp_path / "pt", softmax_out, recs).sum(-1), 1.0, rtol=1e-5)
    # F.linear's weight is stored (no earlier record holds it); module records are still written
    linear = next(rs for t, rs in calls if t == "F.linear")
    assert [(r.io, r.index, r.shape) for r in linear] == [("input", 0, [BATCH, TOKENS, DIM]),
                                                          ("input", 1, [3 * DIM, DIM]), ("input", 2, [3 * DIM]),
                                                          ("output", 0, [BATCH, TOKENS, 3 * DIM])]
    np.testing.assert_array_equal(data(tmp_path / "pt", linear[1], recs), pt.attn.qkv.weight.detach().numpy())
    assert {r.module for r in recs if r.kind == "forward"} >= {"norm", "attn.qkv", "attn.proj", "head"}


def test_mindspore_records_primitives_functions_and_operators(tmp_path: Path) -> None:
    _, msn, x = twins()
    dump_ms(msn, x, tmp_path / "ms", scope="attn")
    recs = records(tmp_path / "ms")
    calls = op_calls(recs)
    attn_ops = [t for t, rs in calls if rs[0].module == "attn"]
    assert attn_ops == ["Tensor.reshape", "ops.transpose", "ops.unstack", "ops.BatchMatMul", "Tensor.__mul__",
                        "ops.Softmax", "ops.BatchMatMul", "ops.transpose", "Tensor.reshape"]
    # nn.Dense's own primitives, recorded under the Dense; ops outside the scope (norm, relu, head) are not
    assert {rs[0].module for _, rs in calls} == {"attn", "attn.qkv", "attn.proj"}
    assert [t for t, rs in calls if rs[0].module == "attn.qkv"] == ["ops.Reshape", "ops.MatMul", "ops.BiasAdd",
                                                                     "ops.Reshape"]
    scale_call = next(rs for t, rs in calls if t == "Tensor.__mul__")
    assert {r.source for r in scale_call} == {marker_line(MsAttention, "scale")}
    bmm_out = next(r for t, rs in calls if t == "ops.BatchMatMul" for r in rs if r.io == "output")
    mul_in = next(r for r in scale_call if r.io == "input")
    mul_out = next(r for r in scale_call if r.io == "output")
    assert mul_in.same_as == bmm_out.seq
    np.testing.assert_allclose(data(tmp_path / "ms", mul_out, recs),
                               data(tmp_path / "ms", bmm_out, recs) * HEAD ** -0.5, rtol=1e-6)


def test_mindspore_op_calling_ops_is_one_record(tmp_path: Path) -> None:
    """ops.softmax calls the Softmax primitive inside: one op call, named as the model called it."""
    _, msn, x = twins(functional=True)
    dump_ms(msn, x, tmp_path / "ms", scope="attn")
    types = [t for t, _ in op_calls(records(tmp_path / "ms"))]
    assert types.count("ops.softmax") == 1 and "ops.Softmax" not in types


def test_no_scope_records_the_whole_model(tmp_path: Path) -> None:
    pt, msn, x = twins()
    dump_torch(pt, x, tmp_path / "pt")
    dump_ms(msn, x, tmp_path / "ms")
    pt_calls, ms_calls = op_calls(records(tmp_path / "pt")), op_calls(records(tmp_path / "ms"))
    assert ("torch.relu", "") in {(t, rs[0].module) for t, rs in pt_calls}
    assert ("ops.relu", "") in {(t, rs[0].module) for t, rs in ms_calls}
    assert {"norm", "head", "attn"} <= {rs[0].module for _, rs in pt_calls}
    assert {"norm", "head", "attn"} <= {rs[0].module for _, rs in ms_calls}


def test_metadata_and_aligner_own_calls_are_not_recorded(tmp_path: Path) -> None:
    """x.shape, size() and the `view_as` aliases the torch pre-hooks make for gradients (grad mode on) are not ops;
    every source points at model code (this file), never into aligner or the frameworks."""
    pt, msn, x = twins()
    with aligner.dump(pt, tmp_path / "pt", ops=True, scope="attn"):
        pt(torch.from_numpy(x).requires_grad_()).sum().backward()
    dump_ms(msn, x, tmp_path / "ms", scope="attn")
    for side in ("pt", "ms"):
        ops_ = [r for r in records(tmp_path / side) if r.kind == "op"]
        assert ops_
        assert not {r.type for r in ops_} & {"Tensor.view_as", "Tensor.shape", "Tensor.size", "Tensor.dim",
                                              "ops.Shape", "Tensor.asnumpy"}
        assert {Path(r.source.rpartition(":")[0]) for r in ops_ if r.source} == {Path(__file__)}


def test_inplace_ops_record_the_value_before_and_after(tmp_path: Path) -> None:
    class Inplace(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            y.mul_(3.0)
            y[0] = 7.0
            return y

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    dump_torch(Inplace(), x, tmp_path / "pt")
    recs = records(tmp_path / "pt")
    calls = dict(op_calls(recs))
    mul_in, mul_out = calls["Tensor.mul_"]
    np.testing.assert_array_equal(data(tmp_path / "pt", mul_in, recs), x)
    np.testing.assert_array_equal(data(tmp_path / "pt", mul_out, recs), x * 3)
    set_out = next(r for r in calls["Tensor.__setitem__"] if r.io == "output")
    np.testing.assert_array_equal(data(tmp_path / "pt", set_out, recs), np.array([[7, 7, 7], [9, 12, 15]]))


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_unknown_scope_is_a_one_line_error_with_the_nearest_names(framework: str, tmp_path: Path) -> None:
    pt, msn, x = twins()
    with pytest.raises(AlignerError) as info:
        if framework == "pytorch":
            dump_torch(pt, x, tmp_path / "d", scope="atn.qkv")
        else:
            dump_ms(msn, x, tmp_path / "d", scope="atn.qkv")
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "'atn.qkv'" in message and "'attn.qkv'" in message, message
    assert torch._C._len_torch_function_stack() == 0
    assert "__mul__" not in vars(ms.Tensor)


class _JitCell(ms.nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.dense = ms.nn.Dense(4, 4)

    @ms.jit
    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return ops.softmax(self.dense(x) * 2.0, axis=-1)


def test_jit_construct_is_a_one_line_error(tmp_path: Path) -> None:
    net = _JitCell()
    with pytest.raises(AlignerError) as info:
        dump_ms(net, np.ones((2, 4), np.float32), tmp_path / "d")
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "PyNative" in message and "jit" in message, message
    assert "__mul__" not in vars(ms.Tensor)


def _framework_state() -> dict[str, object]:
    """Everything the op hooks replace, by identity."""
    state: dict[str, object] = {f"Tensor.{k}": v for k, v in vars(ms.Tensor).items()}
    state.update({f"ops.{k}": v for k, v in vars(ops).items()})
    state.update({f"mint.{k}": v for k, v in vars(mint).items()})
    state.update({"BatchMatMul.__call__": vars(ops.BatchMatMul)["__call__"],
                  "Primitive.__call__": vars(ops.Primitive)["__call__"]})
    return state


def test_hooks_are_restored_after_the_context_even_when_the_forward_raises(tmp_path: Path) -> None:
    class Fails(MsAttention):
        def construct(self, x: ms.Tensor) -> ms.Tensor:
            super().construct(x)
            raise RuntimeError("boom")

    class PtFails(PtAttention):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            super().forward(x)
            raise RuntimeError("boom")

    before = _framework_state()
    x = np.ones((BATCH, TOKENS, DIM), np.float32)
    with pytest.raises(RuntimeError, match="boom"):
        dump_ms(Fails(), x, tmp_path / "ms")
    with pytest.raises(RuntimeError, match="boom"):
        dump_torch(PtFails(), x, tmp_path / "pt")
    after = _framework_state()
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert torch._C._len_torch_function_stack() == 0
    # the ops recorded before the exception are in the dumps
    assert [t for t, _ in op_calls(records(tmp_path / "ms"))][:2] == ["ops.Reshape", "ops.MatMul"]
    assert [t for t, _ in op_calls(records(tmp_path / "pt"))][:2] == ["F.linear", "Tensor.reshape"]
