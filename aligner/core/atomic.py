"""Write outputs atomically: a temp file beside the target, renamed into place only when complete."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from aligner.core.errors import AlignerError


def check_output(path: str | os.PathLike, force: bool = False) -> Path:
    """Refuse an existing output (unless `force`) or an unwritable directory before any work is done."""
    out = Path(path)
    if out.is_dir():
        raise AlignerError(f"output {out} is a directory")
    if out.exists() and not force:
        raise AlignerError(f"output {out} already exists (use --force to overwrite)")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise AlignerError(f"output directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise AlignerError(f"output directory {parent} is not writable")
    return out


def current_umask() -> int:
    """The process umask, read without changing it where Linux tells it (os.umask alone must set it to read it)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as fh:
            return int(next(line for line in fh if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path in the target's directory; rename it to `path` on success, delete it on failure."""
    out = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())   # mkstemp makes 0600; a user's output follows the umask, as `cp` does
    finally:
        os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temp file for writing that replaces `path` only if the block completes."""
    try:
        with atomic_path(path) as tmp, open(tmp, mode) as fh:
            yield fh
    except OSError as exc:
        raise AlignerError(f"cannot write {path}: {exc.strerror or exc}") from exc
