"""The .npy header, parsed once for every reader of .npy files: checkpoints (`io/npy_files.py`), aligner dumps and
plain .npy folders (`dumping/read/source.py`) and MindSpore's native dump (`dumping/read/foreign/native.py`).

One policy, the strictest any of them had: object arrays are refused (their data is a pickle, never loaded), and so
are structured dtypes (records, not tensors); a header cut short or malformed is an error naming why. Reading the
data is each caller's business: this module says where it starts and what it holds.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import IO

import numpy as np

# The version 1.0 header np.save writes, e.g. "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" and
# space padding. Matched directly: numpy's reader runs ast.literal_eval, half the cost of listing many small files.
_SAVED_HEADER = re.compile(rb"\{'descr': '([<>|=][a-z]\d+)', 'fortran_order': (False|True), "
                           rb"'shape': \(((?:\d+, )*\d+,?)?\), \} *\n")


class NpyHeaderError(ValueError):
    """A .npy header that does not describe a tensor aligner will read; the message says why, without a path."""


@dataclasses.dataclass(frozen=True)
class NpyHeader:
    """What a .npy header says: shape, stored dtype (byte order included), order, and where the data starts."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int  # bytes from the start of the stream

    @property
    def nbytes(self) -> int:
        """Bytes of data the header declares."""
        return math.prod(self.shape) * self.dtype.itemsize


def saved_header(fh: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """(shape, fortran_order, dtype) of a header exactly as np.save writes it, else None with `fh` rewound."""
    start = fh.read(10)
    if start[:8] == b"\x93NUMPY\x01\x00" and len(start) == 10:
        found = _SAVED_HEADER.fullmatch(fh.read(int.from_bytes(start[8:], "little")))
        if found:
            shape = tuple(int(n) for n in (found[3] or b"").split(b",") if n.strip())
            return shape, found[2] == b"True", np.dtype(found[1].decode())
    fh.seek(0)
    return None


def read_header(fh: IO[bytes]) -> NpyHeader:
    """Parse the .npy header at the start of `fh` (positioned at 0) without reading data; NpyHeaderError for a header
    cut short or malformed, an object array or a structured dtype. Headers np.save did not write (other versions,
    other spellings) go to numpy's own reader, which has the last word; OSError passes through."""
    fmt = np.lib.format
    try:
        parsed = saved_header(fh)
        if parsed is None:
            version = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            parsed = read(fh)
    except OSError:
        raise
    except Exception as exc:  # numpy parses with ast/tokenize: ValueError, SyntaxError, TokenError, ...
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
        if reason.startswith("EOF"):  # numpy's reader: "EOF: reading array header, expected N bytes got M"
            raise NpyHeaderError("corrupted header: truncated inside it") from None
        raise NpyHeaderError(f"not a .npy file or corrupted header ({reason})") from None
    shape, fortran, dtype = parsed
    if dtype.hasobject:
        raise NpyHeaderError("holds pickled objects: refused (aligner never unpickles a .npy file)")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise NpyHeaderError(f"structured dtype {dtype} is not a tensor")
    return NpyHeader(tuple(shape), dtype, bool(fortran), fh.tell())
