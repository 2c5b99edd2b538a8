"""Canonical dtype names shared by every format and framework (`float32`, `bfloat16`, ...).

Both frameworks, every file format and the dump manifest speak these names, so `torch.float32` and MindSpore's
`Float32` compare equal as the string `float32`.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError


class _NumpyDtypes(Mapping[str, np.dtype]):
    """Canonical name -> numpy dtype. bfloat16's comes from ml_dtypes (stored losslessly), imported the first time
    it is asked for: a command that meets no bfloat16 tensor never pays for that import (~7 ms of its start)."""

    def __init__(self, dtypes: dict[str, Any]) -> None:
        self._names = tuple(dtypes)
        self._dtypes = {name: np.dtype(dtype) for name, dtype in dtypes.items() if dtype is not None}

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bfloat16" and name not in self._dtypes:
            import ml_dtypes  # registers its types with numpy: only here, on first use

            self._dtypes[name] = np.dtype(ml_dtypes.bfloat16)
        return self._dtypes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


# canonical name -> numpy dtype (bfloat16 through ml_dtypes, on first use)
NUMPY: Mapping[str, np.dtype] = _NumpyDtypes({
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "bfloat16": None,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "bool": np.bool_,
})
# MindSpore checkpoint `tensor_type` strings (also `str(mindspore.float32)`)
MINDSPORE_NAME: dict[str, str] = {
    "float16": "Float16", "float32": "Float32", "float64": "Float64", "bfloat16": "BFloat16",
    "int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64", "uint8": "UInt8", "bool": "Bool",
}
# safetensors header dtype codes
SAFETENSORS_CODE: dict[str, str] = {
    "float16": "F16", "float32": "F32", "float64": "F64", "bfloat16": "BF16",
    "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8", "bool": "BOOL",
}
FLOATING = frozenset({"float16", "float32", "float64", "bfloat16"})
INTEGER = frozenset({"int8", "int16", "int32", "int64", "uint8"})

_ALIASES: dict[str, str] = {}
for _canon in NUMPY:
    _ALIASES[_canon] = _canon
    _ALIASES[MINDSPORE_NAME[_canon].lower()] = _canon
    _ALIASES[SAFETENSORS_CODE[_canon].lower()] = _canon
    _ALIASES[f"torch.{_canon}"] = _canon
    _ALIASES[f"mindspore.{_canon}"] = _canon
_ALIASES.update({"half": "float16", "float": "float32", "double": "float64", "bool_": "bool",
                 "torch.half": "float16", "torch.float": "float32", "torch.double": "float64",
                 "torch.long": "int64", "torch.int": "int32", "torch.short": "int16"})


def canonical(dtype: Any) -> str:
    """The canonical name of a dtype given as a numpy/torch/MindSpore dtype or any of their string spellings."""
    try:
        return _cached_canonical(dtype)  # called per tensor on hot paths: numpy dtype -> name costs microseconds
    except TypeError:  # an unhashable dtype-like object
        return _canonical(dtype)


def _canonical(dtype: Any) -> str:
    key = dtype if isinstance(dtype, str) else str(dtype)
    if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        key = np.dtype(dtype).name
    name = _ALIASES.get(key.lower())
    if name is None:
        raise AlignerError(f"unsupported dtype {key!r} (supported: {', '.join(NUMPY)})")
    return name


_cached_canonical = functools.lru_cache(maxsize=1024)(_canonical)


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """A CPU torch tensor as a zero-copy numpy array; bfloat16 is reinterpreted bit for bit as ml_dtypes.bfloat16."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(NUMPY["bfloat16"])
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray, copy: bool = False) -> Any:
    """A numpy array (bfloat16 as ml_dtypes') as a CPU torch tensor: sharing its memory, or with `copy` its own."""
    import torch

    data = contiguous(array)
    if data.dtype == NUMPY["bfloat16"]:
        bits = data.view(np.int16)
        return torch.from_numpy(bits.copy() if copy else bits).view(torch.bfloat16)
    return torch.from_numpy(data.copy() if copy else data)


def to_numpy(name: str) -> np.dtype:
    """The numpy dtype that stores a canonical dtype losslessly."""
    return NUMPY[canonical(name)]


def contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous array, copying only when needed (unlike np.ascontiguousarray, keeps 0-d arrays 0-d)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def to_storable(array: np.ndarray) -> np.ndarray:
    """The array as written to .npy: bfloat16 becomes its uint16 bit pattern, everything else is unchanged."""
    return array.view(np.uint16) if array.dtype == to_numpy("bfloat16") else array


def from_stored(array: np.ndarray, dtype: str) -> np.ndarray:
    """Undo `to_storable` given the record's canonical dtype."""
    return array.view(to_numpy("bfloat16")) if canonical(dtype) == "bfloat16" else array
