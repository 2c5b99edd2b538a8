"""CNN with BatchNorm and downsample blocks: timm `resnet50` vs mindcv `resnet50` (Bottleneck blocks, 1x1 stride-2
downsample convs, 10 classes, 1x3x64x64 input, random init).

Migration differences found (must be made identical for the outputs to agree; candidates for `align audit`):

* stem max-pool padding: timm `nn.MaxPool2d(3, stride=2, padding=1)` pads 1 on every side; mindcv
  `nn.MaxPool2d(3, stride=2, pad_mode="same")` pads TF-style (0 before, 1 after for even inputs). Same output shape,
  different windows, so every activation after the stem differs. The pair builder replaces mindcv's
  `max_pool` with `nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)` (one line, no parameters involved).
* naming: BatchNorm `weight/bias/running_mean/running_var` vs `gamma/beta/moving_mean/moving_variance`,
  `downsample` vs `down_sample`, `fc` vs `classifier`; `num_batches_tracked` has no MindSpore twin.
  `align convert --like` resolves all of it (no user map).
* BatchNorm eps (1e-5) and eval-mode statistics agree by default. The torch side's constant tensors (BN gammas,
  betas, running stats) are randomised before conversion so that a swapped BN tensor shows in the logits.
"""
from __future__ import annotations

import numpy as np

from tests.zoo.common import Pair, perturb_constants_, seed_all

NUM_CLASSES = 10


def build(seed: int = 0, arch: str = "resnet50", size: int = 64) -> Pair:
    import mindcv
    import timm
    from mindspore import nn

    seed_all(seed)
    pt = timm.create_model(arch, pretrained=False, num_classes=NUM_CLASSES).eval()
    perturb_constants_(pt, seed)
    msm = mindcv.create_model(arch, pretrained=False, num_classes=NUM_CLASSES)
    # the one-line patch: make mindcv's stem pool pad like timm's (see module docstring)
    msm.max_pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1)
    msm.set_train(False)
    x = np.random.default_rng(seed).standard_normal((1, 3, size, size)).astype(np.float32)
    return Pair(name=f"cnn_{arch}", torch_model=pt, ms_model=msm, torch_inputs={"x": x}, ms_inputs={"x": x},
                notes=["mindcv stem max_pool pad_mode='same' replaced by padding=1 (timm)"])
