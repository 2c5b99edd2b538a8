"""ConvNeXt: timm `ConvNeXt` (the `convnext_tiny` architecture) vs mindcv `ConvNeXt`, tiny config: depths (1, 1, 2, 1),
dims (16, 32, 48, 64), 10 classes, 1x3x64x64 input (16x16 maps in stage 0), torch default init, random constants.

Layer scale (`gamma` per block), depthwise 7x7 convs, 4/4 stem and 2/2 downsample convs, LayerNorm channels-first
(stem, downsample layers) and channels-last (blocks), all third-party classes on both sides: timm's `GELU` is a plain
`nn.Module` calling `F.gelu` (exact), timm's `LayerNorm`/`LayerNorm2d` and mindcv's `ConvNextLayerNorm` subclass the
framework LayerNorm (mindcv's with a transpose for channels-first).

Migration differences found (must be made identical for the outputs to agree; candidates for `align audit`):

* GELU: timm exact (erf); mindcv's blocks use `nn.GELU()`, MindSpore's default `approximate=True` (tanh). With
  `exact_gelu=True` (the default) the builder replaces each block's `act` by `nn.GELU(approximate=False)`;
  `exact_gelu=False` keeps mindcv as shipped (the port as a user would run it).
* padding: the depthwise conv is `padding=3` in timm and `pad_mode='same'` in mindcv: equal for kernel 7, stride 1
  (3 on each side). The 4/4 and 2/2 convs pad nothing on either side (`pad_mode='same'` pads 0 there when the input
  divides by the stride). Not a difference.
* naming: `stem`/`stages.N.downsample`/`stages.N.blocks.M` vs `feature.K`, `conv_dw`/`mlp.fc1`/`mlp.fc2`/`head.fc` vs
  `dwconv`/`pwconv1`/`pwconv2`/`classifier`, LayerNorm `weight/bias` vs `gamma/beta`, layer scale `gamma` vs `gamma_`.
  `align convert --like` places every tensor but the layer-scale `gamma`s of stage 2 (its two blocks: "no place for
  it in the target", though each is the only unplaced tensor of its shape in its block; issue 28, structural
  matching; the one-block stages' gammas are placed). Until it does, `gamma_map()` names every gamma in the pair's
  user map (a workaround: `pair.user_map = None` shows the bare `--like`).

Measured (seed 0): outputs differ by 1.6 before conversion; after it 5e-7 with `exact_gelu=True` and 2.1e-4 with
mindcv's tanh GELUs. The layer-scale gammas are set to 1 + N(0, 0.1) instead of timm's 1e-6, else the blocks (and
their GELUs) would not reach the logits (with gammas ~0.1 the GELU difference was 8e-6 there, below the zoo's 2e-5).
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all, torch_default_init_

DEPTHS = (1, 1, 2, 1)
DIMS = (16, 32, 48, 64)
NUM_CLASSES = 10
IMG = 64


def gamma_map() -> str:
    """A `--map` YAML naming each timm layer-scale `stages.i.blocks.j.gamma` -> mindcv `feature.{2i+1}.j.gamma_`."""
    lines = [f"  stages.{i}.blocks.{j}.gamma: feature.{2 * i + 1}.{j}.gamma_"
             for i, depth in enumerate(DEPTHS) for j in range(depth)]
    return "rename:\n" + "\n".join(lines) + "\n"


def build(seed: int = 0, exact_gelu: bool = True) -> Pair:
    """The pair; `exact_gelu=False` leaves mindcv's tanh GELUs (the difference `align audit` must report)."""
    import torch
    from mindcv.models.convnext import ConvNeXt as MsConvNeXt
    from mindspore import nn
    from timm.models.convnext import ConvNeXt as PtConvNeXt

    seed_all(seed)
    pt = PtConvNeXt(depths=DEPTHS, dims=DIMS, num_classes=NUM_CLASSES).eval()
    torch_default_init_(pt)
    with torch.no_grad():  # layer scale 1e-6 would hide every block (and the GELUs): O(1), random
        for name, param in pt.named_parameters():
            if name.endswith(".gamma"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)))
    perturb_constants_(pt, seed)  # LayerNorm weights/biases, zero conv biases: random
    msm = MsConvNeXt(in_channels=3, num_classes=NUM_CLASSES, depths=list(DEPTHS), dims=list(DIMS))
    notes = ["user map: layer-scale gamma -> gamma_ (convert --like does not place them yet)"]
    if exact_gelu:
        for _, cell in msm.cells_and_names():
            if hasattr(cell, "pwconv1"):
                cell.act = nn.GELU(approximate=False)
        notes.append("mindcv block GELU approximate=False (MS default tanh; timm exact)")
    msm.set_train(False)
    x = np.random.default_rng(seed).standard_normal((1, 3, IMG, IMG)).astype(np.float32)
    return Pair(name="convnext_tiny", torch_model=pt, ms_model=msm, torch_inputs={"x": x}, ms_inputs={"x": x},
                user_map=gamma_map(), notes=notes)
