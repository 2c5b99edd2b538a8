"""Real zoo model pairs (torch zoo model vs MindSpore zoo model): build with random init, convert the torch weights
with `align convert --like` (plus a user map where documented), strict-load them, and compare the outputs.

Skipped when the zoo is not installed (scripts/install_zoo.sh).
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "mindcv", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

from tests.zoo import ms_compat  # noqa: E402

# (module, tolerance). float32 everywhere; the torch and MindSpore kernels sum in different orders, so each output
# element carries ~1e-7 relative rounding per layer (measured: 1e-8 .. 1e-6 absolute). The smallest genuine
# migration difference met in these pairs moves the outputs by >= 2e-4 (tanh vs erf GELU, LayerNorm eps 1e-7 vs
# 1e-6 in the ViT); a swapped or missing tensor by >= 1e-2. atol 2e-5 sits 20x above the noise and 10x below that.
PAIRS = {
    "cnn": 2e-5,          # timm resnet50 vs mindcv resnet50 (BatchNorm, downsample), |logits| <~ 1
    "vit": 2e-5,          # timm ViT vs mindcv ViT
    "encoder_lm": 2e-5,   # transformers BERT-MLM vs mindone BERT-MLM
    "decoder_lm": 2e-5,   # transformers Llama vs mindone Llama (GQA, RoPE)
    "mha": 2e-5,          # transformers SigLIP vision + nn.MultiheadAttention pooling head vs mindone
    "upsample": 2e-5,     # transformers SegFormer (bilinear upsampling) vs mindone
}


@pytest.fixture(scope="module", autouse=True)
def mindspore_cpu_routes():
    """Route mint ops without CPU kernels for this module only (the suite shares worker processes)."""
    ms_compat.install()
    yield
    ms_compat.uninstall()


@pytest.mark.parametrize("family", list(PAIRS))
def test_pair_agrees_after_align_convert(family, tmp_path):
    pair = importlib.import_module(f"tests.zoo.{family}").build(seed=0)
    before = pair.max_abs_diff()
    assert before > 1e-2, f"{pair.name}: outputs agree before conversion ({before}); the comparison proves nothing"

    pair.make_equal(tmp_path)  # align convert --like (--map) + strict load_param_into_net

    torch_out, ms_out = pair.run_torch(), pair.run_ms()
    assert torch_out.shape == ms_out.shape
    assert np.isfinite(torch_out).all() and np.abs(torch_out).max() > 1e-2  # not a vanishing output
    diff = float(np.max(np.abs(torch_out - ms_out)))
    print(f"{pair.name}: max|torch - ms| = {diff:.3g} (before conversion {before:.3g})")
    assert diff <= PAIRS[family], f"{pair.name}: max |torch - mindspore| = {diff}"
