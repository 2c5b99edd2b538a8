"""`aligner.dump` and `aligner.save`: record what every module computes, the same way in PyTorch and MindSpore.

    with aligner.dump(model, "dumps_pt/", step=step, steps=[0, 1]):
        loss = loss_fn(model(x), y)
        loss.backward()                 # MindSpore: grads = value_and_grad(...)(x, y) inside the context

See docs/dumping.md for the options and docs/dump-format.md for the on-disk format (aligner/dumping/manifest.py). The
capture itself lives in aligner.dumping.context; its names are imported from here on first use, so readers of the
format (`align compare` imports aligner.dumping.manifest) do not load the hooks and the writer.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.dumping.context import DumpContext, MemoryCapture, dump, save
    from aligner.dumping.ranks import save_grads

_LAZY = {"dump": "aligner.dumping.context", "save": "aligner.dumping.context",
         "DumpContext": "aligner.dumping.context", "MemoryCapture": "aligner.dumping.context",
         "save_grads": "aligner.dumping.ranks"}

__all__ = ["dump", "save", "save_grads", "DumpContext", "MemoryCapture"]


__getattr__ = lazy.attributes(__name__, _LAZY)
