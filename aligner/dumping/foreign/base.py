"""What the foreign-dump readers share: the records they return and the confinement of the files they name."""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Callable

import numpy as np

from aligner.core.dtypes import canonical
from aligner.dumping.manifest import Record


class Tool(str, enum.Enum):
    """The tool that wrote a foreign dump."""

    MSPROBE = "msprobe"
    NATIVE = "mindspore-native"

    def __str__(self) -> str:
        return self.value


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


def inside(base: Path, name: str) -> tuple[Path | None, str | None]:
    """(path, None) for a file a dump's index names inside `base`, else (None, why): a plain relative name, no `..`,
    no absolute path, no symlink leading out, so a hostile index cannot make aligner read a file the user did not
    name."""
    candidate = Path(name)
    if not name or candidate.is_absolute() or ".." in candidate.parts:
        return None, f"names a file outside the dump directory ({name!r}): refused"
    path = base / candidate
    try:
        confined = path.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        confined = False
    if not confined:
        return None, f"{name!r} is a link leading outside the dump directory: refused"
    return path, None


def npy_layout(path: Path) -> tuple[list[int], str]:
    """(shape, canonical dtype) from a .npy file's header, without reading its data; ValueError/OSError if it is
    not a readable .npy file."""
    fmt = np.lib.format
    with open(path, "rb") as fh:
        version = fmt.read_magic(fh)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(fh)
    if dtype.hasobject:
        raise ValueError("a pickled object array (never loaded)")
    return list(shape), canonical(dtype)
