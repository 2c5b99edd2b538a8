"""Vision transformer: timm `VisionTransformer` vs mindcv `VisionTransformer` (a timm port), tiny config: 32x32
image, 8x8 patches, dim 64, depth 2, 4 heads, 10 classes, class token, random init.

Migration differences found (must be made identical for the outputs to agree; candidates for `align audit`):

* GELU: timm uses exact (erf) `nn.GELU()`; MindSpore `nn.GELU()` defaults to `approximate=True` (tanh). Passed
  `act_layer=partial(nn.GELU, approximate=False)` to mindcv. Left at the default the logits differ by 2.4e-4
  (with torch default init; with timm's std-0.02 init only 1e-6, which is why the builder re-initialises).
* LayerNorm eps: timm ViT uses `partial(nn.LayerNorm, eps=1e-6)`; MindSpore `nn.LayerNorm` defaults to
  `epsilon=1e-7`. Passed `norm_layer=partial(nn.LayerNorm, epsilon=1e-6)`; left at the default: 5.3e-4.
* naming: LayerNorm `weight/bias` vs `gamma/beta`; the fused `attn.qkv` Linear exists on both sides with the same
  [q; k; v] row order, so `align convert --like` needs no user map.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)
IMG = 32


def build(seed: int = 0) -> Pair:
    from mindcv.models.vit import VisionTransformer as MsViT
    from mindspore import nn
    from timm.models.vision_transformer import VisionTransformer as PtViT

    seed_all(seed)
    pt = PtViT(img_size=IMG, **CFG).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsViT(image_size=IMG, **CFG, act_layer=partial(nn.GELU, approximate=False),
                norm_layer=partial(nn.LayerNorm, epsilon=1e-6))
    msm.set_train(False)
    x = np.random.default_rng(seed).standard_normal((2, 3, IMG, IMG)).astype(np.float32)
    return Pair(name="vit_tiny", torch_model=pt, ms_model=msm, torch_inputs={"x": x}, ms_inputs={"x": x},
                notes=["mindcv GELU approximate=False (MS default tanh)",
                       "mindcv LayerNorm epsilon=1e-6 (MS default 1e-7)"])
