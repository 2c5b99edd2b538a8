"""Checkpoint readers and writers, one module per format (aligner.io.formats picks the right one).

Formats: "pytorch" (.pth/.pt/.bin), "mindspore" (.ckpt), "safetensors", "npy" (.npy/.npz, read only). The names below
are imported on first use: a module that needs only `aligner.io.base` (dump readers, the name planner) does not load
every format's reader.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.io.base import TensorInfo, TensorSource
    from aligner.io.formats import WRITABLE, detect_format, open_checkpoint, write_checkpoint

_LAZY = {"TensorInfo": "aligner.io.base", "TensorSource": "aligner.io.base", "WRITABLE": "aligner.io.formats",
         "detect_format": "aligner.io.formats", "open_checkpoint": "aligner.io.formats",
         "write_checkpoint": "aligner.io.formats"}

__all__ = ["TensorInfo", "TensorSource", "detect_format", "open_checkpoint", "write_checkpoint", "WRITABLE"]


__getattr__ = lazy.attributes(__name__, _LAZY)
