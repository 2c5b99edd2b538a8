"""Make the PyPI torchvision wheel importable next to the CPU torch build (test side only).

PyPI only carries the CUDA build of torchvision 0.28.0; its `_C.so` links `libc10_cuda.so`, which the CPU torch wheel
lacks, so the extension silently fails to load and `torchvision/_meta_registrations.py` then dies on
`register_fake("torchvision::nms")` ("operator torchvision::nms does not exist"). timm imports
`torchvision.ops.misc.FrozenBatchNorm2d` at import time and transformers imports torchvision when it is installed, so
both break. Defining the two schemas that `_meta_registrations` registers fake kernels for is enough: nothing in the
zoo calls a torchvision C++ op.
"""
from __future__ import annotations

import torch

_LIB = None


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def install() -> None:
    """Idempotent: define torchvision::nms/qnms schemas unless the real extension already did. A CUDA torch build
    loads torchvision's extension itself (its `_C.so` links what it needs), which would then find them defined."""
    global _LIB
    if torch.version.cuda is not None:
        return
    missing = [n for n in ("nms", "qnms") if not _has_op(n)]
    if not missing:
        return
    if _LIB is None:
        _LIB = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        _LIB.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


install()
