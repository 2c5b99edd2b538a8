"""Framework detection and host copies of tensors, without importing a framework the caller has not imported."""
from __future__ import annotations

import sys
from typing import Any, Callable, Hashable, Iterator

import numpy as np

from aligner.core.dtypes import NUMPY, canonical, to_numpy, torch_to_numpy
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework


def model_framework(model: Any) -> Framework:
    """PYTORCH for a torch.nn.Module, MINDSPORE for a mindspore.nn.Cell, else a clear AlignerError."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return Framework.PYTORCH
    ms = sys.modules.get("mindspore")
    if ms is not None and isinstance(model, ms.nn.Cell):
        return Framework.MINDSPORE
    raise AlignerError(f"aligner.dump needs a torch.nn.Module or a mindspore.nn.Cell, got {type(model).__name__}; "
                       "pass the model object itself (not its state_dict, a function or a path)")


def framework_version(framework: str) -> str:
    """The installed version string of an (already imported) framework."""
    return sys.modules["torch" if framework == Framework.PYTORCH else "mindspore"].__version__


def is_tensor(obj: Any) -> bool:
    """True for a torch or MindSpore tensor (including Parameters)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return True
    ms = sys.modules.get("mindspore")
    return ms is not None and isinstance(obj, ms.Tensor)


def tensors_in(obj: Any) -> Iterator[Any]:
    """The tensors in a tensor or a (nested) tuple/list/dict of them, in order; other values are skipped."""
    if is_tensor(obj):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_in(item)


def map_tensors(fn: Callable[[Any], Any], obj: Any) -> Any:
    """`obj` with every tensor inside (a nested tuple/list/dict, in `tensors_in`'s order) replaced by fn(tensor):
    what a hook hands a call or its caller in place of the tensors it was given."""
    if is_tensor(obj):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        items = [map_tensors(fn, o) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)  # namedtuples take *args
    if isinstance(obj, dict):
        return type(obj)((k, map_tensors(fn, v)) for k, v in obj.items())
    return obj


def view_key(tensor: Any) -> Hashable | None:
    """The memory a torch or MindSpore tensor views: (address, shape, strides, dtype). Two tensors with equal keys,
    the first one still alive (so its memory cannot have been reused), hold the same numbers unless written in place
    since: what links an input or a gradient that a framework hands over as a new Python object to the record of
    the tensor it views. None for anything else."""
    torch = sys.modules.get("torch")
    ms = sys.modules.get("mindspore")
    try:
        if torch is not None and isinstance(tensor, torch.Tensor):
            if tensor.layout != torch.strided or tensor.is_nested:
                return None
            base = tensor.untyped_storage().data_ptr()
            key = (base + tensor.storage_offset() * tensor.element_size(), tuple(tensor.shape), tensor.stride(),
                   tensor.dtype)
        elif ms is not None and isinstance(tensor, ms.Tensor):
            base = tensor.data_ptr()
            key = (base, tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        else:
            return None
    except (RuntimeError, TypeError, NotImplementedError):  # no storage of its own (a tensor subclass, a wrapper)
        return None
    return key if base else None  # address 0: no data (a meta tensor), nothing to tell tensors apart by


def to_host(tensor: Any) -> np.ndarray:
    """A numpy copy of a torch/MindSpore tensor or numpy array that later in-place ops cannot change (bf16 kept)."""
    if isinstance(tensor, np.ndarray):
        return tensor.copy()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        return torch_to_numpy(tensor.detach().to("cpu", copy=True))
    ms = sys.modules.get("mindspore")
    if ms is not None and isinstance(tensor, ms.Tensor):
        return np.array(ms_numpy(tensor), copy=True)  # asnumpy shares the tensor's memory on CPU
    raise AlignerError(f"aligner.save needs a torch or MindSpore tensor or a numpy array, got {type(tensor).__name__}")


def ms_numpy(tensor: Any) -> np.ndarray:
    """A MindSpore tensor's `asnumpy` (on CPU, its memory; it waits for the op writing it), bfloat16 as ml_dtypes'."""
    array = tensor.asnumpy()
    # MindSpore registers its own numpy bfloat16 type: reinterpret the bits as ml_dtypes' (one bfloat16 for all)
    return array.view(np.uint16).view(to_numpy("bfloat16")) if array.dtype.name == "bfloat16" else array


def dtype_name(tensor: Any) -> str:
    """The canonical dtype name of a torch/MindSpore tensor or numpy array, without copying it."""
    return canonical(tensor.dtype)


def dtype_label(tensor: Any) -> str:
    """A tensor's dtype as a name, also for one no reader supports ("complex64", "uint32"); never raises: what a
    skipped record says it held."""
    name = str(getattr(tensor, "dtype", type(tensor).__name__)).lower()
    return name.removeprefix("torch.").removeprefix("mindspore.")


def unstorable(tensor: Any, exc: Exception) -> str:
    """Why `tensor` could not be recorded (the reason of its skipped record): its dtype when no reader supports it,
    else the exception met, in one line."""
    label = dtype_label(tensor)
    return f"unsupported dtype {label}" if label not in NUMPY else failure(exc)


def failure(exc: Exception) -> str:
    """An exception a hook met, in one line of at most ~250 characters (a skipped record's reason)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def shape_of(tensor: Any) -> list[int]:
    """The shape of a torch/MindSpore tensor or numpy array as a list of ints, without copying it."""
    return [int(s) for s in tensor.shape]
