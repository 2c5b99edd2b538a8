"""How a module was called, as JSON a replay can call it back with: the arguments with tensors as placeholders, each
input tensor's place in the call, and the module's class and scalar attributes.

Values JSON has no word for are tagged (`{"tuple": [...]}`, `{"dict": {...}}`, `{"float": "inf"}`,
`{"dtype": "float32"}`); anything else becomes `{"repr": ..., "type": ...}`, which `restore` refuses: such a call
cannot be replayed from the dump alone.
"""
from __future__ import annotations

import enum
import functools
import math
import sys
from typing import Any, Callable

import numpy as np

from aligner.core.dtypes import canonical
from aligner.core.errors import AlignerError
from aligner.dumping.tensors import is_tensor

_REPR_MAX = 200


def describe(args: tuple, kwargs: dict) -> tuple[dict[str, Any], list[str]]:
    """({"args": [...], "kwargs": {...}} with tensors as {"tensor": i}, and each tensor's place: "0", "mask", "1/0").

    Tensors are numbered in `tensors_in((args, kwargs))` order, the order of the input records."""
    places: list[str] = []

    def walk(value: Any, place: str) -> Any:
        if is_tensor(value):
            places.append(place)
            return {"tensor": len(places) - 1}
        if isinstance(value, (tuple, list)):
            items = [walk(v, f"{place}/{i}") for i, v in enumerate(value)]
            return items if type(value) is list else {"tuple": items}
        if isinstance(value, dict):
            return {"dict": {str(k): walk(v, f"{place}/{k}") for k, v in value.items()}}
        return scalar(value)

    positional = [walk(v, str(i)) for i, v in enumerate(args)]
    keywords = {str(k): walk(v, str(k)) for k, v in kwargs.items()}
    return {"args": positional, "kwargs": keywords}, places


def scalar(value: Any, opaque: Callable[[Any], Any] | None = None) -> Any:
    """A non-tensor value as JSON (tagged where JSON has no word for it); `opaque(value)`, where given, in place of
    the `{"repr": ...}` of a value JSON cannot hold (its items' are tagged as usual)."""
    kind = type(value)
    if kind in _EXACT:  # the common case first (a call record per module call): no isinstance chain
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is tuple or kind is list:
        items = []
        for v in value:
            if type(v) not in _EXACT and is_tensor(v):
                return (opaque or _opaque)(value)
            items.append(scalar(v))
        return items if kind is list else {"tuple": items}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, enum.Enum):
        return scalar(value.value, opaque)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else {"float": repr(f)}
    if isinstance(value, (tuple, list)) and all(not is_tensor(v) for v in value):
        items = [scalar(v) for v in value]
        return items if type(value) is list else {"tuple": items}
    if _is_dtype(value):
        try:
            return {"dtype": canonical(value)}
        except AlignerError:
            pass
    return (opaque or _opaque)(value)


_EXACT = frozenset({type(None), bool, int, str})  # written as they are (not their subclasses: an IntEnum, np.str_)


def _is_dtype(value: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.dtype):
        return True
    ms = sys.modules.get("mindspore")
    return ms is not None and isinstance(value, ms.dtype.Type)


def _opaque(value: Any) -> dict[str, str]:
    text = repr(value)
    return {"repr": text if len(text) <= _REPR_MAX else text[:_REPR_MAX] + "...", "type": type(value).__name__}


class MalformedCallError(AlignerError):
    """A recorded call signature that `describe` cannot have written (a damaged or hand-edited manifest)."""


def restore(structure: dict[str, Any], tensors: list[Any], dtype: Callable[[str], Any] = lambda name: name
            ) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) back from `describe`'s structure, tensors taken from `tensors` by index; `dtype` turns a
    canonical dtype name into the target framework's dtype. An opaque value raises AlignerError naming it, a
    malformed structure MalformedCallError."""

    def build(value: Any) -> Any:
        if isinstance(value, list):
            return [build(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "tensor" in value:
            index = value["tensor"]
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tensors):
                raise MalformedCallError(f"the recorded call names input {index!r:.40}, which the dump does not hold")
            return tensors[index]
        if "tuple" in value and isinstance(value["tuple"], list):
            return tuple(build(v) for v in value["tuple"])
        if "dict" in value and isinstance(value["dict"], dict):
            return {str(k): build(v) for k, v in value["dict"].items()}
        if "float" in value and value["float"] in ("inf", "-inf", "nan"):
            return float(value["float"])
        if "dtype" in value and isinstance(value["dtype"], str):
            try:
                return dtype(value["dtype"])
            except AlignerError as exc:
                raise MalformedCallError(f"the recorded call passed dtype {value['dtype']!r:.40}: {exc}") from None
        if "repr" not in value:
            raise MalformedCallError(f"the recorded call holds {str(value)[:60]}, which no dump writes")
        raise AlignerError(f"the recorded call passed a {value.get('type', '?')} ({value.get('repr', '?')}), which "
                           "a replay cannot rebuild from the dump")

    args, kwargs = structure.get("args", []), structure.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise MalformedCallError("the recorded call signature is malformed (args must be a list, kwargs an object)")
    return [build(v) for v in args], {str(k): build(v) for k, v in kwargs.items()}


def attributes(module: Any) -> dict[str, Any]:
    """The module's class (qualified) and its public attributes that are plain values (what its constructor set:
    Conv2d's kernel_size, MindSpore's pad_mode), tensors and submodules left out. Computed at each module's first call
    of every dumped step (~0.07 ms for a MindSpore BatchNorm and its 15 operators, warm), so a value left out is
    never written out with `repr` first (a transformers module's config serialised itself for it)."""
    cls = type(module)
    out: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}",
                           "training": bool(getattr(module, "training", False))}
    base = _base_names(module)
    primitive = _primitive_class()
    for name, value in vars(module).items():
        if name.startswith("_") or name in base:
            continue
        if type(value) in _EXACT:
            out[name] = value
        elif is_tensor(value):
            continue
        elif callable(value):
            if primitive is not None and isinstance(value, primitive):
                settings = _primitive_settings(value)
                if settings:  # the operator the cell computes with: its epsilon is what counts, not the cell's copy
                    out[name] = {"dict": settings}
        elif (encoded := scalar(value, _left_out)) is not _LEFT_OUT:
            out[name] = encoded
    return out


_LEFT_OUT = object()  # a value `attributes` leaves out (one `scalar` would write as its repr)


def _left_out(value: Any) -> object:
    return _LEFT_OUT


def _primitive_class() -> type | None:
    """MindSpore's operator base class where MindSpore is imported (a cell holds its operators as attributes)."""
    return getattr(getattr(sys.modules.get("mindspore"), "ops", None), "Primitive", None)


def _primitive_settings(value: Any) -> dict[str, Any]:
    """The plain-valued settings of a MindSpore operator a cell holds (`nn.LayerNorm.layer_norm`, an
    `ops.LayerNorm(epsilon=...)`): its `attrs` but dtypes and values JSON cannot hold."""
    attrs = getattr(value, "attrs", None)
    if not isinstance(attrs, dict):
        return {}
    settings = {}
    for key, item in attrs.items():
        encoded = scalar(item, _left_out)
        if encoded is not _LEFT_OUT and not (type(encoded) is dict and "dtype" in encoded):
            settings[str(key)] = encoded
    return settings


@functools.cache
def _root_names(root: type) -> frozenset[str]:
    return frozenset(vars(root()))


def _base_names(module: Any) -> frozenset[str]:
    """Attributes every torch Module / MindSpore Cell has (its bookkeeping, not the layer's configuration)."""
    for root in (getattr(sys.modules.get("torch"), "nn", None), getattr(sys.modules.get("mindspore"), "nn", None)):
        cls = getattr(root, "Module", None) or getattr(root, "Cell", None)
        if cls is not None and isinstance(module, cls):
            return _root_names(cls)
    return frozenset()
