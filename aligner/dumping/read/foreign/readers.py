"""Reading a foreign dump with its tool's reader (loaded only once a folder was detected as one)."""
from __future__ import annotations

from pathlib import Path

from aligner.dumping.read.foreign import msprobe, native
from aligner.dumping.read.foreign.base import ForeignDump
from aligner.dumping.read.foreign.layout import Tool


def read_foreign(root: Path, tool: Tool, *, trust_pickle: bool = False) -> ForeignDump:
    """Read a foreign dump folder written by `tool` (see `detect`). `trust_pickle` allows msprobe's PyTorch `.pt`
    tensors, read with `torch.load(weights_only=True)`; without it they are refused."""
    if tool is Tool.MSPROBE:
        return msprobe.read(root, trust_pickle=trust_pickle)
    return native.read(root)
