"""Claiming a dump directory: checked once per process, then later dump contexts (later steps) append to it."""
from __future__ import annotations

import dataclasses
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

from aligner.core.errors import AlignerError
from aligner.dumping.manifest import MANIFEST, TENSOR_DIR, Record, iter_manifest, write_header


@dataclasses.dataclass
class DumpDir:
    """A dump directory this process writes: where the next sequence number starts and which tensors it holds."""

    path: Path
    framework: str
    stats_only: bool
    next_seq: int = 0
    written: set[str] = dataclasses.field(default_factory=set)


_claimed: dict[Path, DumpDir] = {}
_lock = threading.Lock()  # threads dumping to directories of their own claim them concurrently
_WRITTEN = re.compile(r"(\.)?[0-9a-f]{32}\.npy(\.tmp)?")  # what the writer names files (and its temporaries)


def claim(directory: str | os.PathLike, framework: str, version: str, stats_only: bool, overwrite: bool,
          seed: dict[str, Any] | None, ranks: dict[str, Any] | None = None) -> DumpDir:
    """The DumpDir for `directory`: created (empty, or cleared with overwrite) on first use in this process; `ranks`
    goes into the header (a multi-rank run's layout)."""
    with _lock:
        return _claim(directory, framework, version, stats_only, overwrite, seed, ranks)


def _claim(directory: str | os.PathLike, framework: str, version: str, stats_only: bool, overwrite: bool,
           seed: dict[str, Any] | None, ranks: dict[str, Any] | None) -> DumpDir:
    path = Path(directory).resolve()
    known = _claimed.get(path)
    if known is not None and not (path / MANIFEST).is_file():  # removed since (e.g. shutil.rmtree): start afresh
        del _claimed[path]
        known = None
    if known is not None:
        if (known.framework, known.stats_only) != (framework, stats_only):
            raise AlignerError(f"dump directory {directory} already holds a {known.framework} "
                               f"{'stats' if known.stats_only else 'full'} dump from this process; "
                               "use another directory for a different model or mode")
        return known
    _prepare(path, directory, overwrite)
    try:
        write_header(path, framework, version, "stats" if stats_only else "full", seed, ranks)
    except OSError as exc:
        raise AlignerError(f"cannot write dump directory {directory}: {exc.strerror or exc}") from exc
    _claimed[path] = DumpDir(path, framework, stats_only)
    return _claimed[path]


def _prepare(path: Path, shown: str | os.PathLike, overwrite: bool) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise AlignerError(f"dump directory {shown} is {'a link' if path.is_symlink() else 'a file'}; give a "
                           "directory path")
    if path.is_dir():
        entries = set(os.listdir(path))
        if entries and not overwrite:
            raise AlignerError(f"dump directory {shown} is not empty; choose a new directory or pass overwrite=True")
        if entries:
            for victim in _previous_dump(path, shown, entries):
                victim.unlink()
            if TENSOR_DIR in entries:
                (path / TENSOR_DIR).rmdir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AlignerError(f"cannot create dump directory {shown}: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise AlignerError(f"dump directory {shown} is not writable; choose a directory you can write to")


def _previous_dump(path: Path, shown: str | os.PathLike, entries: set[str]) -> list[Path]:
    """The files overwrite=True may delete: a previous aligner dump's manifest and the tensor files it lists (or its
    writer's temporaries), all regular files inside the directory. Anything else refuses the whole directory, naming
    what was found, so overwrite never deletes a file aligner did not write."""
    def refuse(what: str) -> AlignerError:
        return AlignerError(f"dump directory {shown} holds {what}: not an aligner dump's own file; overwrite=True "
                            "deletes only what a previous aligner dump wrote, so choose another directory")

    others = sorted(entries - {MANIFEST, TENSOR_DIR})
    if others:
        raise refuse(", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else ""))
    manifest_path = path / MANIFEST
    if MANIFEST not in entries or not stat.S_ISREG(os.lstat(manifest_path).st_mode):
        raise refuse(f"{TENSOR_DIR}/ without a {MANIFEST}" if MANIFEST not in entries
                     else f"a {MANIFEST} that is not a regular file")
    listed = _listed_files(manifest_path)
    if listed is None:
        raise refuse(f"a {MANIFEST} aligner did not write")
    victims = [manifest_path]
    if TENSOR_DIR in entries:
        tensors = path / TENSOR_DIR
        if not stat.S_ISDIR(os.lstat(tensors).st_mode):
            raise refuse(f"a {TENSOR_DIR} that is not a directory (a link or a file)")
        for name in sorted(os.listdir(tensors)):
            mode = os.lstat(tensors / name).st_mode
            written = _WRITTEN.fullmatch(name) and (name in listed or name.endswith(".tmp"))
            if not written or not stat.S_ISREG(mode):
                raise refuse(f"{TENSOR_DIR}/{name}")
            victims.append(tensors / name)
    return victims


def _listed_files(manifest_path: Path) -> set[str] | None:
    """Names of the tensor files a manifest lists, or None when it is not a manifest aligner wrote (no dump header, or
    a line the manifest reader cannot parse)."""
    names: set[str] = set()
    try:
        for lineno, entry in iter_manifest(manifest_path.parent):
            if isinstance(entry, ValueError) or (lineno == 1) != isinstance(entry, dict):
                return None
            if isinstance(entry, Record) and entry.file and entry.file.startswith(f"{TENSOR_DIR}/"):
                names.add(entry.file[len(TENSOR_DIR) + 1:])
    except (OSError, UnicodeDecodeError):
        return None
    return names
