"""Localization by dataflow on hand-made torch/MindSpore pairs (issue 27): a parent handing a correct child the wrong
tensor (wiring), a tensor computed in one block and first read inside the next (leaves_only: the block's output is
not recorded), and a block's own code changing what entered it. Each bug sits in a parent's forward, on the
MindSpore side; compare must blame that parent exactly, in both argument orders, full and --bisect."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import nn as mnn

import aligner
from aligner.dumping.manifest import Io, Kind
from aligner.pipelines.compare.verdict import Culprit, Label
from aligner.render.compare import summary

D, H = 8, 16


class TorchMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(D, H, bias=False)
        self.up_proj = torch.nn.Linear(D, H, bias=False)
        self.down_proj = torch.nn.Linear(H, D, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class TorchLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.mlp = TorchMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([TorchLayer() for _ in range(3)])
        self.head = torch.nn.Linear(D, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class MsMLP(mnn.Cell):
    def __init__(self, bug: str) -> None:
        super().__init__()
        self.gate_proj = mnn.Dense(D, H, has_bias=False)
        self.up_proj = mnn.Dense(D, H, has_bias=False)
        self.down_proj = mnn.Dense(H, D, has_bias=False)
        self.act_fn = mnn.SiLU()
        self.bug = bug

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        if self.bug == "swap":  # gate and up projections swapped around the SwiGLU
            return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MsLayer(mnn.Cell):
    def __init__(self, bug: str) -> None:
        super().__init__()
        # norm-identity: the port leaves the norm out (an Identity where PyTorch normalises)
        self.norm = mnn.Identity() if bug == "norm-identity" else mnn.LayerNorm((D,), epsilon=1e-5)
        self.mlp = MsMLP(bug)
        self.bug = bug

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        if self.bug == "no-residual":  # the tail of this block: its output is not recorded under leaves_only
            return self.mlp(self.norm(x))
        if self.bug == "head-scale":  # the head of this block changes what entered it
            x = x * 2
        return x + self.mlp(self.norm(x))


class MsNet(mnn.Cell):
    def __init__(self, bugs: list[str]) -> None:
        super().__init__()
        self.layers = mnn.CellList([MsLayer(b) for b in bugs])
        self.head = mnn.Dense(D, 4)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _pair(bug_layer: int, bug: str) -> tuple[TorchNet, MsNet]:
    torch.manual_seed(0)
    tnet = TorchNet().eval()
    mnet = MsNet([bug if i == bug_layer else "" for i in range(3)])
    mnet.set_train(False)
    params = dict(mnet.parameters_and_names())
    for name, param in tnet.named_parameters():
        cell_name = name.replace("norm.weight", "norm.gamma").replace("norm.bias", "norm.beta")
        if cell_name in params:  # (norm-identity has no norm parameters)
            params[cell_name].set_data(ms.Tensor(param.detach().numpy()))
    return tnet, mnet


def _dump_both(tnet: torch.nn.Module, mnet: mnn.Cell, x: np.ndarray, root: Path, **options: Any) -> tuple[Path, Path]:
    """Both models dumped on the same input with the same options: (MindSpore dump, torch dump)."""
    with aligner.dump(tnet, root / "pt", **options), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, root / "ms", **options):
        mnet(ms.Tensor(x))
    return root / "ms", root / "pt"


def _copy_dense(pairs: list[tuple[torch.nn.Module, mnn.Cell]]) -> None:
    """Each torch layer's weight and bias into its MindSpore twin."""
    for t, m in pairs:
        m.weight.set_data(ms.Tensor(t.weight.detach().numpy()))
        m.bias.set_data(ms.Tensor(t.bias.detach().numpy()))


def _dumps(root: Path, bug_layer: int, bug: str, leaves_only: bool) -> tuple[Path, Path]:
    tnet, mnet = _pair(bug_layer, bug)
    x = np.random.default_rng(0).standard_normal((2, 3, D)).astype(np.float32)
    return _dump_both(tnet, mnet, x, root, leaves_only=leaves_only)


# bug, layer, expected blame (torch path == MindSpore path here), what the old verdict named instead
CASES = [
    ("swap", 1, "layers.1.mlp", "layers.1.mlp.act_fn: 'introduced here: its input matched'"),
    ("no-residual", 1, "layers.1", "layers.2: 'computed by code in the forward of layers.2'"),
    ("head-scale", 1, "layers.1", "layers.1 (already right; the rule that fixes no-residual must keep it)"),
    ("norm-identity", 1, "layers.1.norm", "(the rule keeping an Identity from pairing by name with a module that "
                                          "computes must keep a left-out layer blamed)"),
]


@pytest.mark.parametrize("leaves_only", [True, False], ids=["leaves", "all-modules"])
@pytest.mark.parametrize("bug,layer,expected,before", CASES, ids=[c[0] for c in CASES])
def test_the_parent_whose_code_differs_is_blamed(tmp_path, bug, layer, expected, before, leaves_only):
    ms_dir, pt_dir = _dumps(tmp_path, layer, bug, leaves_only)
    for a, b in ((ms_dir, pt_dir), (pt_dir, ms_dir)):
        for bisect in (False, True):
            result = aligner.compare(a, b, bisect=bisect)
            finding = result.verdict.findings[0]
            text = summary(result)
            assert finding.blame == expected, (bisect, a.name, text)
            if bug == "swap":  # both sides record the producers: the verdict says which output each side hands over
                assert finding.culprit is Culprit.WIRING and f"At fault: the forward of {expected}, which hands" in text
            elif finding.culprit is Culprit.PARENT_CODE:
                assert f"At fault: the code in the forward of {expected} " in text, text
            else:  # the block's own output (recorded whole, or its statistics under leaves_only) is the module
                assert finding.culprit is Culprit.MODULE and bug in ("no-residual", "norm-identity"), text


def test_a_wiring_swap_names_what_each_side_hands_over(tmp_path):
    ms_dir, pt_dir = _dumps(tmp_path, 1, "swap", True)
    text = summary(aligner.compare(ms_dir, pt_dir))
    # the verdict names the producer on each side instead of "its input matched" (the producer's own error); both
    # sides' input records link to it (MindSpore's by identity: a 3-D Dense's output, handed on as a copy, was stored
    # and matched by content before: "holds the numbers of layers.1.mlp.up_proj's output on the other side")
    assert "its input matched" not in text
    assert ("input 0 of layers.1.mlp.act_fn" in text and "is the output of layers.1.mlp.up_proj on the other side and "
            "of layers.1.mlp.gate_proj here, which matched" in text), text
    assert "Zoom in" not in text  # nothing to zoom into: the wiring is the answer


def test_a_block_output_carrying_a_childs_error_is_inherited(tmp_path):
    """A block's output (its statistics, or a link to the child output it hands back) is computed from its inputs
    and its children's outputs: after the swapped MLP, the MLP's, its layer's, the next layer's and the model's block
    outputs were each labelled 'introduced' (their inputs matched) while they only carry down_proj's error."""
    ms_dir, pt_dir = _dumps(tmp_path, 1, "swap", True)
    result = aligner.compare(ms_dir, pt_dir)
    blocks = {result.rows[i].pair.ref.record.module: label for i, label in result.verdict.labels.items()
              if result.rows[i].pair.ref.record.kind == Kind.BLOCK and result.rows[i].pair.ref.record.io == Io.OUTPUT}
    assert {"layers.1.mlp", "layers.1", "layers.2", ""} <= blocks.keys(), blocks
    assert set(blocks.values()) == {Label.INHERITED}, blocks


def test_a_zoom_in_that_names_no_op_says_so_instead_of_repeating_itself(tmp_path):
    """A parent's code that computes a differing input with no recorded op (here: the op-level dump of the block
    whose head scales its input, MindSpore's `*` not being one of the ops recorded under this scope's rules, or any
    code the op hooks do not see) must not suggest the same zoom-in again."""
    tnet, mnet = _pair(1, "head-scale")
    x = np.random.default_rng(0).standard_normal((2, 3, D)).astype(np.float32)
    with aligner.dump(tnet, tmp_path / "pt", ops=True, scope="layers.1"), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, tmp_path / "ms", ops=True, scope="layers.1"):
        mnet(ms.Tensor(x))
    for a, b in ((tmp_path / "ms", tmp_path / "pt"), (tmp_path / "pt", tmp_path / "ms")):
        result = aligner.compare(a, b)
        text = summary(result)
        finding = result.verdict.findings[0]
        if finding.culprit is Culprit.OP:  # the op-level dump named the op: progress
            assert finding.blame == "layers.1" and finding.source, text
        else:
            assert "Zoom in" not in text and "op-level records of the forward of layers.1 were read" in text, text


@pytest.mark.parametrize("leaves_only", [True, False], ids=["leaves", "all-modules"])
def test_clean_pair_agrees(tmp_path, leaves_only):
    ms_dir, pt_dir = _dumps(tmp_path, -1, "", leaves_only)
    for a, b in ((ms_dir, pt_dir), (pt_dir, ms_dir)):
        result = aligner.compare(a, b)
        assert result.exit_code == 0 and not result.verdict.findings, summary(result)


class _TorchSiLUNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.act = torch.nn.SiLU()
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.conv1(x)))


class _MsSwish(mnn.Cell):
    """mindcv's way: Swish as x * Sigmoid(x), with the Sigmoid a child cell."""

    def __init__(self) -> None:
        super().__init__()
        self.sigmoid = mnn.Sigmoid()

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return x * self.sigmoid(x)


class _MsSwishNet(mnn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = mnn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.act = _MsSwish()
        self.conv2 = mnn.Conv2d(4, 4, 3, pad_mode="pad", padding=1, has_bias=True)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.conv2(self.act(self.conv1(x)))


@pytest.mark.parametrize("leaves_only", [True, False], ids=["leaves", "all-modules"])
def test_a_composite_with_no_twin_children_is_not_paired_with_a_fused_layer(tmp_path, leaves_only):
    """A clean port whose MindSpore Swish holds a Sigmoid child while torch's SiLU is one layer: the Sigmoid's
    records were paired by content with SiLU's and blamed ("introduced here", error 1.5) though the outputs agree."""
    torch.manual_seed(0)
    tnet, mnet = _TorchSiLUNet().eval(), _MsSwishNet()
    mnet.set_train(False)
    _copy_dense([(tnet.conv1, mnet.conv1), (tnet.conv2, mnet.conv2)])
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ms_dir, pt_dir = _dump_both(tnet, mnet, x, tmp_path, leaves_only=leaves_only)
    for a, b in ((ms_dir, pt_dir), (pt_dir, ms_dir)):
        result = aligner.compare(a, b)
        assert result.exit_code == 0 and not result.verdict.findings, summary(result)
        paired = {(r.pair.a.record.module, r.pair.b.record.module) for r in result.rows if r.pair.a and r.pair.b}
        assert not any("sigmoid" in x for pair in paired for x in pair), paired


class _TorchAttention(torch.nn.Module):
    """Scores of a projection against its input, a mask added when one is given, softmax, values."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(D, D)
        self.softmax = torch.nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        scores = self.q(x) @ x.transpose(-1, -2)
        return self.softmax(scores if mask is None else scores + mask) @ x


class _TorchMaskedBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.attn = _TorchAttention()
        self.register_buffer("mask", torch.triu(torch.full((3, 3), -100.0), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x), mask=self.mask)


class _TorchMaskedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_TorchMaskedBlock() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class _MsAttention(mnn.Cell):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.q = mnn.Dense(D, D)
        self.softmax = mnn.Softmax(axis=-1)
        self.scale = scale  # attention's own code: 0.5 where PyTorch multiplies by nothing

    def construct(self, x: ms.Tensor, mask: ms.Tensor | None = None) -> ms.Tensor:
        scores = ms.ops.matmul(self.q(x), x.swapaxes(-1, -2)) * self.scale
        return ms.ops.matmul(self.softmax(scores if mask is None else scores + mask), x)


class _MsMaskedBlock(mnn.Cell):
    def __init__(self, bug: str) -> None:
        super().__init__()
        self.norm = mnn.LayerNorm((D,), epsilon=1e-5)
        self.attn = _MsAttention(0.5 if bug == "attn-scale" else 1.0)
        self.mask = ms.Tensor(np.triu(np.full((3, 3), -100.0, np.float32), 1))
        self.bug = bug

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        if self.bug == "mask-off":  # the block calls its attention without the mask
            return x + self.attn(self.norm(x))
        return x + self.attn(self.norm(x), mask=self.mask)


class _MsMaskedNet(mnn.Cell):
    def __init__(self, bug_block: int, bug: str) -> None:
        super().__init__()
        self.blocks = mnn.CellList([_MsMaskedBlock(bug if i == bug_block else "") for i in range(2)])

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _masked_dumps(root: Path, bug: str, leaves_only: bool) -> tuple[Path, Path]:
    torch.manual_seed(0)
    tnet, mnet = _TorchMaskedNet().eval(), _MsMaskedNet(1, bug)
    mnet.set_train(False)
    params = dict(mnet.parameters_and_names())
    for name, param in tnet.named_parameters():
        params[name.replace("norm.weight", "norm.gamma").replace("norm.bias", "norm.beta")].set_data(
            ms.Tensor(param.detach().numpy()))
    x = np.random.default_rng(0).standard_normal((2, 3, D)).astype(np.float32)
    return _dump_both(tnet, mnet, x, root, leaves_only=leaves_only)


@pytest.mark.parametrize("leaves_only", [True, False], ids=["leaves", "all-modules"])
def test_an_argument_one_side_leaves_out_blames_the_caller(tmp_path, leaves_only):
    """A block calling its attention without the mask (Swin's shifted-window mask left out): the attention's own
    inputs match and its output differs, but the mask it received on one side only is the evidence: the block's call
    is named (with the attention's own use of the argument as the other possibility), never 'introduced' in the
    attention alone."""
    ms_dir, pt_dir = _masked_dumps(tmp_path, "mask-off", leaves_only)
    # (the PyTorch side is the reference in both orders by default; --ref first makes the MindSpore side, which leaves
    # the mask out, the reference: the extra input is then the first side's, a row the reference does not hold,
    # which crashed the data flow with leaves_only=False: IndexError, seen on a clean BERT pair)
    orders = ((ms_dir, pt_dir, None, ("reference", "first")), (pt_dir, ms_dir, None, ("reference", "first")),
              (ms_dir, pt_dir, "first", ("first", "reference")))
    for a, b, ref, side in orders:
        for bisect in (False, True):
            result = aligner.compare(a, b, bisect=bisect, ref=ref)
            finding = result.verdict.findings[0]
            text = summary(result)
            assert (finding.blame, finding.culprit) == ("blocks.1", Culprit.ARGUMENT), (bisect, a.name, text)
            assert finding.argument is not None and finding.argument.name == "mask"
            assert ("At fault: the forward of blocks.1, which calls blocks.1.attn with the tensor argument 'mask' "
                    f"on the {side[0]} side only (the {side[1]} side leaves it out)") in text, text
            assert "Zoom in" not in text


@pytest.mark.parametrize("leaves_only", [True, False], ids=["leaves", "all-modules"])
def test_a_callee_given_the_same_arguments_keeps_the_blame(tmp_path, leaves_only):
    """The control: the attention's own code scales its scores while both blocks pass the mask: the attention is
    blamed, not its caller (the argument rule needs an argument one side leaves out)."""
    ms_dir, pt_dir = _masked_dumps(tmp_path, "attn-scale", leaves_only)
    for a, b in ((ms_dir, pt_dir), (pt_dir, ms_dir)):
        finding = aligner.compare(a, b).verdict.findings[0]
        assert finding.blame == "blocks.1.attn" and finding.culprit is not Culprit.ARGUMENT, finding


class _TorchStages(torch.nn.Module):
    """timm's Swin layout: each stage STARTS with its `down` (an Identity in stage 0, a merge in stage 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
        self.stages[0].down, self.stages[0].fc = torch.nn.Identity(), torch.nn.Linear(D, D)
        self.stages[1].down, self.stages[1].fc = torch.nn.Linear(D, H), torch.nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage.fc(stage.down(x))
        return x


class _MsStages(mnn.Cell):
    """mindcv's layout: stage 0 ENDS with its `down` (the merge); stage 1 has none."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = mnn.CellList([mnn.Cell(), mnn.Cell()])
        self.stages[0].fc, self.stages[0].down = mnn.Dense(D, D), mnn.Dense(D, H)
        self.stages[1].fc = mnn.Dense(H, H)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        x = self.stages[0].down(self.stages[0].fc(x))
        return self.stages[1].fc(x)


@pytest.mark.parametrize("leaves_only", [True, False], ids=["leaves", "all-modules"])
def test_stages_that_end_at_another_point_are_not_a_divergence(tmp_path, leaves_only):
    """A clean port whose stages end at another point: torch's `stages.0.down` is an Identity, MindSpore's the merge
    (same name). The Identity, which returns its own input, was paired by name with the merge and blamed ('wires them
    differently'); it folds, and the stage outputs of two different lengths are listed, not a divergence."""
    torch.manual_seed(0)
    tnet, mnet = _TorchStages().eval(), _MsStages()
    mnet.set_train(False)
    _copy_dense([(tnet.get_submodule(t), m) for t, m in (("stages.0.fc", mnet.stages[0].fc),
                                                         ("stages.1.down", mnet.stages[0].down),
                                                         ("stages.1.fc", mnet.stages[1].fc))])
    x = np.random.default_rng(0).standard_normal((2, D)).astype(np.float32)
    ms_dir, pt_dir = _dump_both(tnet, mnet, x, tmp_path, leaves_only=leaves_only)
    for a, b in ((ms_dir, pt_dir), (pt_dir, ms_dir)):
        result = aligner.compare(a, b)
        assert result.exit_code == 0 and not result.verdict.findings, summary(result)
        assert result.compared > 0
