"""`align audit --source` on pad_mode='same' (issue 28): a setting equal to the torch reference's is no finding (the
assumption is listed), and a suggested fix equals the reference's behaviour. Every equivalence the scan relies on is
shown here with real torch and MindSpore convolutions sharing one weight."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from aligner.pipelines.audit.source import audit_source
from aligner.render.words import say

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")

# mindcv 0.3.0 ConvNeXt's three convs as written (models/convnext.py lines 127, 187, 194)
MINDCV_CONVNEXT = textwrap.dedent("""\
    from mindspore import nn
    dwconv = nn.Conv2d(dim, dim, kernel_size=7, group=dim, has_bias=True)  # depthwise conv
    stem = nn.Conv2d(in_channels, dims[0], kernel_size=4, stride=4, has_bias=True)
    down = nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2, has_bias=True)
    strided = nn.Conv2d(8, 8, 3, stride=2, has_bias=True)
    """)


def _outputs(kernel: int, stride: int, size: int, torch_padding: int | str, ms_kw: dict, groups: int = 1
             ) -> tuple[np.ndarray, np.ndarray]:
    """One weight and input through torch Conv2d(padding=...) and MindSpore nn.Conv2d(**ms_kw)."""
    rng = np.random.default_rng(0)
    channels = 4
    weight = rng.standard_normal((channels, channels // groups, kernel, kernel)).astype(np.float32)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    pt = torch.nn.Conv2d(channels, channels, kernel, stride, padding=torch_padding, groups=groups, bias=False)
    with torch.no_grad():
        pt.weight.copy_(torch.from_numpy(weight))
        a = pt(torch.from_numpy(x)).numpy()
    cell = ms.nn.Conv2d(channels, channels, kernel, stride, group=groups, has_bias=False,
                        weight_init=ms.Tensor(weight), **ms_kw)
    return a, cell(ms.Tensor(x)).asnumpy()


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    # float32 sums of <= 196 products of N(0, 1) values in two kernels: ~1e-5 apart; a shifted window moves O(1)
    return a.shape == b.shape and float(np.abs(a - b).max()) < 1e-4


def test_same_at_stride_one_equals_torch_symmetric_and_same_padding() -> None:
    """The depthwise 7x7 of ConvNeXt: 'same' == torch padding=3 == padding='same' (16x16 stays 16x16); the old fix
    pad_mode='valid' shrinks it to 10x10. An even kernel at stride 1: 'same' == torch padding='same'."""
    a, b = _outputs(7, 1, 16, 3, {"pad_mode": "same"}, groups=4)
    assert _equal(a, b) and b.shape[-2:] == (16, 16)
    assert _equal(_outputs(7, 1, 16, "same", {"pad_mode": "same"}, groups=4)[0], b)
    assert _outputs(7, 1, 16, 3, {"pad_mode": "valid"}, groups=4)[1].shape[-2:] == (10, 10)
    assert _equal(*_outputs(4, 1, 15, "same", {"pad_mode": "same"}))


@pytest.mark.parametrize("kernel", [4, 2])
def test_same_with_kernel_equal_stride_pads_nothing_on_divisible_sizes(kernel: int) -> None:
    """4/4 and 2/2 convs: 'same' == torch padding=0 where the size divides by the stride (16), not where it does
    not (17: 'same' adds a window)."""
    assert _equal(*_outputs(kernel, kernel, 16, 0, {"pad_mode": "same"}))
    a, b = _outputs(kernel, kernel, 17, 0, {"pad_mode": "same"})
    assert a.shape != b.shape


def test_strided_same_differs_and_the_fix_equals_torch() -> None:
    """3x3 stride 2: 'same' pads (0, 1) on even sizes, torch padding=1 pads (1, 1): they differ; the suggested fix
    pad_mode='pad', padding=1 equals torch."""
    assert not _equal(*_outputs(3, 2, 16, 1, {"pad_mode": "same"}))
    assert _equal(*_outputs(3, 2, 16, 1, {"pad_mode": "pad", "padding": 1}))


def test_mindcv_convnext_convs_are_assumed_equal_and_the_strided_one_fixed(tmp_path: Path) -> None:
    """Before: an error on each of the three mindcv convs with the fix pad_mode='valid'. Now only the 3x3 stride-2
    conv is a finding (a warning: it depends on the input size), fixed as torch pads it; the others are listed as
    assumptions about the reference."""
    path = tmp_path / "convnext.py"
    path.write_text(MINDCV_CONVNEXT)
    report = audit_source(path)
    assert [(f.rule, f.where) for f in report.findings] == [("source.conv.pad_mode", (f"{path}:5",))]
    (found,) = report.findings
    assert found.severity.value == "warning" and report.exit_code == 0
    assert say(found.fix) == "nn.Conv2d(8, 8, 3, stride=2, has_bias=True, pad_mode='pad', padding=1)"
    assumed = {k: say(v) for k, v in report.assumed}
    assert sorted(assumed) == [f"{path}:{n}" for n in (2, 3, 4)]
    assert "padding=3 or padding='same'" in assumed[f"{path}:2"]
    assert "padding=0" in assumed[f"{path}:3"] and "divides by the stride" in assumed[f"{path}:4"]
    assert "pad_mode='valid'" not in say(found.fix)
