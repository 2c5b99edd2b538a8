"""What the foreign-dump readers share: the records they return (the tools and the confinement of the files they
name are in aligner.dumping.read.foreign.layout, which `align compare` reads for every folder)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np

from aligner.core.dtypes import canonical
from aligner.core.files import open_input
from aligner.dumping.manifest import Record
from aligner.io.npy_header import read_header


@dataclasses.dataclass
class Entry:
    """One record of a foreign dump and where its tensor is: a .npy file, a loader, statistics only, or an error."""

    record: Record
    path: Path | None = None
    error: str | None = None
    load: Callable[[], np.ndarray] | None = None  # a tensor not stored as .npy (msprobe .pt, read with trust_pickle)


@dataclasses.dataclass
class ForeignDump:
    """A foreign dump read: its framework, "full" (tensor files) or "stats", records in execution order, and the
    entries of its index that could not be read at all (each skipped, with why)."""

    root: Path
    framework: str
    mode: str
    entries: list[Entry]
    problems: list[str]


def npy_layout(path: Path) -> tuple[list[int], str]:
    """(shape, canonical dtype) from a .npy file's header, without reading its data (aligner.io.npy_header's policy);
    ValueError/OSError if it is not a readable .npy file, AlignerError if it is not a regular file."""
    with open_input(path) as fh:
        header = read_header(fh)
    return list(header.shape), canonical(header.dtype)
