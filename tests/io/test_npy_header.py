"""The .npy header fast path agrees with numpy's own reader on everything np.save writes, and defers otherwise; the
one header policy (aligner.io.npy_header) holds for dumps, checkpoints and foreign dumps alike."""
from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest

from aligner.core.errors import AlignerError
from aligner.dumping.read.foreign.base import npy_layout
from aligner.dumping.read.source import TensorError, read_npy_header
from aligner.io.npy_files import NpySource
from aligner.io.npy_header import saved_header

SHAPES = [(), (0,), (1,), (4096,), (3, 4), (2, 1, 5), (7, 0, 3)]
DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_, ">f4", "<u2"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_fast_path_equals_numpy_reader(tmp_path, shape, dtype, order) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(shape, dtype, order=order))
    with open(path, "rb") as fh:
        fast = saved_header(fh)
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
        assert saved_header(fh) is None and fh.tell() == 0
    v2 = tmp_path / "v2.npy"
    with v2.open("wb") as fh:
        np.lib.format.write_array(fh, np.arange(3, dtype="<f4"), version=(2, 0))
    header = read_npy_header(v2)  # numpy's reader handled it
    assert (header.shape, header.dtype, header.data_offset) == ((3,), np.dtype("<f4"), v2.stat().st_size - 12)
    bf = tmp_path / "bf.npy"
    np.save(bf, np.zeros(4, ml_dtypes.bfloat16).view(np.uint16))
    assert read_npy_header(bf).dtype == np.dtype("<u2")


def test_one_policy_for_every_npy_reader(tmp_path) -> None:
    """An object array (a pickle) and a structured array are refused by the dump reader, the checkpoint reader and
    the foreign-dump reader alike, each naming why (compare once accepted a structured array's header)."""
    structured = tmp_path / "s.npy"
    np.save(structured, np.zeros(3, [("a", "<f4"), ("b", "<i8")]))
    pickled = tmp_path / "o.npy"
    np.save(pickled, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    for path, why in ((structured, "structured dtype"), (pickled, "pickled objects")):
        with pytest.raises(TensorError, match=why):
            read_npy_header(path)
        with pytest.raises(AlignerError, match=why):
            NpySource(str(path))
        with pytest.raises(ValueError, match=why):
            npy_layout(path)
