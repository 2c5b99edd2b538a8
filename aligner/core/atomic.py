"""Write outputs atomically: temp files beside the targets, synced, then put in place only when complete.

What a failure leaves: on an error or a handled signal, nothing but the outputs as they were. A temp file is named
`.NAME.HOST.PID.XXXXXXXX.tmp` after the process writing it, so after a kill -9 the next run that names the same output
removes it once that process is gone (`check_output`), and never touches one whose writer is still alive.
An output that did not exist when `check_output` looked (no `force`) is created with no-replace semantics: of two
runs writing it at once, the second to finish fails instead of silently replacing the first one's file.
"""
from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import re
import signal
import stat
import threading
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from aligner.core.errors import AlignerError

log = logging.getLogger(__name__)

_NAME_CHARS = 80                                                  # of the output's name kept in its temp file's name
# os.uname, not socket.gethostname (the same name on POSIX): socket, secrets and tempfile cost every `align` run ~7 ms
# of start-up, so tempfile is imported where a temp file is made
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", os.uname().nodename.split(".")[0])[:32] or "host"
_LIVE: dict[str, int] = {}                                        # temp files being written -> the writing process
_REPLACE: dict[str, bool] = {}                                    # abspath -> may replace an existing file (force)


def _temp_prefix(out: Path) -> str:
    return f".{out.name[:_NAME_CHARS]}.{_HOST}.{os.getpid()}."


def _parent(out: Path) -> Path:
    return out.parent if str(out.parent) else Path(".")


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user counts: it exists, signalling it is just not allowed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(out: Path) -> None:
    """Remove the temp files of `out` left by a writer of this host that is gone (kill -9, power loss), each with a
    log line (the CLI prints it on stderr).

    Only regular files of this user named after a dead pid are removed: a live writer's temp file, another host's
    (a shared file system: its pid means nothing here) or another user's is left alone."""
    pattern = re.compile(re.escape(f".{out.name[:_NAME_CHARS]}.{_HOST}.") + r"(\d+)\.[a-z0-9_]+\.tmp")
    with contextlib.suppress(OSError), os.scandir(_parent(out)) as entries:
        for entry in entries:
            match = pattern.fullmatch(entry.name)
            if match is None or _alive(pid := int(match[1])):
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                    os.unlink(entry.path)
                    log.warning("removed stale temp file %s left by pid %d", entry.path, pid)


def check_output(path: str | os.PathLike, force: bool = False) -> Path:
    """Refuse an existing output (unless `force`) or an unwritable directory before any work is done; remove stale
    temp files of it; and remember whether the final rename may replace a file (only with `force`)."""
    out = Path(path)
    if out.is_dir():
        raise AlignerError(f"output {out} is a directory")
    if os.path.lexists(out) and not force:  # a broken symbolic link too: the final rename would replace it
        raise AlignerError(f"output {out} already exists (use --force to overwrite)")
    parent = _parent(out)
    if not parent.is_dir():
        raise AlignerError(f"output directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise AlignerError(f"output directory {parent} is not writable")
    _remove_stale_temps(out)
    _REPLACE[os.path.abspath(out)] = force
    return out


def current_umask() -> int:
    """The process umask, read without changing it where Linux tells it (os.umask alone must set it to read it)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as fh:
            return int(next(line for line in fh if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_temp_files() -> None:
    """Delete this process's temp files now (a signal handler calls it before unwinding)."""
    for tmp, pid in list(_LIVE.items()):
        if pid == os.getpid():  # a forked child inherits the table, never the files
            _discard(tmp)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while the block runs and deliver them after, so a set of renames is not cut in
    half. Python handlers run in the main thread only, so elsewhere (and for handlers set from C) nothing changes."""
    held: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is not None:
                previous[sig] = signal.signal(sig, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        for held_sig, handler in previous.items():
            signal.signal(held_sig, handler)
        if held:
            signal.raise_signal(held[0])


def _new_temp(out: Path) -> str:
    """Create an empty temp file beside `out`, mode 0666 & ~umask as `cp` makes (mkstemp makes 0600)."""
    import tempfile

    with _signals_deferred():  # a handler must find every temp file that exists
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(out), suffix=".tmp", dir=_parent(out))
        _LIVE[tmp] = os.getpid()
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    return tmp


def _discard(tmp: str) -> None:
    """Remove one of our temp files (already failing or done: an error removing it is not worth another)."""
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    _LIVE.pop(tmp, None)


def _fsync_path(path: str | Path, directory: bool = False) -> None:
    """fsync a file, or a directory after a rename into it (some file systems cannot sync a directory: skipped)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if not directory or exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _put_in_place(tmp: str, out: Path, replace: bool) -> None:
    """Rename `tmp` to `out`; unless `replace`, fail (AlignerError) if `out` exists rather than replace it."""
    if replace:
        os.replace(tmp, out)
    else:
        taken = AlignerError(f"output {out} was created by another process while this one wrote it; left it as it is "
                             "(use --force to overwrite)")
        try:
            os.link(tmp, out)  # no-replace: fails with EEXIST where a rename would silently replace
        except FileExistsError:
            raise taken from None
        except OSError:        # a file system without hard links (EPERM): check, then rename (a small window remains)
            if os.path.lexists(out):
                raise taken from None
            os.replace(tmp, out)
        else:
            os.unlink(tmp)
    _LIVE.pop(tmp, None)


def _may_replace(out: Path) -> bool:
    """What `check_output` was told for `out` (`force`), used up by this write; replace if it was never asked."""
    return _REPLACE.pop(os.path.abspath(out), True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path` for a writer that takes a file name; on success sync it and rename it to
    `path`, on any failure (or a signal) delete it."""
    out = Path(path)
    replace = _may_replace(out)
    tmp = _new_temp(out)
    try:
        yield Path(tmp)
        _fsync_path(tmp)
        _put_in_place(tmp, out, replace)
    except BaseException:
        _discard(tmp)
        raise
    _fsync_path(_parent(out), directory=True)


class _RecordingFile(io.FileIO):
    """A file that remembers the first OSError its writes raised: writers such as torch.save wrap it in their own
    RuntimeError, and the user should read "No space left on device", not "unexpected pos 704 vs 598"."""

    error: OSError | None = None

    def write(self, data: Any, /) -> int:
        try:
            return super().write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise


def _open(tmp: str, mode: str) -> tuple[IO[Any], _RecordingFile]:
    """A binary ("wb") or UTF-8 text ("w") file object on `tmp`, and its raw file that records write errors."""
    raw = _RecordingFile(tmp, "w")
    buffered = io.BufferedWriter(raw)
    return (buffered if "b" in mode else io.TextIOWrapper(buffered, encoding="utf-8")), raw


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temp file for writing ("wb", or "w" for UTF-8 text) that replaces `path` only if the block completes;
    a write error (a full disk, a file size limit) becomes one AlignerError, the temp file removed."""
    with atomic_files([path], mode) as (fh,):
        yield fh


def _backup(out: Path) -> str | None:
    """A hard link to the file `out` (restores it if a later rename of its set fails); None where there is no such
    file, or the file system has no hard links."""
    if not os.path.lexists(out) or os.path.isdir(out):
        return None
    backup = f"{_parent(out)}/{_temp_prefix(out)}{os.urandom(4).hex()}.tmp"
    try:
        os.link(out, backup)
    except OSError:
        return None
    _LIVE[backup] = os.getpid()
    return backup


def _commit(temps: Sequence[str], outs: Sequence[Path], replace: Sequence[bool]) -> None:
    """Rename every temp to its output, or none: if one rename fails, undo those done (a new output removed, a
    replaced one restored from a hard link to it taken just before, where the file system allows) and raise."""
    done: list[tuple[Path, str | None, bool]] = []  # (output, its backup, whether it existed) per rename made
    backups: list[str] = []
    try:
        with _signals_deferred():
            for tmp, out, may_replace in zip(temps, outs, replace):
                existed = os.path.lexists(out)
                backup = _backup(out) if len(outs) > 1 else None
                backups += [backup] if backup else []
                try:
                    _put_in_place(tmp, out, may_replace)
                except OSError as exc:
                    raise AlignerError(f"cannot write {out}: {exc.strerror or exc}") from exc
                done.append((out, backup, existed))
    except BaseException:
        for out, backup, existed in done:
            with contextlib.suppress(OSError):
                if backup:
                    os.replace(backup, out)
                elif not existed:
                    os.unlink(out)
        raise
    finally:
        for backup in backups:
            _discard(backup)
    for parent in {_parent(out) for out in outs}:
        _fsync_path(parent, directory=True)


@contextlib.contextmanager
def atomic_files(paths: Sequence[str | os.PathLike], mode: str = "wb") -> Iterator[list[IO[Any]]]:
    """Open one temp file per path; when the block completes, sync them all, then rename them all into place, so a
    set of outputs is whole or absent: a failure part-way (a write, a sync, a rename, a signal) removes every temp
    file and leaves each output as it was. A write error becomes one AlignerError naming the file."""
    outs = [Path(p) for p in paths]
    replace = [_may_replace(out) for out in outs]
    temps: list[str] = []
    opened: list[tuple[IO[Any], _RecordingFile]] = []
    syncing: Path | None = None  # the output being opened or synced, for the message
    try:
        for out in outs:
            syncing = out
            temps.append(_new_temp(out))
            opened.append(_open(temps[-1], mode))
        syncing = None
        yield [fh for fh, _ in opened]
        for (fh, _), out in zip(opened, outs):
            syncing = out
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        _commit(temps, outs, replace)
    except BaseException as exc:
        for fh, _ in opened:
            with contextlib.suppress(OSError, ValueError):
                fh.close()
        for tmp in temps:
            _discard(tmp)
        if not isinstance(exc, Exception):
            raise
        failed = [(out, raw.error) for (_, raw), out in zip(opened, outs) if raw.error is not None]
        if failed:
            culprit, cause = failed[0]
        elif isinstance(exc, OSError):
            culprit, cause = syncing or outs[0], exc
        else:
            raise
        raise AlignerError(f"cannot write {culprit}: {cause.strerror or cause}") from exc
