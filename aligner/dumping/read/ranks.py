"""The rank folders of a multi-rank dump (`rank{N}/`, one per process, as `aligner.dump` writes them under
torch.distributed or mindspore.communication): whether a directory holds them, each folder's header, and the world
size the headers agree on. Readers only: comparing ranks is `align compare`'s, checking them `align check`'s."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from aligner.core.errors import AlignerError
from aligner.core.nesting import json_loads
from aligner.dumping.manifest import MANIFEST, RANK_DIR, TENSOR_DIR, open_manifest


def holds_ranks(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory with `rank{N}/` entries (a multi-rank dump)."""
    root = Path(path)
    try:
        return root.is_dir() and any(RANK_DIR.fullmatch(name) for name in os.listdir(root))
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class RankDump:
    """One side: its rank folders and the world size their headers agree on (None: no header says)."""

    root: Path
    folders: dict[int, Path]
    world_size: int | None


def read_header(folder: Path) -> dict[str, Any]:
    """The first manifest line of a rank folder as a dict ({} when there is none: compare reports the folder)."""
    try:
        with open_manifest(folder) as fh:  # a FIFO or device refused (AlignerError), never waited on
            header = json_loads(fh.readline())
    except (OSError, ValueError, AlignerError):  # ValueError: not UTF-8, not JSON, nested too deep
        return {}
    return header if isinstance(header, dict) else {}


def read_ranks(path: str | os.PathLike) -> RankDump:
    """The rank folders of `path`, each header's rank checked against its folder name and every header's world size
    against the others'; AlignerError (one line) for a folder that is a link or a file, a dump that is also a
    single-process dump, or headers that disagree (mixed world sizes)."""
    root = Path(path)
    if not root.is_dir():
        raise AlignerError(f"{root}: no such directory")
    if (root / MANIFEST).exists():
        raise AlignerError(f"{root} holds both a single-process dump ({MANIFEST}) and rank folders; give the "
                           "directory of one run")
    folders: dict[int, Path] = {}
    for name in sorted(os.listdir(root)):
        found = RANK_DIR.fullmatch(name)
        if found is None:
            continue
        folder = root / name
        if folder.is_symlink() or not folder.is_dir():
            raise AlignerError(f"{folder} is {'a link' if folder.is_symlink() else 'not a directory'}; rank "
                               f"folders must be directories inside {root}")
        if int(found[1]) in folders:
            raise AlignerError(f"{root} holds two folders for rank {int(found[1])} ({folders[int(found[1])].name} "
                               f"and {name})")
        folders[int(found[1])] = folder
    worlds: dict[int, list[int]] = {}
    for rank, folder in folders.items():
        header = read_header(folder)
        said, world = header.get("rank"), header.get("world_size")
        if isinstance(said, int) and said != rank:
            raise AlignerError(f"{folder} holds the dump of rank {said}, not rank {rank}: rank folders were moved "
                               "or renamed")
        if isinstance(world, int):
            worlds.setdefault(world, []).append(rank)
    if len(worlds) > 1:
        says = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {w}"
                         for w, r in sorted(worlds.items()))
        raise AlignerError(f"mixed world sizes in {root}: the rank folders' headers disagree ({says} ranks); a "
                           "folder left over from an earlier run of another size?")
    world = next(iter(worlds), None)
    beyond = [r for r in folders if world is not None and r >= world]
    if world is not None and beyond:
        raise AlignerError(f"mixed world sizes in {root}: rank{beyond[0]}/ in a dump whose headers say "
                           f"{world} ranks (0..{world - 1}); a folder left over from an earlier, larger run?")
    return RankDump(root, folders, world)


def folder_size(folder: Path) -> tuple[int, int]:
    """(manifest lines, bytes of tensor files) of one rank folder, from the directory listing (nothing parsed); (0, 0)
    for a folder that cannot be listed (reading the rank says why)."""
    if (folder / TENSOR_DIR).is_symlink():  # never list a directory outside the dump
        return 0, 0
    try:
        with open_manifest(folder) as fh:
            lines = fh.read().count(b"\n")
        with os.scandir(folder / TENSOR_DIR) as entries:
            size = sum(e.stat(follow_symlinks=False).st_size for e in entries if e.is_file(follow_symlinks=False))
    except (OSError, AlignerError):  # AlignerError: not a regular file (the rank's own reading says so)
        return 0, 0
    return lines, size
