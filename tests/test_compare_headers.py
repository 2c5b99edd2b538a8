"""The .npy header fast path agrees with numpy's own reader on everything np.save writes, and defers otherwise."""
from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest

from aligner.pipelines.compare.sources import _saved_header, read_npy_header

SHAPES = [(), (0,), (1,), (4096,), (3, 4), (2, 1, 5), (7, 0, 3)]
DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_, ">f4", "<u2"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_fast_path_equals_numpy_reader(tmp_path, shape, dtype, order) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(shape, dtype, order=order))
    with open(path, "rb") as fh:
        fast = _saved_header(fh)
        offset = fh.tell()
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        assert version == (1, 0)
        slow = np.lib.format.read_array_header_1_0(fh)
        assert offset == fh.tell()
    assert fast is not None and fast[0] == slow[0] and fast[1] == slow[1] and fast[2] == slow[2]
    header = read_npy_header(path)
    assert (header.shape, header.fortran_order, header.dtype, header.data_offset) == (slow[0], slow[1], slow[2],
                                                                                      offset)


def test_other_headers_are_left_to_numpy(tmp_path) -> None:
    structured = np.zeros(3, [("a", "<f4"), ("b", "<i8")])
    buf = io.BytesIO()
    np.lib.format.write_array(buf, structured, version=(2, 0))
    for data in (buf.getvalue(), b"\x93NUMPY\x01\x00" + b"\x10\x00" + b"{'descr': '<f4'}".ljust(16)):
        fh = io.BytesIO(data)
        assert _saved_header(fh) is None and fh.tell() == 0
    path = tmp_path / "v2.npy"
    path.write_bytes(buf.getvalue())
    assert read_npy_header(path).dtype == structured.dtype  # numpy's reader handled it
    bf = tmp_path / "bf.npy"
    np.save(bf, np.zeros(4, ml_dtypes.bfloat16).view(np.uint16))
    assert read_npy_header(bf).dtype == np.dtype("<u2")
