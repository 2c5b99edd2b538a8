"""Other tools' dumps as aligner records: msprobe dump folders (`dump.json` + tensors) and MindSpore's native
(graph-mode) dump. Readers know nothing of comparison: they turn a folder into `manifest.Record`s in execution order,
each with the tensor file it names (confined to the folder), a loader (msprobe `.pt`, only with `trust_pickle`), or
statistics only; a row that cannot be read carries its error, and only a folder that cannot be read at all raises
`AlignerError`.

`detect` only looks at file names (aligner.dumping.read.foreign.layout); the rest is imported on first use, so a folder
that is no foreign dump never loads the readers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy
from aligner.dumping.read.foreign.layout import Tool, detect

if TYPE_CHECKING:
    from aligner.dumping.read.foreign.base import Entry, ForeignDump
    from aligner.dumping.read.foreign.readers import read_foreign

_LAZY = {"Entry": "aligner.dumping.read.foreign.base", "ForeignDump": "aligner.dumping.read.foreign.base",
         "read_foreign": "aligner.dumping.read.foreign.readers"}

__all__ = ["Entry", "ForeignDump", "Tool", "detect", "read_foreign"]


__getattr__ = lazy.attributes(__name__, _LAZY)
