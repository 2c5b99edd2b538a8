"""A zoo model built on `torch.nn.MultiheadAttention`: transformers `SiglipVisionModel` with its attention-pooling
head (`SiglipMultiheadAttentionPoolingHead` = learned probe + `nn.MultiheadAttention(batch_first=True)` + MLP) vs
mindone.transformers `SiglipVisionModel`, whose head uses mindone's `MultiheadAttention` port
(mindone/transformers/mindspore_adapter/nn/MultiheadAttention.py). Tiny config: 32x32 image, 8x8 patches, hidden 32,
2 layers, 4 heads, intermediate 64, random init. Compared output: `pooler_output` (the MHA head's output).

Migration differences found:

* none in the config (same `SiglipVisionConfig`, tanh-approximate GELU `gelu_pytorch_tanh` on both sides).
* MultiheadAttention parameters keep torch's names (`in_proj_weight` fused [q; k; v], `in_proj_bias`,
  `out_proj.weight/bias`), so `align convert --like` copies them.
* mindone needs CPU routes for mint Embedding/LayerNorm/Conv2d/gelu/randn (tests/zoo/ms_compat.py).
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_channels=3,
           image_size=32, patch_size=8, vision_use_head=True)


def build(seed: int = 0, batch: int = 2) -> Pair:
    import transformers
    from mindone.transformers import SiglipVisionModel as MsSiglip

    seed_all(seed)
    cfg = transformers.SiglipVisionConfig(**CFG)
    cfg._attn_implementation = "eager"
    pt = transformers.SiglipVisionModel(cfg).eval()
    torch_default_init_(pt)
    assert any(type(m).__name__ == "MultiheadAttention" for m in pt.modules())
    perturb_constants_(pt, seed)
    msm = MsSiglip(cfg)
    msm.set_train(False)
    x = np.random.default_rng(seed).standard_normal((batch, 3, CFG["image_size"], CFG["image_size"]))
    inputs = {"pixel_values": x.astype(np.float32)}
    return Pair(name="mha_siglip", torch_model=pt, ms_model=msm, torch_inputs=inputs, ms_inputs=dict(inputs),
                torch_output=lambda o: o.pooler_output, ms_output=lambda o: o[1])
