"""disable_dropout reaches every kind of dropout in torch and MindSpore: a model in training mode that uses it is
caught by check_determinism without disable_dropout and is bitwise deterministic with it (BatchNorm stays in training
mode), and leaving `with disable_dropout(model):` puts every setting and function back."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mindspore as ms
import numpy as np
import pytest
import torch
from mindspore import mint, ops
from torch import nn

import aligner
from aligner.dumping.randomness import DisabledDropout

ms.set_context(mode=ms.PYNATIVE_MODE)
RNG = np.random.default_rng(0)


def float_settings(model: Any) -> dict[str, float]:
    """Every float attribute of every module or cell, keyed "path.attribute"."""
    modules = model.named_modules() if isinstance(model, nn.Module) else model.cells_and_names()
    return {f"{path}.{k}": v for path, m in modules for k, v in vars(m).items() if isinstance(v, float)}


def assert_caught_then_disabled(model: Any, step: Callable[[], Any]) -> DisabledDropout:
    """Dropout noise is reported without disable_dropout, gone inside its context, back after it; returns the
    context's record of what it switched off. (Models here drop at least 32 independent elements or channels, so
    two runs draw the same masks with chance 2**-32 at most.)"""
    before = float_settings(model)
    assert not aligner.check_determinism(step, model=model).deterministic
    with aligner.disable_dropout(model) as off:
        report = aligner.check_determinism(step, model=model)
        assert report.deterministic, str(report)
    assert float_settings(model) == before
    assert not aligner.check_determinism(step, model=model).deterministic
    return off


def torch_tensor(*shape: int) -> torch.Tensor:
    return torch.from_numpy(RNG.standard_normal(shape).astype(np.float32))


def ms_tensor(*shape: int) -> ms.Tensor:
    return ms.Tensor(RNG.standard_normal(shape).astype(np.float32))


# ---- PyTorch ------------------------------------------------------------------------------------------------------
class TorchLayers(nn.Module):
    """Linear + training-mode BatchNorm, then every torch dropout layer class."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 24)
        self.bn = nn.BatchNorm1d(24)
        self.drops = nn.Sequential(nn.Dropout(0.5), nn.AlphaDropout(0.5), nn.FeatureAlphaDropout(0.5))
        self.drop1d, self.drop2d, self.drop3d = nn.Dropout1d(0.5), nn.Dropout2d(0.5), nn.Dropout3d(0.5)
        self.off = nn.Dropout(0.0)  # already off: not reported

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.off(self.drops(self.bn(self.fc(x))))
        h = self.drop1d(h.view(4, 6, 4)).view(4, 3, 2, 4)
        return self.drop3d(self.drop2d(h).view(4, 3, 2, 2, 2))


def test_torch_dropout_layers_are_switched_off_with_batchnorm_left_in_training_mode() -> None:
    model, x = TorchLayers().train(), torch_tensor(4, 8)
    off = assert_caught_then_disabled(model, lambda: model(x))
    assert off == ["drops.0", "drops.1", "drops.2", "drop1d", "drop2d", "drop3d"]
    assert off.attributes == {f"{path}.p": 0.5 for path in off}
    assert "torch.nn.functional.dropout" in off.functions
    assert model.bn.training
    mean = model.bn.state_dict()["running_mean"].clone()
    with aligner.disable_dropout(model):
        model(x)
    assert not torch.equal(model.bn.state_dict()["running_mean"], mean)  # batch statistics, not eval mode


@pytest.mark.parametrize("build, attributes", [
    (lambda: nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True), {"<model>.dropout": 0.5}),
    (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5, batch_first=True),
     {"self_attn.dropout": 0.5, "dropout.p": 0.5, "dropout1.p": 0.5, "dropout2.p": 0.5}),
], ids=["MultiheadAttention", "TransformerEncoderLayer"])
def test_torch_attention_modules(build: Callable[[], nn.Module], attributes: dict[str, float]) -> None:
    model, q = build().train(), torch_tensor(2, 3, 8)

    def step() -> Any:
        out = model(q, q, q) if isinstance(model, nn.MultiheadAttention) else model(q)
        out = out[0] if isinstance(out, tuple) else out
        out.square().sum().backward()
        return out

    assert assert_caught_then_disabled(model, step).attributes == attributes


class TorchFunctional(nn.Module):
    """Calls one functional dropout from forward, with a literal probability (out of disable_dropout's reach unless
    inside its context) or a float attribute (reached: `attention_dropout`, `drop_prob`, as in HF and DropPath)."""

    def __init__(self, call: Callable[[TorchFunctional, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.call = call
        self.attention_dropout = 0.5
        self.drop_prob = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(self, self.fc(x).view(4, 8, 2, 8))


def _sdpa(m: TorchFunctional, h: torch.Tensor) -> torch.Tensor:
    return nn.functional.scaled_dot_product_attention(h, h, h, None, 0.5)


def _drop_path(m: TorchFunctional, h: torch.Tensor) -> torch.Tensor:
    keep = (torch.rand(4, 8, 1, 1) >= m.drop_prob).to(h.dtype) if m.training and m.drop_prob else 1.0
    return h * keep


@pytest.mark.parametrize("call, reached_by_attribute", [
    (lambda m, h: nn.functional.dropout(h, 0.5, m.training), False),
    (lambda m, h: nn.functional.dropout2d(h, 0.5, m.training), False),
    (lambda m, h: nn.functional.alpha_dropout(h, 0.5, m.training), False),
    (lambda m, h: torch.dropout(h, 0.5, m.training), False),
    (lambda m, h: torch.feature_alpha_dropout(h, 0.5, m.training), False),
    (_sdpa, False),
    (lambda m, h: nn.functional.scaled_dot_product_attention(h, h, h, dropout_p=0.5, is_causal=True), False),
    (lambda m, h: nn.functional.dropout(h, p=m.attention_dropout, training=m.training), True),
    (lambda m, h: nn.functional.scaled_dot_product_attention(h, h, h, dropout_p=m.attention_dropout), True),
    (_drop_path, True),
], ids=["F.dropout", "F.dropout2d", "F.alpha_dropout", "torch.dropout", "torch.feature_alpha_dropout",
        "sdpa-positional", "sdpa-keyword", "F.dropout-attribute", "sdpa-attribute", "drop_prob-attribute"])
def test_torch_functional_dropout_in_forward(call: Callable[[TorchFunctional, torch.Tensor], torch.Tensor],
                                             reached_by_attribute: bool) -> None:
    model, x = TorchFunctional(call).train(), torch_tensor(64, 8)
    originals = (nn.functional.dropout, nn.functional.scaled_dot_product_attention, torch.dropout)
    off = assert_caught_then_disabled(model, lambda: model(x))
    assert off.attributes == {"<model>.attention_dropout": 0.5, "<model>.drop_prob": 0.5}
    assert (nn.functional.dropout, nn.functional.scaled_dot_product_attention, torch.dropout) == originals
    plain = aligner.disable_dropout(model)  # without the context only the attributes are reached
    try:
        assert aligner.check_determinism(lambda: model(x), model=model).deterministic == reached_by_attribute
    finally:
        plain.restore()


def test_timm_vit_with_every_drop_rate() -> None:
    from tests.zoo import torch_compat  # noqa: F401  (before timm: torchvision op schemas)

    pytest.importorskip("timm")
    from timm.layers import Attention
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=4,
                              drop_rate=0.3, pos_drop_rate=0.3, proj_drop_rate=0.3, attn_drop_rate=0.3,
                              drop_path_rate=0.3).train()
    attn = model.blocks[0].attn
    assert isinstance(attn, Attention) and attn.fused_attn  # SDPA with dropout_p=self.attn_drop.p
    x = torch_tensor(2, 3, 16, 16)
    off = assert_caught_then_disabled(model, lambda: model(x))
    assert {"blocks.0.attn.attn_drop.p", "blocks.1.drop_path1.drop_prob", "head_drop.p"} <= set(off.attributes)


@pytest.mark.parametrize("family", ["bert-sdpa", "siglip-eager"])
def test_transformers_models_with_dropout(family: str) -> None:
    from tests.zoo import torch_compat  # noqa: F401  (before transformers: torchvision op schemas)

    transformers = pytest.importorskip("transformers")
    small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    if family == "bert-sdpa":
        cfg = transformers.BertConfig(vocab_size=50, max_position_embeddings=16, hidden_dropout_prob=0.3,
                                      attention_probs_dropout_prob=0.3, **small)
        cfg._attn_implementation = "sdpa"
        model, ids = transformers.BertModel(cfg).train(), torch.from_numpy(RNG.integers(0, 50, (2, 6)))
        key = "encoder.layer.0.attention.self.dropout_prob"  # SDPA dropout_p
        off = assert_caught_then_disabled(model, lambda: model(ids).last_hidden_state)
    else:
        cfg = transformers.SiglipVisionConfig(image_size=16, patch_size=8, attention_dropout=0.3, **small)
        cfg._attn_implementation = "eager"
        model, px = transformers.SiglipVisionModel(cfg).train(), torch_tensor(2, 3, 16, 16)
        key = "vision_model.encoder.layers.0.self_attn.dropout"  # a float passed to F.dropout
        off = assert_caught_then_disabled(model, lambda: model(px).pooler_output)
    assert off.attributes[key] == 0.3


# ---- MindSpore ----------------------------------------------------------------------------------------------------
class MsLayers(ms.nn.Cell):
    """Dense + training-mode BatchNorm, then every MindSpore dropout layer class, plus two already off."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = ms.nn.Dense(8, 24)
        self.bn = ms.nn.BatchNorm1d(24)
        self.drop = ms.nn.Dropout(p=0.5)
        self.legacy = ms.nn.Dropout(keep_prob=0.5)
        self.drop1d, self.drop2d, self.drop3d = ms.nn.Dropout1d(0.5), ms.nn.Dropout2d(0.5), ms.nn.Dropout3d(0.5)
        self.off_p, self.off_keep = ms.nn.Dropout(p=0), ms.nn.Dropout(keep_prob=1.0)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        h = self.off_keep(self.off_p(self.legacy(self.drop(self.bn(self.fc(x))))))
        h = self.drop1d(h.view(4, 6, 4)).view(4, 3, 2, 4)
        return self.drop3d(self.drop2d(h).view(4, 3, 2, 2, 2))


def test_mindspore_dropout_layers_are_switched_off_with_batchnorm_left_in_training_mode() -> None:
    model, x = MsLayers(), ms_tensor(4, 8)
    model.set_train(True)
    off = assert_caught_then_disabled(model, lambda: model(x))
    assert off == ["drop", "legacy", "drop1d", "drop2d", "drop3d"]  # p=0 and keep_prob=1.0 are already off
    assert off.attributes == {"drop.p": 0.5, "legacy.keep_prob": 0.5, "drop1d.prob": 0.5, "drop2d.keep_prob": 0.5,
                              "drop3d.keep_prob": 0.5}
    assert "mindspore.ops.dropout" in off.functions
    assert model.bn.training
    mean = model.bn.moving_mean.asnumpy().copy()
    with aligner.disable_dropout(model):
        model(x)
    assert not np.array_equal(model.bn.moving_mean.asnumpy(), mean)  # batch statistics, not eval mode


@pytest.mark.parametrize("build, attributes", [
    (lambda: ms.nn.MultiheadAttention(8, 2, dropout=0.5), {"<model>.dropout": 0.5}),
    (lambda: ms.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5),
     {"<model>.dropout_num": 0.5, "self_attn.dropout": 0.5, "dropout.p": 0.5, "dropout1.p": 0.5,
      "dropout2.p": 0.5}),
], ids=["MultiheadAttention", "TransformerEncoderLayer"])
def test_mindspore_attention_modules(build: Callable[[], ms.nn.Cell], attributes: dict[str, float]) -> None:
    """MindSpore 2.10's MultiheadAttention keeps its probability in the float `dropout` and passes it as dropout_p
    to ops.function.nn_func.multi_head_attention_forward."""
    model, q = build(), ms_tensor(3, 2, 8)
    model.set_train(True)
    step = (lambda: model(q, q, q)) if isinstance(model, ms.nn.MultiheadAttention) else (lambda: model(q))
    assert assert_caught_then_disabled(model, step).attributes == attributes


class MsFunctional(ms.nn.Cell):
    """Calls one functional dropout from construct with a literal probability."""

    def __init__(self, call: Callable[[ms.nn.Cell, ms.Tensor], ms.Tensor]) -> None:
        super().__init__()
        self.fc = ms.nn.Dense(8, 8)
        self.call = call

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.call(self, self.fc(x).view(4, 8, 2, 8))


@pytest.mark.parametrize("call", [
    lambda m, h: ops.dropout(h, 0.5, m.training),
    lambda m, h: ops.dropout1d(h.view(4, 8, 16), 0.5, m.training),
    lambda m, h: ops.dropout2d(h, 0.5, m.training),
    lambda m, h: ops.dropout3d(h.view(4, 8, 2, 2, 4), 0.5, m.training),
], ids=["ops.dropout", "ops.dropout1d", "ops.dropout2d", "ops.dropout3d"])
def test_mindspore_functional_dropout_in_construct(call: Callable[[ms.nn.Cell, ms.Tensor], ms.Tensor]) -> None:
    model, x = MsFunctional(call), ms_tensor(64, 8)
    model.set_train(True)
    original = ops.dropout
    assert assert_caught_then_disabled(model, lambda: model(x)) == []
    assert ops.dropout is original
    assert aligner.disable_dropout(model) == []  # nothing to reach from outside the context


def assert_dropout_is_live(model: ms.nn.Cell, step: Callable[[], ms.Tensor]) -> None:
    """MindSpore 2.10's CPU build has no DropoutExt kernel (mint dropout): there a live mint dropout fails to run
    (raised when the asynchronous PyNative pipeline syncs); elsewhere check_determinism reports its noise."""
    if ms.get_context("device_target") == "CPU":
        with pytest.raises(RuntimeError, match="DropoutExt unregistered"):
            step().asnumpy()
    else:
        assert not aligner.check_determinism(step, model=model).deterministic


class MintLayer(ms.nn.Cell):
    """A mint.nn.Dropout layer after a Dense."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = ms.nn.Dense(8, 8)
        self.drop = mint.nn.Dropout(0.5)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.drop(self.fc(x))


@pytest.mark.parametrize("build, attributes", [
    (MintLayer, {"drop.p": 0.5}),
    (lambda: MsFunctional(lambda m, h: mint.nn.functional.dropout(h, 0.5, m.training)), {}),
], ids=["mint.nn.Dropout", "mint.nn.functional.dropout"])
def test_mint_dropout(build: Callable[[], ms.nn.Cell], attributes: dict[str, float]) -> None:
    model, x = build(), ms_tensor(64, 8)
    model.set_train(True)
    assert_dropout_is_live(model, lambda: model(x))
    with aligner.disable_dropout(model) as off:
        assert aligner.check_determinism(lambda: model(x), model=model).deterministic
    assert off.attributes == attributes
    assert "mindspore.mint.nn.functional.dropout" in off.functions
    assert_dropout_is_live(model, lambda: model(x))  # restored


def test_mindcv_vit_with_every_drop_rate() -> None:
    pytest.importorskip("mindcv")
    from mindcv.models.vit import VisionTransformer

    model = VisionTransformer(image_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=4,
                              drop_rate=0.3, pos_drop_rate=0.3, proj_drop_rate=0.3, attn_drop_rate=0.3,
                              drop_path_rate=0.3)
    model.set_train(True)
    x = ms_tensor(2, 3, 16, 16)
    off = assert_caught_then_disabled(model, lambda: model(x))
    assert {"blocks.0.attn.attn_drop.p", "blocks.1.drop_path1.keep_prob", "head_drop.p"} <= set(off.attributes)


def test_mindone_siglip_attention_dropout() -> None:
    """mindone's Siglip attention keeps `attention_dropout` in the float `dropout` and passes it to mint dropout."""
    from tests.zoo import torch_compat  # noqa: F401  (mindone imports timm and transformers)

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("mindone.transformers")
    from mindone.transformers import SiglipVisionModel

    from tests.zoo import ms_compat

    ms_compat.install()  # CPU routes for mindone's other mint ops
    try:
        cfg = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=16, patch_size=8,
                                              attention_dropout=0.3)
        cfg._attn_implementation = "eager"
        model, px = SiglipVisionModel(cfg), ms_tensor(2, 3, 16, 16)
        model.set_train(True)
        assert_dropout_is_live(model, lambda: model(px)[1])
        with aligner.disable_dropout(model) as off:
            assert aligner.check_determinism(lambda: model(px)[1], model=model).deterministic
        assert off.attributes == {"vision_model.encoder.layers.0.self_attn.dropout": 0.3}
    finally:
        ms_compat.uninstall()
