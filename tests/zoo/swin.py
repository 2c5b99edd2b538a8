"""Windowed-attention vision model: timm `SwinTransformer` vs mindcv `SwinTransformer` (Swin v1: window attention
with a relative-position bias table, cyclic shift by half a window in every second block, patch merging), tiny config:
32x32 image, 4x4 patches (8x8 tokens), window 4 (shift 2 in stage 0; stage 1 at 4x4 tokens is one window, no
shift), dim 16, depths (2, 2), heads (2, 4), 10 classes, dropout and drop-path 0, random init.

Migration differences found (must be made identical for the outputs to agree; candidates for `align audit`):

* GELU: timm's exact (erf) `nn.GELU()`; mindcv's `Mlp` builds MindSpore `nn.GELU()`, whose default is
  `approximate=True` (tanh), and `SwinTransformer` has no argument to change it. The builder sets
  `approximate=False` on every block's `mlp.act`.
* layout: timm 1.x runs the stages in NHWC ([B, H, W, C]) and merges patches at the START of stages 1.. (timm
  `layers.1.downsample`); mindcv runs [B, H*W, C] and merges at the END of stages ..n-1 (`layers.0.downsample`):
  USER_MAP renames the merge, `--like` splits timm's fused `attn.qkv` into mindcv's `attn.q/k/v`.
* parameter names: mindcv appends the stages to an empty `nn.CellList` after building them, so MindSpore 2.10 names
  their Parameters `0.blocks.0...` and `0.blocks.1.blocks.0...` (the cell paths are `layers.0.blocks.0...`,
  `layers.1.blocks.0...`). The builder names every Parameter by its cell path (`parameters_and_names`), so the
  checkpoint keys are the paths the dumps use.
* patch merging: mindcv's `PatchMerging` builds MindSpore `nn.LayerNorm([4 * dim])`, whose epsilon defaults to
  1e-7; timm's uses torch's 1e-5 (logits 3.0e-6 apart as built; `align audit` names it). The builder gives mindcv's
  merge a LayerNorm with epsilon 1e-5 (weights come from the conversion).
* mindcv keeps the shift mask (`attn_mask`) and the one-hot bias index (`relative_bias.index`) as non-trainable
  Parameters, so they are checkpoint keys no torch tensor fills (timm: non-persistent buffers, recomputed at build)
  and `align convert --like` refuses ("5 target key(s) unfilled"). The builder turns them into plain Tensor
  attributes holding the same constants (`_constants_to_tensors`).
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, num_classes=10,
           drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0)
IMG = 32

USER_MAP = """\
rename:
  layers.1.downsample.norm.weight: layers.0.downsample.norm.gamma
  layers.1.downsample.norm.bias: layers.0.downsample.norm.beta
  layers.1.downsample.reduction.weight: layers.0.downsample.reduction.weight
"""


def _constants_to_tensors(msm) -> None:
    """mindcv's non-trainable constant Parameters -> plain Tensor attributes (same values; see the docstring)."""
    import mindspore as ms

    for _, cell in msm.cells_and_names():
        for name in ("attn_mask", "index"):
            param = cell._params.get(name)
            if param is not None and not param.requires_grad:
                del cell._params[name]
                object.__setattr__(cell, name, ms.Tensor(param.asnumpy()))


def build(seed: int = 0, batch: int = 2) -> Pair:
    from mindcv.models.swintransformer import SwinTransformer as MsSwin
    from mindspore import nn
    from timm.models.swin_transformer import SwinTransformer as PtSwin

    seed_all(seed)
    pt = PtSwin(img_size=IMG, **CFG).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsSwin(image_size=IMG, **CFG)
    _constants_to_tensors(msm)
    for layer in msm.layers:  # the patch-merging LayerNorm epsilon difference above (timm's 1e-5)
        if layer.downsample is not None:
            layer.downsample.norm = nn.LayerNorm(layer.downsample.norm.normalized_shape, epsilon=1e-5)
    for path, param in msm.parameters_and_names():  # the Parameter-name difference above
        param.name = path
    for layer in msm.layers:
        for block in layer.blocks:
            block.mlp.act.approximate = "none"  # the GELU difference above (nn.GELU(approximate=False))
    msm.set_train(False)
    x = np.random.default_rng(seed).standard_normal((batch, 3, IMG, IMG)).astype(np.float32)
    return Pair(name="swin_tiny", torch_model=pt, ms_model=msm, torch_inputs={"x": x}, ms_inputs={"x": x},
                user_map=USER_MAP, notes=["mindcv Mlp GELU approximate=False (MS default tanh)"])
