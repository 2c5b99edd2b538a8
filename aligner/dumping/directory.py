"""Claiming a dump directory: checked once per process, then later dump contexts (later steps) append to it."""
from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from aligner.core.errors import AlignerError
from aligner.dumping.manifest import MANIFEST, TENSOR_DIR, write_header


@dataclasses.dataclass
class DumpDir:
    """A dump directory this process writes: where the next sequence number starts and which tensors it holds."""

    path: Path
    framework: str
    stats_only: bool
    next_seq: int = 0
    written: set[str] = dataclasses.field(default_factory=set)


_claimed: dict[Path, DumpDir] = {}


def claim(directory: str | os.PathLike, framework: str, version: str, stats_only: bool, overwrite: bool,
          seed: dict[str, Any] | None) -> DumpDir:
    """The DumpDir for `directory`: created (empty, or cleared with overwrite) on first use in this process."""
    path = Path(directory).resolve()
    known = _claimed.get(path)
    if known is not None:
        if (known.framework, known.stats_only) != (framework, stats_only):
            raise AlignerError(f"dump directory {directory} already holds a {known.framework} "
                               f"{'stats' if known.stats_only else 'full'} dump from this process; "
                               "use another directory for a different model or mode")
        return known
    _prepare(path, directory, overwrite)
    try:
        write_header(path, framework, version, "stats" if stats_only else "full", seed)
    except OSError as exc:
        raise AlignerError(f"cannot write dump directory {directory}: {exc.strerror or exc}") from exc
    _claimed[path] = DumpDir(path, framework, stats_only)
    return _claimed[path]


def _prepare(path: Path, shown: str | os.PathLike, overwrite: bool) -> None:
    if path.exists() and not path.is_dir():
        raise AlignerError(f"dump directory {shown} is a file; give a directory path")
    if path.is_dir():
        entries = set(os.listdir(path))
        if entries and not overwrite:
            raise AlignerError(f"dump directory {shown} is not empty; choose a new directory or pass overwrite=True")
        if entries - {MANIFEST, TENSOR_DIR}:
            raise AlignerError(f"dump directory {shown} holds files that are not an aligner dump; "
                               "overwrite=True only replaces a previous dump, so choose another directory")
        if TENSOR_DIR in entries:
            shutil.rmtree(path / TENSOR_DIR)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AlignerError(f"cannot create dump directory {shown}: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise AlignerError(f"dump directory {shown} is not writable; choose a directory you can write to")
