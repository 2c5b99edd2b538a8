"""Fused vs separate attention projections: timm `VisionTransformer` (one fused `attn.qkv` Linear per block, rows
[q; k; v]) vs mindone.transformers `ViTModel` (separate `attention.attention.query/key/value` Linears), tiny config:
32x32 image, 8x8 patches, dim 64, depth 2, 4 heads, MLP 256, class token, random init. Compared output: every token's
final hidden state (timm with `num_classes=0, global_pool=''`; mindone `last_hidden_state`), [2, 17, 64].

Migration differences found:

* naming and layout: `align convert --like` splits each fused `qkv.weight` [192, 64] / `qkv.bias` [192] into the
  three [64, 64] / [64] tensors (fused detection: the parts are sibling modules of one block with the same index),
  then pairs the rest by structure (`norm1` -> `layernorm_before`, `mlp.fc1` -> `intermediate.dense`, ...) and the
  two top-level tensors by their unique shapes (`cls_token`, `pos_embed` -> `embeddings.position_embeddings`).
* config: both exact (erf) GELU, LayerNorm eps 1e-6 (set in the `ViTConfig`; the transformers default is 1e-12).
* a real mindone 0.5.0 bug: `ViTPreTrainedModel._init_weights` calls `zeros_(module.bias.data)`, and in MindSpore 2.10
  `Parameter.data` is a plain Tensor without `set_data`, so `ViTModel(config)` raises AttributeError. The builder
  skips that re-initialisation (the layers keep mint's default init; the values are replaced by the conversion).
* mindone's mint ops without CPU kernels are routed by tests/zoo/ms_compat.py (Conv2d, LayerNorm, gelu).
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

IMG, PATCH, DIM, DEPTH, HEADS, MLP = 32, 8, 64, 2, 4, 256


def build(seed: int = 0, batch: int = 2) -> Pair:
    import transformers
    from mindone.transformers import ViTModel as MsViT
    from mindone.transformers.models.vit import modeling_vit
    from timm.models.vision_transformer import VisionTransformer as PtViT

    seed_all(seed)
    pt = PtViT(img_size=IMG, patch_size=PATCH, embed_dim=DIM, depth=DEPTH, num_heads=HEADS, mlp_ratio=MLP / DIM,
               num_classes=0, global_pool="").eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    cfg = transformers.ViTConfig(image_size=IMG, patch_size=PATCH, hidden_size=DIM, num_hidden_layers=DEPTH,
                                 num_attention_heads=HEADS, intermediate_size=MLP, layer_norm_eps=1e-6,
                                 hidden_act="gelu")
    cfg._attn_implementation = "eager"
    init = modeling_vit.ViTPreTrainedModel._init_weights
    modeling_vit.ViTPreTrainedModel._init_weights = lambda self, module: None  # the mindone bug above
    try:
        msm = MsViT(cfg, add_pooling_layer=False)
    finally:
        modeling_vit.ViTPreTrainedModel._init_weights = init
    msm.set_train(False)
    x = np.random.default_rng(seed).standard_normal((batch, 3, IMG, IMG)).astype(np.float32)
    return Pair(name="vit_split", torch_model=pt, ms_model=msm, torch_inputs={"x": x},
                ms_inputs={"pixel_values": x}, ms_output=lambda o: o[0],
                notes=["mindone ViTPreTrainedModel._init_weights fails on MindSpore 2.10 (Parameter.data.set_data): "
                       "skipped"])
