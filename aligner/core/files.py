"""Opening the files a command reads from its user: regular files only, never blocking, under a size cap per kind.

Every input (source trees, maps, baselines, loss logs, checkpoints, foreign dumps' indices and tensors) is opened
here: the path is stat'ed first and a FIFO, device, socket or directory is refused before it is opened (a FIFO would
block the open or the read forever, /dev/zero would be read until memory runs out); the open itself is
O_RDONLY|O_NONBLOCK|O_CLOEXEC and the descriptor is checked again (the path may have changed in between), then
made blocking. Text inputs that are parsed whole have a size cap far above real files and far below memory
exhaustion, each raised through an environment variable; binary tensor files have none (their readers bound memory
by the shapes they declare), zip archives are checked against `MAX_RATIO` before anything is decompressed, and
legacy (non-zip) torch files against their own size before torch allocates the storages they declare.
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import pickle
import stat
import zipfile
from typing import BinaryIO, TextIO

from aligner.core.errors import AlignerError

MAX_RATIO = 64             # most a zip archive may expand (real weights compress about 1.1x, deflate up to 1032x)
RATIO_FLOOR = 64 << 20     # bytes: archives holding up to this much are never refused for their ratio


@dataclasses.dataclass(frozen=True)
class Cap:
    """The most bytes one kind of input may hold, `default` unless the environment variable `variable` says more."""

    what: str
    default: int
    variable: str

    @property
    def limit(self) -> int:
        """The cap in bytes: the environment variable when set (a whole number of bytes), else the default."""
        value = os.environ.get(self.variable, "").strip()
        if not value:
            return self.default
        if not value.isdigit():
            raise AlignerError(f"{self.variable}={value[:40]!r}: expected a whole number of bytes")
        return int(value)


SOURCE = Cap("Python source files", 2 << 20, "ALIGNER_MAX_SOURCE_BYTES")  # ast takes ~150-360x the file in memory
TEXT = Cap("map, baseline and config files", 16 << 20, "ALIGNER_MAX_TEXT_BYTES")  # YAML/JSON parsed whole
INDEX = Cap("dump indices and logs read whole", 256 << 20, "ALIGNER_MAX_INDEX_BYTES")  # dump.json, CSVs, IR, JSON


def _kind(mode: int) -> str | None:
    """What a non-regular file is ("a FIFO", "a device", ...), None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.4g} MiB"


def _too_large(path: str | os.PathLike[str], size: int, cap: Cap) -> AlignerError:
    return AlignerError(f"{os.fspath(path)}: {_mib(size)}, above the {_mib(cap.limit)} cap on {cap.what} (set "
                        f"{cap.variable} to a larger number of bytes to read it)")


def _checked(path: str | os.PathLike[str], info: os.stat_result, cap: Cap | None) -> None:
    """Refuse what `info` describes unless it is a regular file within `cap`."""
    kind = _kind(info.st_mode)
    if kind is not None:
        raise AlignerError(f"{os.fspath(path)}: not a regular file ({kind}); refusing to read it")
    if cap is not None and info.st_size > cap.limit:
        raise _too_large(path, info.st_size, cap)


def open_fd(path: str | os.PathLike[str], cap: Cap | None = None) -> int:
    """A blocking read-only descriptor on the regular file `path` (at most `cap` bytes); AlignerError for anything
    else, OSError when it cannot be opened (missing, permission, a symlink loop)."""
    _checked(path, os.stat(path), cap)  # refused before it is opened: opening a device can have effects
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        _checked(path, os.fstat(fd), cap)  # the file actually opened (the path may have been swapped)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_input(path: str | os.PathLike[str], cap: Cap | None = None) -> BinaryIO:
    """`open_fd` as a binary file object (closed by its `with` block)."""
    return os.fdopen(open_fd(path, cap), "rb")


def open_text(path: str | os.PathLike[str], cap: Cap | None = None, *, encoding: str = "utf-8",
              errors: str = "strict", newline: str | None = None) -> TextIO:
    """`open_fd` as a text file object."""
    return os.fdopen(open_fd(path, cap), "r", encoding=encoding, errors=errors, newline=newline)


def read_bytes(path: str | os.PathLike[str], cap: Cap) -> bytes:
    """The whole regular file, refused when it holds more than `cap` bytes (even one that grows while read)."""
    with open_input(path, cap) as fh:
        data = fh.read(cap.limit + 1)
    if len(data) > cap.limit:  # it grew since it was checked
        raise _too_large(path, len(data), cap)
    return data


def read_text(path: str | os.PathLike[str], cap: Cap, *, encoding: str = "utf-8", errors: str = "strict") -> str:
    """`read_bytes` decoded (UnicodeDecodeError with strict `errors`)."""
    return read_bytes(path, cap).decode(encoding, errors)


def check_expansion(where: str, size: int, total: int, advice: str) -> None:
    """Refuse an archive of `size` bytes whose members declare `total` uncompressed bytes, more than `MAX_RATIO`
    times its size (and more than `RATIO_FLOOR`): a decompression bomb is refused before anything is unpacked."""
    if total > max(RATIO_FLOOR, MAX_RATIO * size):
        raise AlignerError(f"{where}: its members expand {size} bytes to {total} (more than {MAX_RATIO}x: a "
                           f"decompression bomb?); refusing to unpack it ({advice})")


def check_zip(path: str | os.PathLike[str], fh: BinaryIO, advice: str) -> None:
    """`check_expansion` on the open file `fh` when it is a zip archive, all its members counted (a file whose zip
    directory cannot be read is left to its reader to refuse); `fh` is rewound."""
    size = os.fstat(fh.fileno()).st_size
    try:
        with zipfile.ZipFile(fh) as archive:
            total = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError):
        return  # NotImplementedError: a member needing a newer zip version (say 25.5) than zipfile reads
    finally:
        fh.seek(0)
    check_expansion(os.fspath(path), size, total, advice)


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of torch's legacy (non-zip) serialization


class _Inert:
    """Whatever a legacy torch pickle builds, built as nothing: the pickle is walked only for its storages' sizes,
    and no class it names is imported or called."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Inert:
        return _Inert()

    def __setstate__(self, state: object) -> None:
        pass

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, value: object) -> None:
        pass

    def extend(self, values: object) -> None:
        pass


# Opcodes of pickle protocols 4 and 5 (torch writes its legacy headers with protocol 2): a frame or a bytes object of
# a declared 8-byte length. The C unpickler met with one on a hostile 10-byte file printed "SystemError: deallocated
# bytearray object has exported buffers" beside the one-line error; the pure-Python one is told to refuse them.
_LATER_OPCODES = frozenset(op[0] for op in (pickle.FRAME, pickle.BINBYTES8, pickle.BINUNICODE8, pickle.BYTEARRAY8,
                                            pickle.NEXT_BUFFER, pickle.READONLY_BUFFER))


class _StorageSizes(pickle._Unpickler):  # the pure-Python unpickler, whose opcodes can be limited
    """Reads a pickle into `_Inert`s, keeping each storage's declared element count by its key (views share one)."""

    dispatch = {op: load for op, load in pickle._Unpickler.dispatch.items() if op not in _LATER_OPCODES}

    def __init__(self, fh: BinaryIO) -> None:
        super().__init__(fh)
        self.numels: dict[str, int] = {}

    def find_class(self, module: str, name: str) -> type[_Inert]:
        return _Inert

    def persistent_load(self, pid: object) -> _Inert:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[4], int):
            self.numels[str(pid[2])] = pid[4]
        return _Inert()


def check_legacy_torch(path: str | os.PathLike[str], fh: BinaryIO) -> None:
    """Refuse a legacy (non-zip) torch file whose storages declare more elements than it holds bytes: torch
    allocates each storage at the size its pickle declares before reading its data, so a 1 KB file could reserve
    any number of GiB (every element takes at least a byte, so a real file never declares more). Anything else, a
    zip file or a file these pickles do not parse, is left to torch.load; read from its start, `fh` is rewound."""
    size = os.fstat(fh.fileno()).st_size
    try:
        fh.seek(0)
        if _StorageSizes(fh).load() != _LEGACY_MAGIC:  # every pickle read inert: nothing named is imported
            return
        _StorageSizes(fh).load()  # the protocol version
        _StorageSizes(fh).load()  # the system info
        sizes = _StorageSizes(fh)
        sizes.load()
    except Exception:  # not a legacy file, or a corrupted one: torch.load says what it is
        return
    finally:
        fh.seek(0)
    declared = sum(n for n in sizes.numels.values() if n > 0)
    if declared > size:
        raise AlignerError(f"{os.fspath(path)}: its storages declare {declared:,} elements, more than the {size:,} "
                           "bytes the file holds (a forged or truncated legacy torch file); refusing to load it")
