""".npy (one tensor, named by the file stem) and .npz readers; never unpickle, never trust a declared size.

A .npy is read with pread (`FileSource`). An .npz member is decompressed a block at a time; before anything is
allocated each member's header must agree with the size the archive declares for it, and the members together may
hold at most `MAX_RATIO` times the archive's size (or `RATIO_FLOOR`; the rule is aligner.core.files's, shared with
torch's zip files): a deflate bomb is refused, not unpacked. Both are opened through `aligner.core.files` (regular
files only).
"""
from __future__ import annotations

import os
import zipfile
import zlib
from typing import IO, Iterator

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.files import check_expansion, open_input
from aligner.io.base import READ_BLOCK, FileSource, Layout, TensorInfo, TensorSource, checked_info
from aligner.io.npy_header import NpyHeaderError, read_header

_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError,
               NotImplementedError, RuntimeError)


def _header(fh: IO[bytes], where: str, name: str) -> tuple[TensorInfo, np.dtype, bool, int]:
    """(info, stored dtype, fortran order, header length) of the .npy stream `fh` positioned at its start."""
    try:
        header = read_header(fh)
    except NpyHeaderError as exc:
        raise AlignerError(f"{where}: {exc}") from None
    return (checked_info(where, name, header.shape, header.dtype), header.dtype, header.fortran_order,
            header.data_offset)


class NpySource(FileSource):
    """One .npy file: one tensor named by the file stem."""

    format = "npy"

    def __init__(self, path: str) -> None:
        super().__init__(path, None)
        try:
            name = os.path.splitext(os.path.basename(path))[0]
            with os.fdopen(self._fd, "rb", closefd=False) as fh:  # the descriptor FileSource opened and checked
                info, stored, fortran, offset = _header(fh, path, name)
            if offset + info.nbytes > self.size:
                raise AlignerError(f"{path}: truncated .npy file ({self.size} bytes, its header needs "
                                   f"{offset + info.nbytes})")
            self.add(name, info, Layout(((offset, info.nbytes),), stored, fortran and len(info.shape) > 1))
        except BaseException:
            self.close()
            raise


class NpzSource(TensorSource):
    """An .npz archive, read member by member (nothing is decompressed until a tensor is asked for)."""

    format = "npy"

    def __init__(self, path: str) -> None:
        super().__init__(path, None)
        self._file = open_input(path)
        try:
            self._zip = zipfile.ZipFile(self._file)
        except _ZIP_ERRORS as exc:
            self._file.close()
            raise AlignerError(f"{path}: not a readable .npz archive: {str(exc)[:120]}") from None
        self._members: dict[str, tuple[zipfile.ZipInfo, np.dtype, bool, int]] = {}
        try:
            skipped = [m.filename for m in self._zip.infolist() if not self._add(m)]
        except BaseException:
            self.close()
            raise
        try:
            check_expansion(path, os.fstat(self._file.fileno()).st_size,
                            sum(member.file_size for member, *_ in self._members.values()),
                            "extract it and pass the .npy files if you trust it")
        except AlignerError:
            self.close()
            raise
        if skipped:
            names = ", ".join(map(repr, skipped[:5]))
            self.notes.append(f"skipped {len(skipped)} archive member(s) that are not .npy: {names}")

    def _add(self, member: zipfile.ZipInfo) -> bool:
        """Check one member's header against its declared sizes and register it; False for a non-.npy member."""
        if not member.filename.endswith(".npy"):  # also skips directories (and an empty name, which is_dir breaks on)
            return False
        where = f"{self.path}: member {member.filename!r}"
        name = member.filename[:-4]
        if member.flag_bits & 0x1:
            raise AlignerError(f"{where} is encrypted")
        try:
            with self._zip.open(member) as fh:
                info, stored, fortran, offset = _header(fh, where, name)
        except _ZIP_ERRORS as exc:
            raise AlignerError(f"{where}: cannot be read ({str(exc)[:120]})") from None
        if offset + info.nbytes != member.file_size:
            raise AlignerError(f"{where}: its header declares {info.nbytes} bytes of data, the archive says the "
                               f"member holds {member.file_size - offset}")
        self.infos[name] = info
        self._members[name] = (member, stored, fortran and len(info.shape) > 1, offset)
        return True

    def _blocks(self, name: str, buffer: np.ndarray) -> Iterator[np.ndarray]:
        """Fill `buffer` again and again with the member's data (at most READ_BLOCK bytes decompressed per call);
        yield the filled part each time."""
        member, _, _, offset = self._members[name]
        raw = buffer.view(np.uint8).data
        left = member.file_size - offset
        try:
            with self._zip.open(member) as fh:  # a ZipExtFile (typed IO[bytes], which lacks readinto)
                fh.read(offset)
                while left > 0:
                    want = min(left, len(raw))
                    got = 0
                    while got < want:
                        n = fh.readinto(raw[got:min(want, got + READ_BLOCK)])  # type: ignore[attr-defined]
                        if not n:
                            raise AlignerError(f"{self.path}: member {member.filename!r} ends early (corrupted)")
                        got += n
                    left -= want
                    yield buffer[:want // buffer.itemsize]
        except _ZIP_ERRORS as exc:
            raise AlignerError(f"{self.path}: member {member.filename!r} cannot be read ({str(exc)[:120]})") from None

    def _load(self, name: str) -> np.ndarray:
        info = self.infos[name]
        _, stored, fortran, _ = self._members[name]
        out = np.empty(info.numel, stored)
        for _ in self._blocks(name, out):
            pass
        native = out if stored.isnative else out.astype(stored.newbyteorder("="))
        return native.reshape(info.shape[::-1]).transpose() if fortran else native.reshape(info.shape)

    def chunks(self, name: str, size: int) -> Iterator[np.ndarray]:
        stored = self._members[name][1]
        block = np.empty(max(1, min(size, READ_BLOCK // stored.itemsize)), stored)
        for piece in self._blocks(name, block):
            yield piece if stored.isnative else piece.astype(stored.newbyteorder("="))

    def close(self) -> None:
        if hasattr(self, "_zip"):
            self._zip.close()
            self._file.close()


def open_npy(path: str) -> TensorSource:
    """A single .npy file (one tensor named by the file stem) or an .npz archive."""
    return NpzSource(path) if path.lower().endswith(".npz") else NpySource(path)
