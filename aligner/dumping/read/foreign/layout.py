"""How each foreign tool's dump folder looks from outside: the file names that tell one apart, checked without
loading its reader (`align compare` asks this of every folder it is given, most of them aligner dumps or plain .npy
folders), and which of the files a dump's index names may be read at all."""
from __future__ import annotations

import enum
import os
import re
from pathlib import Path
from typing import Callable


class Tool(str, enum.Enum):
    """The tool that wrote a foreign dump."""

    MSPROBE = "msprobe"
    NATIVE = "mindspore-native"

    def __str__(self) -> str:
        return self.value


# msprobe: DUMP_PATH/step{N}/rank{R}/dump.json (or a step or rank folder of it)
DUMP_JSON = "dump.json"
STEP = re.compile(r"step(\d+)")
# msprobe's own name mappings (`msprobe compare -lm layer_mapping.yaml`, `-dm data_mapping.yaml`)
MSPROBE_MAPS = ("layer_mapping.yaml", "data_mapping.yaml")
# MindSpore's native dump: PATH/rank_{N}/.dump_metadata/ and execution_order/
METADATA = ".dump_metadata"
EXECUTION_ORDER = "execution_order"
NATIVE_RANK = re.compile(r"rank_(\d+)")


def run_dirs(root: Path) -> list[Path]:
    """The msprobe rank folders under `root` that hold a dump.json: `root` itself, its rank folders (a step folder),
    or its step folders' rank folders (a dump.json that is no regular file counts: its reader says what it is)."""
    if os.path.lexists(root / DUMP_JSON):
        return [root]
    found = [p.parent for p in root.glob(f"*/{DUMP_JSON}")]
    return found or [p.parent for p in root.glob(f"*/*/{DUMP_JSON}") if STEP.fullmatch(p.parent.parent.name)]


def msprobe_maps(root: Path) -> list[Path]:
    """msprobe's mapping files (MSPROBE_MAPS) in the dump folder `root`, then beside it (in its parent folder)."""
    return [folder / name for folder in (root, root.parent) for name in MSPROBE_MAPS if (folder / name).is_file()]


def is_native_rank(path: Path) -> bool:
    """Whether `path` is one rank's folder of a MindSpore native dump."""
    return (path / METADATA).is_dir() or (path / EXECUTION_ORDER).is_dir()


def native_ranks(root: Path) -> list[Path]:
    """The `rank_N` folders of a native dump path, by rank."""
    return sorted((p for p in root.iterdir() if NATIVE_RANK.fullmatch(p.name) and p.is_dir() and is_native_rank(p)),
                  key=lambda p: int(p.name[5:]))


def detect(root: Path) -> Tool | None:
    """Which foreign tool wrote the folder `root` (None: not a foreign dump). msprobe: a `dump.json` in it, in its
    step folders' rank folders (`step0/rank0/dump.json`) or in its rank folders; MindSpore native: `.dump_metadata` or
    `execution_order` in it or in its `rank_N` folders."""
    if _holds(lambda: bool(run_dirs(root))):
        return Tool.MSPROBE
    if _holds(lambda: is_native_rank(root) or bool(native_ranks(root))):
        return Tool.NATIVE
    return None


def _holds(check: Callable[[], bool]) -> bool:
    """A layout check; a folder that cannot be listed holds no such dump."""
    try:
        return check()
    except OSError:
        return False


def inside(base: Path, name: str, real: Path | None = None) -> tuple[Path | None, str | None]:
    """(path, None) for a file a dump's index names inside `base`, else (None, why): a plain relative name, no `..`,
    no absolute path, no symlink leading out, so a hostile index cannot make aligner read a file the user did not
    name. `real`: `base` already resolved (a caller checking many files resolves it once)."""
    if "\x00" in name:  # no file system names such a file (os calls raise ValueError on it)
        return None, f"names no possible file ({name!r}: a NUL character): refused"
    try:
        os.fsencode(name)
    except UnicodeEncodeError:  # a lone surrogate: no file system name encodes to it (path calls would raise)
        return None, f"names no possible file ({name!r}: not encodable as a file name): refused"
    candidate = Path(name)
    if not name or candidate.is_absolute() or ".." in candidate.parts:
        return None, f"names a file outside the dump directory ({name!r}): refused"
    path = base / candidate
    try:
        confined = path.resolve().is_relative_to(real or base.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        confined = False
    if not confined:
        return None, f"{name!r} is a link leading outside the dump directory: refused"
    return path, None
