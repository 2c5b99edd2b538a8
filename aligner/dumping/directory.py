"""Claiming a dump directory: checked once per process, then later dump contexts (later steps) append to it.

Two processes starting on one directory: the manifest is created with O_EXCL, so exactly one claims it, and the
other fails with one line. While a dump context writes, its process holds an advisory lock (flock) on the manifest:
another process's overwrite=True refuses the directory rather than delete the records being written, and a later
step of this process refuses to append to a manifest that another process created since (its records are gone).
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

from aligner.core.errors import AlignerError
from aligner.dumping import pending
from aligner.dumping.manifest import MANIFEST, TENSOR_DIR, Record, create_manifest, iter_manifest


@dataclasses.dataclass
class DumpDir:
    """A dump directory this process writes: where the next sequence number starts, which tensors it holds, and the
    manifest it created (held locked while dump contexts write it)."""

    path: Path
    framework: str
    stats_only: bool
    identity: tuple[int, int]  # (st_dev, st_ino) of the manifest this process created
    next_seq: int = 0
    written: set[str] = dataclasses.field(default_factory=set)
    fd: int | None = None  # the manifest, open and locked while `holders` > 0
    holders: int = 0
    # a full dump's writer thread kept from one context to the next (wait=False), a holder itself while it is kept;
    # `lent` while no context writes through it (aligner.dumping.pending may then wait for it)
    writer: Any = None
    lent: bool = False
    # held while `finish` waits for the lent writer: a context that would take it over waits instead of starting a
    # second writer that appends to the manifest beside the first
    handover: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def release(self) -> None:
        """One dump context (or the writer it kept) is done writing: the last one unlocks the manifest."""
        with _lock:
            self.holders -= 1
            if self.holders == 0 and self.fd is not None:
                os.close(self.fd)
                self.fd = None

    def lend(self, writer: Any) -> None:
        """Keep `writer` writing after its context exits: it holds the manifest's lock until `finish`, and a later
        context on this directory writes through it (`take_writer`), so records stay in order."""
        with _lock:
            if self.writer is None:
                self.holders += 1
            self.writer, self.lent = writer, True
        pending.hold(self.path, self.finish)

    def take_writer(self) -> Any:
        """The writer an earlier context lent, now the caller's; None when none was lent (or it has just finished)."""
        with self.handover, _lock:
            if not self.lent:
                return None
            self.lent = False
        pending.take(self.path)
        return self.writer

    def finish(self) -> None:
        """Wait until the lent writer has written what it holds, then give back its hold; raise its write error."""
        with self.handover:
            with _lock:
                if not self.lent:  # none lent, or a context writes through it now (its exit closes or lends it)
                    return
                writer, self.writer, self.lent = self.writer, None, False
            try:
                writer.close()
            finally:  # waited for here until now: a reader in another thread meanwhile waits on `handover`
                pending.take(self.path)
                self.release()

    def close_writer(self, writer: Any) -> None:
        """A context's own wait for `writer` (the one it took, or its own): close it; raise its write error."""
        if writer is not self.writer:
            writer.close()
            return
        with _lock:
            self.writer = None
        try:
            writer.close()
        finally:
            self.release()


_claimed: dict[Path, DumpDir] = {}
# threads dumping to directories of their own claim them concurrently (taken after a DumpDir's `handover`, never
# before it)
_lock = threading.Lock()
_WRITTEN = re.compile(r"(\.)?[0-9a-f]{32}\.npy(\.tmp)?")  # what the writer names files (and its temporaries)


def claim(directory: str | os.PathLike, framework: str, version: str, stats_only: bool, overwrite: bool,
          seed: dict[str, Any] | None, ranks: dict[str, Any] | None = None) -> DumpDir:
    """The DumpDir for `directory`, held for one dump context (call its `release` when the context is done):
    created (empty, or cleared with overwrite) on first use in this process; `ranks` goes into the header (a
    multi-rank run's layout)."""
    path = Path(directory).resolve()
    known = _claimed.get(path)
    if known is not None and known.writer is not None and not (path / MANIFEST).is_file():
        try:  # removed since, its lent writer still writing: those records went with the directory
            known.finish()
        except AlignerError:  # nothing left to report them into
            pass
    with _lock:
        return _claim(path, directory, framework, version, stats_only, overwrite, seed, ranks)


def _claim(path: Path, directory: str | os.PathLike, framework: str, version: str, stats_only: bool,
           overwrite: bool, seed: dict[str, Any] | None, ranks: dict[str, Any] | None) -> DumpDir:
    """`claim` under the lock; `path` is `directory` resolved (`directory` as the user gave it, for messages)."""
    known = _claimed.get(path)
    if known is not None and not (path / MANIFEST).is_file():  # removed since (e.g. shutil.rmtree): start afresh
        del _claimed[path]
        if known.fd is not None:
            os.close(known.fd)
        known = None
    if known is not None:
        if (known.framework, known.stats_only) != (framework, stats_only):
            raise AlignerError(f"dump directory {directory} already holds a {known.framework} "
                               f"{'stats' if known.stats_only else 'full'} dump from this process; "
                               "use another directory for a different model or mode")
        if known.holders == 0:
            known.fd = _lock_manifest(path, directory, known.identity)
        known.holders += 1
        return known
    old = _prepare(path, directory, overwrite)
    try:
        fd = _create(path, directory, framework, version, "stats" if stats_only else "full", seed, ranks)
    finally:
        if old is not None:  # the previous dump's lock, held until this one's manifest replaced it
            os.close(old)
    info = os.fstat(fd)
    _claimed[path] = DumpDir(path, framework, stats_only, (info.st_dev, info.st_ino), fd=fd, holders=1)
    return _claimed[path]


def _busy(shown: str | os.PathLike) -> AlignerError:
    return AlignerError(f"dump directory {shown} was claimed by another dump (another process is writing its "
                        f"{MANIFEST}); give each run its own directory")


def _create(path: Path, shown: str | os.PathLike, framework: str, version: str, mode: str,
            seed: dict[str, Any] | None, ranks: dict[str, Any] | None) -> int:
    """Claim the directory: its manifest created with O_EXCL (one manifest that appeared since `_prepare` looked is
    another dump's claim) and locked; the open descriptor returned."""
    try:
        fd = create_manifest(path, framework, version, mode, seed, ranks)
    except FileExistsError as exc:
        raise _busy(shown) from exc
    except OSError as exc:
        raise AlignerError(f"cannot write dump directory {shown}: {exc.strerror or exc}") from exc
    try:
        _flock(fd, path, shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_manifest(path: Path, shown: str | os.PathLike, identity: tuple[int, int] | None) -> int:
    """Open and lock the directory's manifest (never following a link, never blocking on a FIFO); AlignerError when
    another process holds it, or (`identity` given) when it is not the manifest this process created."""
    try:
        fd = os.open(path / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise _busy(shown) from exc
    except OSError as exc:
        raise AlignerError(f"cannot open {path / MANIFEST}: {exc.strerror or exc}") from exc
    try:
        _flock(fd, path, shown)
        info = os.fstat(fd)
        if identity is not None and (info.st_dev, info.st_ino) != identity:
            raise AlignerError(f"dump directory {shown} was overwritten by another dump after this process began "
                               "writing it (this process's records there are gone); give each run its own "
                               "directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _flock(fd: int, path: Path, shown: str | os.PathLike) -> None:
    """Lock the open manifest `fd` without waiting, and check it is still the one at `path` (another process's
    overwrite may have replaced it between the open and the lock)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise _busy(shown) from exc
    except OSError:  # a file system without locks: O_EXCL alone decides who starts a dump
        pass
    info = os.fstat(fd)
    try:
        now = os.lstat(path / MANIFEST)
    except FileNotFoundError as exc:
        raise _busy(shown) from exc
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
        raise _busy(shown)


def _prepare(path: Path, shown: str | os.PathLike, overwrite: bool) -> int | None:
    """Check the directory is empty (created if missing) or, with overwrite, delete the previous dump it holds; that
    dump's manifest is returned open and locked (None: there was none), so no other process starts there until the
    caller's own manifest replaces it."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise AlignerError(f"dump directory {shown} is {'a link' if path.is_symlink() else 'a file'}; give a "
                           "directory path")
    old = None
    if path.is_dir():
        entries = set(os.listdir(path))
        if entries and not overwrite:
            raise AlignerError(f"dump directory {shown} is not empty; choose a new directory or pass overwrite=True")
        if entries:  # a manifest that is not a regular file is refused by _previous_dump, never opened
            old = _lock_manifest(path, shown, None) if _regular(path / MANIFEST) else None
            try:
                entries = set(os.listdir(path))  # as it is under the lock: no other dump writes it now
                victims = _previous_dump(path, shown, entries)
                if old is None:  # a manifest appeared since it was looked at: another dump's
                    raise _busy(shown)
                for victim in victims:
                    victim.unlink()
                if TENSOR_DIR in entries:
                    (path / TENSOR_DIR).rmdir()
            except BaseException:
                if old is not None:
                    os.close(old)
                raise
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AlignerError(f"cannot create dump directory {shown}: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise AlignerError(f"dump directory {shown} is not writable; choose a directory you can write to")
    return old


def _regular(path: Path) -> bool:
    """Whether `path` is a regular file (not following a link)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


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
        # not settled: no writer of this process writes a directory it claims afresh (and `_lock` is held)
        for lineno, entry in iter_manifest(manifest_path.parent, settle=False):
            if isinstance(entry, ValueError) or (lineno == 1) != isinstance(entry, dict):
                return None
            if isinstance(entry, Record) and entry.file and entry.file.startswith(f"{TENSOR_DIR}/"):
                names.add(entry.file[len(TENSOR_DIR) + 1:])
    except (OSError, UnicodeDecodeError, AlignerError):  # AlignerError: swapped for a FIFO or device since checked
        return None
    return names
