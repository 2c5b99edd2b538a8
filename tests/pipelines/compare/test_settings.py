"""The verdict names the blamed module's settings that differ between the sides (issue 27, item 6), compared across
the frameworks' spellings by the audit's rules (mappings/audit_layers.yaml): eps vs epsilon, GELU approximate, the
MindSpore BatchNorm momentum (1 - torch's), Conv2d padding vs pad_mode for the recorded input size."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import nn

import aligner
from aligner.pipelines.compare.verdict import Culprit
from aligner.render.compare import summary
from tests.support.cli import align_in_process

ms.set_context(mode=ms.PYNATIVE_MODE)


class TorchNet(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * 2


class MsNet(nn.Cell):
    def __init__(self, layer: nn.Cell) -> None:
        super().__init__()
        self.layer = layer

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.layer(x) * 2


def _conv_weights(pt: torch.nn.Conv2d, cell: nn.Conv2d) -> None:
    cell.weight.set_data(ms.Tensor(pt.weight.detach().numpy()))


# name -> (torch layer, MindSpore layer, input shape, training mode, copy weights, the setting expected in the text)
CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any], tuple[int, ...], bool, Any, str]] = {
    "layernorm-eps": (lambda: torch.nn.LayerNorm(8, eps=1e-5), lambda: nn.LayerNorm((8,), epsilon=1e-1),
                      (4, 8), False, None, "eps 0.1 vs 1e-05"),
    "gelu-approximate": (lambda: torch.nn.GELU(), lambda: nn.GELU(), (4, 8), False, None,
                         "approximate True (PyTorch's meaning 'tanh') vs 'none'"),
    "batchnorm-momentum": (lambda: torch.nn.BatchNorm2d(3), lambda: nn.BatchNorm2d(3, momentum=0.1), (2, 3, 4, 4),
                           True, None, "momentum 0.1 (PyTorch's meaning 0.9) vs 0.1"),
    "conv-padding": (lambda: torch.nn.Conv2d(3, 3, 3, stride=2, padding=1, bias=False),
                     lambda: nn.Conv2d(3, 3, 3, stride=2, pad_mode="same"), (1, 3, 8, 8), False, _conv_weights,
                     "padding ((0, 1), (0, 1)) vs ((1, 1), (1, 1))"),
}


def _dumps(tmp_path: Path, case: str) -> tuple[Path, Path]:
    make_pt, make_ms, shape, train, copy, _ = CASES[case]
    torch.manual_seed(0)
    pt_layer, ms_layer = make_pt(), make_ms()
    if copy is not None:
        copy(pt_layer, ms_layer)
    pt, cell = TorchNet(pt_layer).train(train), MsNet(ms_layer)
    cell.set_train(train)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3
    with aligner.dump(pt, tmp_path / "pt", backward=False), torch.no_grad():
        pt(torch.from_numpy(x))
    with aligner.dump(cell, tmp_path / "ms", backward=False):
        cell(ms.Tensor(x))
    return tmp_path / "ms", tmp_path / "pt"


@pytest.mark.parametrize("case", list(CASES))
def test_the_verdict_names_the_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    """The finding blames `layer` and names the differing setting with both values, in the text, the HTML
    headline and the JSON finding."""
    ms_dir, pt_dir = _dumps(tmp_path, case)
    want = CASES[case][-1]
    proc = align_in_process(capsys, "compare", ms_dir, pt_dir, "--json", tmp_path / "r.json", "--html",
                            tmp_path / "r.html")
    assert proc.returncode == 1
    finding = json.loads((tmp_path / "r.json").read_text())["findings"][0]
    assert finding["origin_module"] == "layer" and finding["culprit"] == "module"
    assert [s["name"] for s in finding["settings"]] == [want.split()[0]], finding["settings"]
    text = align_in_process(capsys, "compare", ms_dir, pt_dir).stdout
    assert f"Its settings differ (first vs reference): {want}." in " ".join(text.split())
    html = (tmp_path / "r.html").read_text()
    headline = html[html.index('id="headline"'):html.index("</header>")]
    assert want.replace("'", "&#x27;") in headline


def test_a_clean_pair_names_no_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Different spellings of the same settings (epsilon/eps, MindSpore's momentum 0.9 = torch's 0.1) are no
    difference: a BatchNorm pair with a wrong weight is blamed with no setting named."""
    torch.manual_seed(0)
    pt = TorchNet(torch.nn.LayerNorm(8, eps=1e-5))
    cell = MsNet(nn.LayerNorm((8,), epsilon=1e-5))
    cell.layer.gamma.set_data(ms.Tensor(np.full(8, 2.0, np.float32)))
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    with aligner.dump(pt, tmp_path / "pt", backward=False), torch.no_grad():
        pt(torch.from_numpy(x))
    with aligner.dump(cell, tmp_path / "ms", backward=False):
        cell(ms.Tensor(x))
    proc = align_in_process(capsys, "compare", tmp_path / "ms", tmp_path / "pt", "--json", tmp_path / "r.json")
    assert proc.returncode == 1
    finding = json.loads((tmp_path / "r.json").read_text())["findings"][0]
    assert finding["origin_module"] == "layer" and finding["settings"] == []


class _TorchFunctionalGelu(torch.nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x), approximate=self.approximate)


class _MsFunctionalGelu(nn.Cell):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.approximate = approximate

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return ms.ops.gelu(self.fc(x), approximate=self.approximate)


@pytest.mark.parametrize("ms_approximate", ["tanh", "none"])
def test_an_op_blamed_in_a_zoom_in_names_its_differing_argument(tmp_path: Path, ms_approximate: str) -> None:
    """A functional gelu in a parent's forward, called with approximate='tanh' on the MindSpore side: the op-level
    dump records each op call's plain arguments, and the verdict that blames the op names the one that differs (by
    keyword: the frameworks' positions differ). The control (the same argument) blames nothing."""
    torch.manual_seed(0)
    tnet, mnet = _TorchFunctionalGelu("none").eval(), _MsFunctionalGelu(ms_approximate)
    mnet.set_train(False)
    mnet.fc.weight.set_data(ms.Tensor(tnet.fc.weight.detach().numpy()))
    mnet.fc.bias.set_data(ms.Tensor(tnet.fc.bias.detach().numpy()))
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32) * 3  # |x| ~ 3: tanh vs erf ~1e-4
    with aligner.dump(tnet, tmp_path / "pt", ops=True), torch.no_grad():
        tnet(torch.from_numpy(x))
    with aligner.dump(mnet, tmp_path / "ms", ops=True):
        mnet(ms.Tensor(x))
    for a, b in ((tmp_path / "ms", tmp_path / "pt"), (tmp_path / "pt", tmp_path / "ms")):  # (PyTorch: the reference)
        result = aligner.compare(a, b)
        if ms_approximate == "none":
            assert not result.verdict.findings
            continue
        f = result.verdict.findings[0]
        assert f.culprit is Culprit.OP and [(s.name, s.value_a, s.value_b) for s in f.settings] == \
            [("approximate", "tanh", "none")], f
        assert "The op's arguments differ (first vs reference): approximate 'tanh' vs 'none'." in summary(result)
