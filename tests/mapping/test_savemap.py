"""The map `align convert --save-map` writes is the map `align compare --map` needs: parameter renames imply module
renames, apply to every record kind, win over the built-in rules, and pair the same records in either argument
order. Real models with different module names (torch `features.N` / `head`, MindSpore `encoder.stem|stage1` /
`classifier`), real dumps of one forward + backward step, real compare runs."""
from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")
from mindspore import nn as mnn  # noqa: E402

import aligner  # noqa: E402
from aligner.dumping.manifest import Record  # noqa: E402
from aligner.dumping.pair.matching import namers  # noqa: E402
from aligner.dumping.read.source import Item  # noqa: E402
from aligner.mapping.usermap import UserMap, module_renames  # noqa: E402
from tests.support.cli import align_in_process  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)


class TorchBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(cout)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(TorchBlock(3, 8), TorchBlock(8, 8))
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class MsBlock(mnn.Cell):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = mnn.Conv2d(cin, cout, 3, pad_mode="pad", padding=1)
        self.bn = mnn.BatchNorm2d(cout)
        self.act = mnn.ReLU()

    def construct(self, x):
        return self.act(self.bn(self.conv(x)))


class MsNet(mnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = mnn.SequentialCell(collections.OrderedDict(stem=MsBlock(3, 8), stage1=MsBlock(8, 8)))
        self.classifier = mnn.Dense(8, 10)

    def construct(self, x):
        return self.classifier(self.encoder(x).mean((2, 3)))


def _dumps(tmp: Path, capsys: pytest.CaptureFixture[str], bug: bool = False) -> tuple[Path, Path, Path]:
    """Torch weights -> `align convert --like --save-map` -> MindSpore model; one step dumped on each side.
    `bug`: the MindSpore copy of encoder.stage1.conv's kernel is transposed (a layout mistake in one layer)."""
    torch.manual_seed(0)
    net = TorchNet().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics and affine parameters
        for block in net.features:
            block.bn.running_mean.uniform_(-0.5, 0.5)
            block.bn.running_var.uniform_(0.5, 2.0)
            block.bn.weight.uniform_(0.5, 1.5)
            block.bn.bias.uniform_(-0.5, 0.5)
    torch.save(net.state_dict(), tmp / "pt.pth")
    mnet = MsNet()
    mnet.set_train(False)
    ms.save_checkpoint(mnet, str(tmp / "init.ckpt"))
    saved = tmp / "saved.yaml"
    proc = align_in_process(capsys, "convert", tmp / "pt.pth", "-o", tmp / "ms.ckpt", "--like", tmp / "init.ckpt",
                            "--save-map", saved)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ms.load_param_into_net(mnet, ms.load_checkpoint(str(tmp / "ms.ckpt")), strict_load=True)
    if bug:
        w = mnet.encoder.stage1.conv.weight
        w.set_data(ms.Tensor(np.ascontiguousarray(w.asnumpy().transpose(0, 1, 3, 2))))
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with aligner.dump(net, tmp / "pt", inputs=True, leaves_only=False):
        net(torch.from_numpy(x)).square().mean().backward()
    with aligner.dump(mnet, tmp / "ms", inputs=True, leaves_only=False):
        ms.value_and_grad(lambda t: mnet(t).square().mean(), None, mnet.trainable_params())(ms.Tensor(x))
    return tmp / "ms", tmp / "pt", saved


def _compare(capsys: pytest.CaptureFixture[str], a: Path, b: Path, *extra: Any) -> tuple[int, dict[str, Any]]:
    proc = align_in_process(capsys, "compare", a, b, "--json", "-", *extra)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _pairs(result: dict[str, Any]) -> set[tuple]:
    """Each row as (torch module, MindSpore module, kind, io, index, how): PyTorch is the reference in either order."""
    assert result["reference"].endswith("(pytorch)")
    return {(r["module"], r["module_a"], r["kind"], r["io"], r["index"], r["matched_by"]) for r in result["rows"]}


def test_saved_map_pairs_every_record_by_name_in_both_orders(tmp_path, capsys) -> None:
    ms_dir, pt_dir, saved = _dumps(tmp_path, capsys)
    code_ms, ms_first = _compare(capsys, ms_dir, pt_dir, "--map", saved)
    code_pt, pt_first = _compare(capsys, pt_dir, ms_dir, "--map", saved)
    for code, result in ((code_ms, ms_first), (code_pt, pt_first)):
        assert code == 0, result["summary"]
        assert {r["matched_by"] for r in result["rows"]} == {"name"}, collections.Counter(
            r["matched_by"] for r in result["rows"])
        assert result["counts"]["unmatched_a"] == result["counts"]["unmatched_b"] == 0
        kinds = collections.Counter(r["kind"] for r in result["rows"])
        assert kinds["forward"] and kinds["backward"] and kinds["param_grad"] == 8, kinds
    assert _pairs(ms_first) == _pairs(pt_first)
    by_pt = {(p[0], p[2]): p[1] for p in _pairs(ms_first)}
    assert by_pt[("features.1.conv", "forward")] == "encoder.stage1.conv"
    assert by_pt[("features.0.act", "backward")] == "encoder.stem.act"       # no parameters: the parent's rename
    assert by_pt[("features", "forward")] == "encoder"                        # two children agree
    assert by_pt[("features.0.bn.weight", "param_grad")] == "encoder.stem.bn.gamma"  # the user rule, not gamma->weight
    assert by_pt[("head.bias", "param_grad")] == "classifier.bias"

    _, unmapped = _compare(capsys, ms_dir, pt_dir)  # without the map, the renamed modules cannot pair by name
    assert sum(r["matched_by"] == "name" for r in unmapped["rows"]) < len(unmapped["rows"]) // 2


def test_saved_map_names_the_layer_with_the_bug_in_both_orders(tmp_path, capsys) -> None:
    ms_dir, pt_dir, saved = _dumps(tmp_path, capsys, bug=True)
    for a, b in ((ms_dir, pt_dir), (pt_dir, ms_dir)):
        code, result = _compare(capsys, a, b, "--map", saved)
        assert code == 1
        first = [f for f in result["findings"] if f["phase"] == "forward"][0]
        assert (first["module"], first["origin_module"]) == ("features.1.conv", "features.1.conv"), first
        row = result["rows"][first["origin"]]
        assert row["module_a"] == "encoder.stage1.conv" and row["matched_by"] == "name"


# --------------------------------------------------------------------------------- module renames, unit level

def test_module_renames_from_parameter_renames() -> None:
    found = module_renames([
        ("features.0.conv.weight", "encoder.stem.conv.weight"), ("features.0.bn.weight", "encoder.stem.bn.gamma"),
        ("features.1.conv.weight", "encoder.stage1.conv.weight"),
        ("blocks.0.mlp.fc1.weight", "layer.0.intermediate.dense.weight"),
        ("blocks.0.mlp.fc2.weight", "layer.0.output.dense.weight"),
        ("fc.weight", "head.classifier.weight"), ("pos_embed", "embeddings.position_embeddings")])
    assert found["features.0.conv"] == "encoder.stem.conv" and found["features.0"] == "encoder.stem"
    assert found["features"] == "encoder"                       # its children features.0 and features.1 agree
    assert found["blocks.0.mlp.fc1"] == "layer.0.intermediate.dense" and found["fc"] == "head.classifier"
    assert "blocks.0.mlp" not in found      # fc1 says layer.0.intermediate, fc2 layer.0.output: no inference
    assert "blocks.0" not in found and "" not in found


def test_rename_path_full_names_first_then_modules_then_ancestors() -> None:
    umap = UserMap(rename={"features.0.conv.weight": ["encoder.stem.conv.weight"]})
    umap.modules = module_renames([("features.0.conv.weight", "encoder.stem.conv.weight")])
    assert umap.rename_path("features.0.conv.weight") == "encoder.stem.conv.weight"
    assert umap.rename_path("features.0.conv") == "encoder.stem.conv"
    assert umap.rename_path("features.0") == "encoder.stem"
    assert umap.rename_path("features.0.act") == "encoder.stem.act"
    assert umap.rename_path("features.1") == "features.1"


def _items(specs: list[tuple[str, str]]) -> list[Item]:
    return [Item(Record(seq=i, module=m, type="Layer", kind=k, io="grad" if k == "param_grad" else "output", index=0,
                        dtype="float32", shape=[4]), None) for i, (m, k) in enumerate(specs)]


def test_namers_pick_the_side_the_map_names_whatever_the_order() -> None:
    """A torch -> MindSpore map on a param_grad record and a module record: the same names in both orders, and the
    MindSpore side's built-in rule (gamma -> weight) yields to the user's rename."""
    pt = _items([("features.0.bn.weight", "param_grad"), ("features.0.bn", "forward"),
                            ("other.ln.weight", "param_grad"), ("other.ln.bias", "param_grad")])
    msi = _items([("encoder.stem.bn.gamma", "param_grad"), ("encoder.stem.bn", "forward"),
                               ("other.ln.gamma", "param_grad"), ("other.ln.beta", "param_grad")])
    umap = UserMap(rename={"features.0.bn.weight": ["encoder.stem.bn.gamma"]})
    umap.modules = module_renames([("features.0.bn.weight", "encoder.stem.bn.gamma")])
    for first, fw_first, second, fw_second in ((pt, "pytorch", msi, "mindspore"), (msi, "mindspore", pt, "pytorch")):
        name_first, name_second = namers(first, fw_first, fw_second, second, umap.rename_path)
        names = {it.record.module: name_first(it.record) for it in first} | \
            {it.record.module: name_second(it.record) for it in second}
        assert names["features.0.bn.weight"] == names["encoder.stem.bn.gamma"] == "encoder.stem.bn.gamma"
        assert names["features.0.bn"] == names["encoder.stem.bn"] == "encoder.stem.bn"
        assert names["other.ln.weight"] == names["other.ln.gamma"] == "other.ln.weight"  # built-in rule, unmapped
        assert names["other.ln.bias"] == names["other.ln.beta"] == "other.ln.bias"
