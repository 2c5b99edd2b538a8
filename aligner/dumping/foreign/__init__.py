"""Other tools' dumps as aligner records: msprobe dump folders (`dump.json` + tensors) and MindSpore's native
(graph-mode) dump. Readers know nothing of comparison: they turn a folder into `manifest.Record`s in execution order,
each with the tensor file it names (confined to the folder), a loader (msprobe `.pt`, only with `trust_pickle`), or
statistics only; a row that cannot be read carries its error, and only a folder that cannot be read at all raises
`AlignerError`.
"""
from __future__ import annotations

from pathlib import Path

from aligner.dumping.foreign import msprobe as msprobe
from aligner.dumping.foreign import native as native
from aligner.dumping.foreign.base import Entry, ForeignDump, Tool

__all__ = ["Entry", "ForeignDump", "Tool", "detect", "read_foreign"]


def detect(root: Path) -> Tool | None:
    """Which foreign tool wrote the folder `root` (None: not a foreign dump). msprobe: a `dump.json` in it, in its
    step folders' rank folders (`step0/rank0/dump.json`) or in its rank folders; MindSpore native: `.dump_metadata` or
    `execution_order` in it or in its `rank_N` folders."""
    if msprobe.holds_dump(root):
        return Tool.MSPROBE
    if native.holds_dump(root):
        return Tool.NATIVE
    return None


def read_foreign(root: Path, tool: Tool, *, trust_pickle: bool = False) -> ForeignDump:
    """Read a foreign dump folder written by `tool` (see `detect`). `trust_pickle` allows msprobe's PyTorch `.pt`
    tensors, read with `torch.load(weights_only=True)`; without it they are refused."""
    if tool is Tool.MSPROBE:
        return msprobe.read(root, trust_pickle=trust_pickle)
    return native.read(root)
