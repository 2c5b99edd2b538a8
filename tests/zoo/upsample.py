"""A model that upsamples: transformers `SegformerForSemanticSegmentation` vs mindone.transformers
`SegformerForSemanticSegmentation` (hierarchical encoder with overlapping patch embeds + all-MLP decode head, which
resizes every stage's features with bilinear `interpolate(..., align_corners=False)` to the 1/4 resolution map).
Tiny config: 2 stages, hidden sizes [16, 32], depths [1, 1], heads [1, 2], sr ratios [2, 1], decoder 32, 4 labels,
64x64 input, random init, eval mode. Compared output: `logits` (1/4 resolution, 16x16).

Migration differences found:

* none in the config (same `SegformerConfig`; exact GELU; LayerNorm eps 1e-6 in the encoder, BatchNorm in the head).
* `mindspore.mint.nn.BatchNorm2d` (used by mindone's decode head) keeps torch's names *including*
  `num_batches_tracked`; the built-in BatchNorm rule drops `num_batches_tracked` ("no MindSpore twin") even though
  the `--like` target has that key, so `--like` alone leaves it unfilled (exit 1, aligner gap). USER_MAP renames it
  onto itself.
* `mint.nn.functional.interpolate(mode="bilinear")` has no CPU kernel (UpsampleBilinear2D): ms_compat routes it to
  `ops.ResizeBilinearV2(half_pixel_centers=True)`, which is torch's `align_corners=False` convention.
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

CFG = dict(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
           patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
           decoder_hidden_size=32, num_labels=4, drop_path_rate=0.0)
IMG = 64

# Why a map: see the docstring (BatchNorm num_batches_tracked is dropped although the mint.nn target keeps it).
USER_MAP = """\
rename:
  decode_head.batch_norm.num_batches_tracked: decode_head.batch_norm.num_batches_tracked
"""


def build(seed: int = 0, batch: int = 2) -> Pair:
    import transformers
    from mindone.transformers import SegformerForSemanticSegmentation as MsSeg

    seed_all(seed)
    cfg = transformers.SegformerConfig(**CFG)
    pt = transformers.SegformerForSemanticSegmentation(cfg).eval()
    torch_default_init_(pt)
    perturb_constants_(pt, seed)
    msm = MsSeg(cfg)
    msm.set_train(False)
    x = np.random.default_rng(seed).standard_normal((batch, 3, IMG, IMG)).astype(np.float32)
    inputs = {"pixel_values": x}
    return Pair(name="upsample_segformer", torch_model=pt, ms_model=msm, torch_inputs=inputs, ms_inputs=dict(inputs),
                torch_output=lambda o: o.logits, ms_output=lambda o: o[0], user_map=USER_MAP,
                notes=["user map: keep BatchNorm num_batches_tracked for the mint.nn.BatchNorm2d target"])
