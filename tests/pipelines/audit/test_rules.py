"""Every rule of mappings/audit_layers.yaml against the installed frameworks, one hand-made pair per rule: the torch
layer, a MindSpore layer with the other setting, and one with the setting the fix names. The rule must fire on the
first pair and not on the second; the aligned pair's outputs must agree (max |diff| <= 1e-5, float32 rounding), and
where the rule says error, the misaligned pair's outputs must differ (max |diff| > 1e-4, ten times the agreement
bound, or another shape: tanh vs erf GELU, the smallest, differs by 4.7e-4 here); a warning or info rule's
misaligned pair must agree in eval mode (it changes training only)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import pytest

from aligner.core.findings import Severity
from aligner.pipelines.audit import audit
from aligner.pipelines.audit.rules import load_rulebook
from aligner.render.words import say

AGREE, DIFFER = 1e-5, 1e-4


@dataclasses.dataclass
class Case:
    rule: str
    torch: Callable[[], Any]
    ms_bad: Callable[[], Any]
    ms_good: Callable[[], Any]
    inputs: Callable[[], tuple[np.ndarray, ...]]
    severity: Severity
    torch_good: Callable[[], Any] | None = None    # the aligned pair's torch layer, when the fix is on torch's side


def _x(*shape: int, scale: float = 1.0) -> Callable[[], tuple[np.ndarray, ...]]:
    return lambda: (np.random.default_rng(0).standard_normal(shape).astype(np.float32) * scale,)


def _ce_inputs() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((6, 4)).astype(np.float32), np.array([0, 1, 2, 3, 0, 1], dtype=np.int32)


def _tnn() -> Any:
    import torch.nn as tnn
    return tnn


def _mnn() -> Any:
    from mindspore import nn
    return nn


def _ms_train(cell: Any) -> Any:
    cell.set_train(True)
    return cell


def _ms_eval(cell: Any) -> Any:
    cell.set_train(False)
    return cell


def _fp16(cell: Any) -> Any:
    import mindspore as ms
    return cell.to_float(ms.float16)


CASES = [
    Case("padding", lambda: _tnn().MaxPool2d(3, 2, padding=1), lambda: _mnn().MaxPool2d(3, 2, pad_mode="same"),
         lambda: _mnn().MaxPool2d(3, 2, pad_mode="pad", padding=1), _x(1, 2, 8, 8), Severity.ERROR),
    Case("pool-ceil-mode", lambda: _tnn().MaxPool2d(2, 2, ceil_mode=True),
         lambda: _mnn().MaxPool2d(2, 2, pad_mode="pad", padding=0),
         lambda: _mnn().MaxPool2d(2, 2, pad_mode="pad", padding=0, ceil_mode=True), _x(1, 2, 7, 7), Severity.ERROR),
    Case("avgpool-count-include-pad", lambda: _tnn().AvgPool2d(3, 1, padding=1, count_include_pad=False),
         lambda: _mnn().AvgPool2d(3, 1, pad_mode="pad", padding=1),
         lambda: _mnn().AvgPool2d(3, 1, pad_mode="pad", padding=1, count_include_pad=False), _x(1, 2, 6, 6),
         Severity.ERROR),
    Case("bias", lambda: _tnn().Conv2d(2, 3, 3, padding=1), lambda: _mnn().Conv2d(2, 3, 3),
         lambda: _mnn().Conv2d(2, 3, 3, has_bias=True), _x(1, 2, 6, 6), Severity.ERROR),
    Case("norm-eps", lambda: _tnn().LayerNorm(8), lambda: _mnn().LayerNorm((8,)),
         lambda: _mnn().LayerNorm((8,), epsilon=1e-5), _x(4, 8, scale=1e-2), Severity.ERROR),
    Case("bn-momentum", lambda: _tnn().BatchNorm2d(3).eval(), lambda: _ms_eval(_mnn().BatchNorm2d(3, momentum=0.1)),
         lambda: _ms_eval(_mnn().BatchNorm2d(3)), _x(2, 3, 4, 4), Severity.WARNING),
    Case("batch-statistics", lambda: _tnn().BatchNorm2d(3, track_running_stats=False).eval(),
         lambda: _ms_eval(_mnn().BatchNorm2d(3)), lambda: _ms_eval(_mnn().BatchNorm2d(3, use_batch_statistics=True)),
         _x(2, 3, 4, 4), Severity.ERROR),
    Case("affine", lambda: _tnn().BatchNorm2d(3, affine=False).eval(), lambda: _ms_eval(_mnn().BatchNorm2d(3)),
         lambda: _ms_eval(_mnn().BatchNorm2d(3, affine=False)), _x(2, 3, 4, 4), Severity.WARNING),
    Case("gelu-approximate", lambda: _tnn().GELU(), lambda: _mnn().GELU(),
         lambda: _mnn().GELU(approximate=False), _x(4, 16, scale=3.0), Severity.ERROR),
    Case("leaky-relu-slope", lambda: _tnn().LeakyReLU(), lambda: _mnn().LeakyReLU(),
         lambda: _mnn().LeakyReLU(0.01), _x(4, 16), Severity.ERROR),
    Case("dropout-p", lambda: _tnn().Dropout(0.1).eval(), lambda: _ms_eval(_mnn().Dropout(keep_prob=0.1)),
         lambda: _ms_eval(_mnn().Dropout(p=0.1)), _x(4, 16), Severity.WARNING),
    Case("upsample-mode", lambda: _tnn().Upsample(size=(8, 8), mode="nearest"),
         lambda: _mnn().Upsample(size=(8, 8), mode="bilinear"),
         lambda: _mnn().Upsample(size=(8, 8), mode="nearest"), _x(1, 2, 4, 4), Severity.ERROR),
    Case("upsample-align-corners", lambda: _tnn().Upsample(size=(8, 8), mode="bilinear", align_corners=True),
         lambda: _mnn().Upsample(size=(8, 8), mode="bilinear"),
         lambda: _mnn().Upsample(size=(8, 8), mode="bilinear", align_corners=True), _x(1, 2, 4, 4),
         Severity.ERROR),
    Case("embedding-padding-idx", lambda: _tnn().Embedding(10, 4, padding_idx=0), lambda: _mnn().Embedding(10, 4),
         lambda: _mnn().Embedding(10, 4, padding_idx=0), lambda: (np.array([[0, 3, 5]], dtype=np.int32),),
         Severity.WARNING),
    Case("inplace", lambda: _tnn().ReLU(inplace=True), lambda: _mnn().ReLU(), lambda: _mnn().ReLU(),
         _x(4, 16), Severity.INFO, torch_good=lambda: _tnn().ReLU()),
    Case("train-mode-batchnorm", lambda: _tnn().BatchNorm2d(3).eval(), lambda: _ms_train(_mnn().BatchNorm2d(3)),
         lambda: _ms_eval(_mnn().BatchNorm2d(3)), _x(2, 3, 4, 4), Severity.ERROR),
    Case("train-mode-dropout", lambda: _tnn().Dropout(0.5).eval(), lambda: _ms_train(_mnn().Dropout(p=0.5)),
         lambda: _ms_eval(_mnn().Dropout(p=0.5)), _x(4, 16), Severity.WARNING),
    Case("ce-ignore-index", lambda: _tnn().CrossEntropyLoss(ignore_index=0), lambda: _mnn().CrossEntropyLoss(),
         lambda: _mnn().CrossEntropyLoss(ignore_index=0), _ce_inputs, Severity.ERROR),
    Case("ce-label-smoothing", lambda: _tnn().CrossEntropyLoss(label_smoothing=0.1),
         lambda: _mnn().CrossEntropyLoss(), lambda: _mnn().CrossEntropyLoss(label_smoothing=0.1), _ce_inputs,
         Severity.ERROR),
    Case("ce-reduction", lambda: _tnn().CrossEntropyLoss(), lambda: _mnn().SoftmaxCrossEntropyWithLogits(sparse=True),
         lambda: _mnn().SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), _ce_inputs, Severity.ERROR),
    Case("compute-dtype", lambda: _tnn().Linear(16, 8), lambda: _fp16(_mnn().Dense(16, 8)),
         lambda: _mnn().Dense(16, 8), _x(4, 16, scale=10.0), Severity.ERROR),
]


def copy_weights(pt: Any, cell: Any) -> None:
    """The torch layer's parameters and buffers into the MindSpore layer (neutral leaf names, MindSpore shapes)."""
    import mindspore as ms

    from aligner.mapping.structural import neutral_leaf

    source = {name.rpartition(".")[2]: t.detach().numpy() for name, t in pt.state_dict().items()}
    for name, param in cell.parameters_and_names():
        leaf = neutral_leaf(name.rpartition(".")[2])
        if leaf in source:
            param.set_data(ms.Tensor(source[leaf].reshape(param.shape).astype(np.float32)))


def run_torch(pt: Any, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    import torch

    args = [torch.from_numpy(a.astype(np.int64) if a.dtype.kind == "i" else a) for a in inputs]
    with torch.no_grad():
        return pt(*args).numpy()


def run_ms(cell: Any, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    import mindspore as ms

    return cell(*[ms.Tensor(a) for a in inputs]).float().asnumpy()


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    return float("inf") if a.shape != b.shape else float(np.max(np.abs(a.astype(np.float64) - b)))


def _perturb(pt: Any) -> None:
    """Non-trivial constants (a bias, BatchNorm statistics) so that a dropped or ignored one shows in the output."""
    import torch

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in pt.state_dict().items():
            if t.is_floating_point():
                t.copy_(t + torch.rand(t.shape, generator=gen) * 0.5 + (0.5 if "var" in name else 0.0))


def test_every_rule_has_a_case() -> None:
    assert {c.rule for c in CASES} == {r.id for r in load_rulebook().rules}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.rule)
def test_rule_outputs_and_findings(case: Case) -> None:
    pt, bad, good = case.torch(), case.ms_bad(), case.ms_good()
    _perturb(pt)
    for cell in (bad, good):
        copy_weights(pt, cell)
    inputs = case.inputs()
    want = run_torch(pt, inputs)
    assert _gap(want, run_ms(good, inputs)) <= AGREE, "the fix's setting must reproduce torch"
    bad_gap = _gap(want, run_ms(bad, inputs))
    if case.severity == Severity.ERROR:
        assert bad_gap > DIFFER, f"{case.rule} is an error, yet the outputs agree ({bad_gap:.2e})"
    elif case.rule != "train-mode-dropout":   # dropout in train mode is random: its output cannot agree
        assert bad_gap <= AGREE, f"{case.rule} is not an error, yet the forward differs ({bad_gap:.2e})"

    example = inputs if case.rule not in ("ce-ignore-index", "ce-label-smoothing", "ce-reduction") else None
    found = [f for f in audit(pt, bad, example).findings if f.rule == case.rule]
    assert len(found) == 1 and found[0].severity == case.severity, found
    assert say(found[0].fix), found[0]
    aligned_pt = case.torch_good() if case.torch_good else pt
    assert not [f for f in audit(aligned_pt, good, example).findings if f.rule == case.rule]


def test_dropout_rates_in_train_mode_differ() -> None:
    """dropout-p is a warning because only training sees it: the zeroed fraction is 0.1 vs 0.9."""
    import mindspore as ms
    from mindspore import nn

    x = ms.Tensor(np.ones((200, 200), np.float32))
    bad, good = _ms_train(nn.Dropout(keep_prob=0.1)), _ms_train(nn.Dropout(p=0.1))
    assert abs(float((bad(x).asnumpy() == 0).mean()) - 0.9) < 0.02
    assert abs(float((good(x).asnumpy() == 0).mean()) - 0.1) < 0.02


def test_momentum_convention_in_training() -> None:
    """bn-momentum: after one training step, MindSpore momentum=0.9 moves the running mean as torch's 0.1 does."""
    import mindspore as ms
    import torch
    from mindspore import nn

    x = np.random.default_rng(0).standard_normal((4, 3, 4, 4)).astype(np.float32) + 2.0
    pt = torch.nn.BatchNorm2d(3).train()
    pt(torch.from_numpy(x))
    means = {}
    for momentum in (0.9, 0.1):
        cell = _ms_train(nn.BatchNorm2d(3, momentum=momentum))
        cell(ms.Tensor(x))
        means[momentum] = cell.moving_mean.asnumpy()
    assert pt.running_mean is not None
    assert np.allclose(means[0.9], pt.running_mean.numpy(), atol=1e-6)
    assert not np.allclose(means[0.1], pt.running_mean.numpy(), atol=1e-2)


def test_same_padding_stride_one_is_not_a_finding() -> None:
    """A 3x3 stride-1 'same' conv pads (1, 1) on every side for every size: equal to torch padding=1."""
    import torch
    from mindspore import nn

    pt = torch.nn.Conv2d(2, 3, 3, padding=1, bias=False)
    cell = nn.Conv2d(2, 3, 3, pad_mode="same")
    copy_weights(pt, cell)
    x = _x(1, 2, 7, 6)()
    assert _gap(run_torch(pt, x), run_ms(cell, x)) <= AGREE
    assert not [f for f in audit(pt, cell).findings if f.rule == "padding"]
    assert not [f for f in audit(pt, cell, x).findings if f.rule == "padding"]
