"""Comparing op-level dumps across frameworks: op records pair by canonical op (or by agreeing content, when the
two sides order the same arithmetic differently), and an injected bug makes the first diverged op row the op that
computes it, with the source line of the reference model's code. Real torch and MindSpore runs: the twin attention
of tests/dumping/test_ops.py, and timm's ViT block against mindcv's (tests/zoo/vit.py)."""
from __future__ import annotations

import importlib
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch
import yaml

import aligner
from aligner.dumping.manifest import Record
from aligner.mapping.ops import OPS_FILE, canonical_op, load_op_table
from aligner.pipelines.compare.evaluate import RowStatus
from aligner.pipelines.compare.result import CompareResult
from tests.dumping.test_ops import MsAttention, PtAttention, dump_ms, dump_torch, marker_line, twins
from tests.support.cli import align_in_process


def op_rows(result: CompareResult) -> list[tuple[RowStatus, Record | None, Record | None]]:
    """(status, reference record, compared record) of every row of an op record, in reference order."""
    out = []
    for row in result.rows:
        if row.pair.ref.record.kind == "op":
            pair = row.pair
            out.append((row.status, pair.b.record if pair.b else None, pair.a.record if pair.a else None))
    return out


def first_diverged_op(result: CompareResult) -> tuple[Record, Record]:
    status, ref, other = next(r for r in op_rows(result) if r[0] == RowStatus.DIVERGED)
    assert ref is not None and other is not None
    return ref, other


def compare_twins(tmp_path: Path, **bug: float) -> CompareResult:
    pt, msn, x = twins(**bug)
    dump_torch(pt, x, tmp_path / "pt", scope="attn")
    dump_ms(msn, x, tmp_path / "ms", scope="attn")
    return aligner.compare(str(tmp_path / "ms"), str(tmp_path / "pt"))


def test_clean_twins_pair_every_op_of_the_scope(tmp_path: Path) -> None:
    result = compare_twins(tmp_path)
    rows = op_rows(result)
    assert not [r for r in rows if r[0] == RowStatus.DIVERGED]
    paired = {(ref.type, other.type) for status, ref, other in rows if status == RowStatus.OK and ref and other
              and ref.io == "output"}
    assert {("Tensor.matmul", "ops.BatchMatMul"), ("Tensor.mul", "Tensor.__mul__"), ("Tensor.softmax", "ops.Softmax"),
            ("Tensor.permute", "ops.transpose"), ("Tensor.unbind", "ops.unstack")} <= paired, paired
    # both matmuls paired, in order (the second consumes the softmax)
    matmuls = [(ref.seq, other.seq) for status, ref, other in rows if ref and other and ref.io == "output"
               and ref.type == "Tensor.matmul"]
    assert len(matmuls) == 2 and matmuls == sorted(matmuls)
    # left over: PyTorch's k.transpose(-2, -1) (MindSpore's BatchMatMul transposes inside; its k input pairs with
    # neither: it would cross the q pair) and nn.Dense's inner primitives, whose ends pair with F.linear's
    only_pt = {(ref.type, ref.io, ref.index) for _, ref, other in rows if other is None and ref is not None}
    assert only_pt == {("Tensor.transpose", "input", 0), ("Tensor.transpose", "output", 0),
                       ("Tensor.matmul", "input", 1)}, only_pt
    only_ms = {(other.type, other.io, other.index) for _, ref, other in rows if ref is None and other is not None}
    assert only_ms == {("ops.BatchMatMul", "input", 1), ("ops.Reshape", "output", 0), ("ops.MatMul", "input", 0),
                       ("ops.MatMul", "output", 0), ("ops.BiasAdd", "input", 0), ("ops.BiasAdd", "output", 0),
                       ("ops.Reshape", "input", 0)}, only_ms


@pytest.mark.parametrize("bug, op, marker", [({"factor": 0.5}, "Tensor.mul", "scale"),
                                             ({"axis": -2}, "Tensor.softmax", "softmax")])
def test_injected_bug_is_the_first_diverged_op_with_its_source(tmp_path: Path, bug: dict, op: str,
                                                               marker: str) -> None:
    result = compare_twins(tmp_path, **bug)
    ref, other = first_diverged_op(result)
    assert (ref.type, ref.io) == (op, "output")
    assert canonical_op(other.type) == canonical_op(op)
    assert ref.source == marker_line(PtAttention, marker)
    assert other.source == marker_line(MsAttention, marker)
    # the bugged op's input matched: the divergence starts at this op
    inputs = [status for status, r, _ in op_rows(result) if r is not None and r.call == ref.call and r.io == "input"]
    assert inputs == [RowStatus.OK]


def test_align_compare_cli_on_op_dumps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compare_twins(tmp_path, factor=0.5)
    proc = align_in_process(capsys, "compare", tmp_path / "ms", tmp_path / "pt")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------- timm vs mindcv ViT

@pytest.fixture(scope="module")
def vit_pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    importlib.import_module("tests.zoo.torch_compat").install()  # before timm: torchvision's op schemas
    pytest.importorskip("timm")
    pytest.importorskip("mindcv")
    pair = importlib.import_module("tests.zoo.vit").build(seed=0)
    pair.make_equal(tmp_path_factory.mktemp("vit_convert"))
    for module in pair.torch_model.modules():  # timm's explicit attention, as mindcv computes it (no fused SDPA)
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    return pair


def compare_vit(pair, root: Path, scale_factor: float = 1.0) -> CompareResult:  # type: ignore[no-untyped-def]
    attn = pair.ms_model.blocks[0].attn
    clean = attn.scale
    attn.scale = ms.Tensor(attn.head_dim ** -0.5 * scale_factor)
    try:
        with torch.no_grad():
            dump_torch(pair.torch_model, pair.torch_inputs["x"], root / "pt", scope="blocks.0.attn")
        dump_ms(pair.ms_model, pair.ms_inputs["x"], root / "ms", scope="blocks.0.attn")
    finally:
        attn.scale = clean
    return aligner.compare(str(root / "ms"), str(root / "pt"))


def test_vit_clean_pair_has_no_diverged_op(vit_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """timm scales q before q @ k^T, mindcv scales the BatchMatMul product: the matmul outputs hold different
    numbers, yet no op row diverges (the scaled products pair by content)."""
    result = compare_vit(vit_pair, tmp_path)
    rows = op_rows(result)
    assert not [r for r in rows if r[0] == RowStatus.DIVERGED]
    assert sum(1 for status, ref, other in rows if status == RowStatus.OK and ref and ref.io == "output") >= 10
    assert any(ref.type == "Tensor.softmax" and other and other.type == "ops.softmax" for _, ref, other in rows if ref)


def test_vit_scale_bug_is_named_at_the_scale(vit_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = compare_vit(vit_pair, tmp_path, scale_factor=0.5)
    ref, other = first_diverged_op(result)
    source = Path(ref.source.rpartition(":")[0]) if ref.source else None
    assert source is not None and source.name == "attention.py" and "timm" in source.parts
    line = source.read_text().splitlines()[int(ref.source.rpartition(":")[2]) - 1]
    # timm's scale, or the matmul consuming the scaled q (mindcv scales after its BatchMatMul: that pairs with it)
    assert (ref.type, line.strip()) in {("Tensor.mul", "q = q * self.scale"),
                                        ("Tensor.matmul", "attn = q @ k.transpose(-2, -1)")}, (ref, line)
    assert canonical_op(other.type) == canonical_op(ref.type)


class _PtConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) * 2.0


class _MsConvBn(ms.nn.Cell):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.conv = ms.nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn = ms.nn.BatchNorm2d(4)
        self.factor = factor

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.bn(self.conv(x)) * self.factor


def test_batch_norm_inputs_pair_by_role_across_frameworks(tmp_path: Path) -> None:
    """MindSpore's BatchNorm primitive takes scale and bias before the moving statistics, F.batch_norm after them; at
    their fresh values (1, 0, 0, 1) a pairing by position put 1 against 0 and named batch_norm as the first divergent
    op of a parent whose own multiply is wrong. By role (the op table's `inputs`), the multiply is named."""
    torch.manual_seed(0)
    pt = _PtConvBn().eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype(np.float32)
    for factor in (2.0, 3.0):  # clean, then the parent's bug
        msn = _MsConvBn(factor)
        msn.set_train(False)
        msn.conv.weight.set_data(ms.Tensor(pt.conv.weight.detach().numpy()))
        msn.conv.bias.set_data(ms.Tensor(pt.conv.bias.detach().numpy()))
        root = tmp_path / str(factor)
        with torch.no_grad():
            dump_torch(pt, x, root / "pt")
        dump_ms(msn, x, root / "ms")
        result = aligner.compare(str(root / "ms"), str(root / "pt"))
        bn_inputs = [(status, ref.index) for status, ref, other in op_rows(result)
                     if ref is not None and ref.type == "F.batch_norm" and ref.io == "input"]
        assert len(bn_inputs) == 5 and {s for s, _ in bn_inputs} == {RowStatus.OK}, bn_inputs
        if factor == 2.0:
            assert not [r for r in op_rows(result) if r[0] == RowStatus.DIVERGED]
        else:
            ref, other = first_diverged_op(result)
            assert (canonical_op(ref.type), ref.io, canonical_op(other.type)) == ("mul", "output", "mul")


# ------------------------------------------------------------------------------------------------ the op table

def test_every_op_table_name_exists_in_the_installed_frameworks() -> None:
    from importlib import resources

    import mindspore.mint.nn.functional as mint_f
    import mindspore.ops.functional as ops_f
    from mindspore import mint, ops

    roots = {"pytorch": {"torch": torch, "F": torch.nn.functional, "Tensor": torch.Tensor},
             "mindspore": {"ops": ops, "ops.functional": ops_f, "mint": mint, "mint.nn.functional": mint_f,
                           "Tensor": ms.Tensor}}
    table = yaml.safe_load(resources.files("aligner.mappings").joinpath(OPS_FILE).read_text(encoding="utf-8"))
    names = [(fw, name) for sides in table["ops"].values() for fw in roots for name in sides.get(fw) or ()]
    missing = [f"{fw} {name}" for fw, name in names
               if not hasattr(roots[fw][name.rpartition(".")[0]], name.rpartition(".")[2])]
    assert not missing
    assert len(load_op_table().merged) == len(names) - \
        sum(len(set(s["pytorch"]) & set(s["mindspore"])) for s in table["ops"].values())


def test_input_roles_are_the_arguments_each_name_computes_with() -> None:
    """Each name, called with the role-ordered tensors positionally, computes what torch's F.batch_norm does with them
    by keyword: a role list out of step with the function would pair a weight with a running mean. (batch_norm is the
    only op with roles; another one needs its inputs built here.)"""
    import inspect

    import mindspore.mint.nn.functional as mint_f
    from mindspore import mint, ops

    table = load_op_table()
    assert {table.merged[name] for name in table.roles} == {"batch_norm"}
    rng = np.random.default_rng(0)
    tensors = {"input": rng.standard_normal((2, 3, 4, 4)), "weight": rng.uniform(0.5, 2, 3),
               "bias": rng.standard_normal(3), "running_mean": rng.standard_normal(3),
               "running_var": rng.uniform(0.5, 2, 3)}
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    want = torch.nn.functional.batch_norm(**{k: torch.from_numpy(v) for k, v in tensors.items()}).numpy()
    roots = {"torch": torch, "F": torch.nn.functional, "ops": ops, "mint": mint, "mint.nn.functional": mint_f}
    for name, roles in table.roles.items():
        owner, _, attr = name.rpartition(".")
        fn = getattr(roots[owner], attr)
        if owner in ("torch", "F"):
            args = [torch.from_numpy(tensors[r]) for r in roles]
            got = (fn(*args, False, 0.1, 1e-5, False) if owner == "torch" else fn(*args)).numpy()
        else:
            args = [ms.Tensor(tensors[r]) for r in roles]
            try:
                out = fn()(*args) if isinstance(fn, type) else fn(*args)
                got = (out[0] if isinstance(out, tuple) else out).asnumpy()  # (a missing kernel raises here)
            except RuntimeError as exc:  # no CPU kernel (mint's BatchNormExt): its parameter names, in order
                assert "unregistered" in str(exc), exc
                params = [p.replace("input_x", "input") for p in inspect.signature(fn).parameters]
                assert params[:len(roles)] == list(roles), (name, params)
                continue
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_canonical_ops_join_both_spellings() -> None:
    assert {canonical_op(n) for n in ("Tensor.matmul", "torch.bmm", "ops.BatchMatMul", "mint.matmul")} == {"matmul"}
    assert {canonical_op(n) for n in ("F.softmax", "ops.Softmax", "mint.nn.functional.softmax")} == {"softmax"}
    assert {canonical_op(n) for n in ("Tensor.mul", "Tensor.__mul__", "ops.Mul")} == {"mul"}
    assert canonical_op("ops.Erfinv") == canonical_op("torch.erfinv") == "erfinv"  # not listed: the bare name
    assert canonical_op("F.linear") != canonical_op("ops.MatMul")
    np.testing.assert_equal(canonical_op("Tensor.view"), "reshape")
