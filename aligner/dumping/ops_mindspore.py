"""MindSpore op-level capture (`aligner.dump(ops=True, scope=...)`, PyNative mode): while the dump context is active,
the functions of `mindspore.ops`, `mindspore.ops.functional`, `mindspore.mint` and `mindspore.mint.nn.functional`,
the Tensor methods, operators and transpose properties, and `__call__` of every Primitive class (the
`ops.BatchMatMul(transpose_b=True)` a cell builds in `__init__` and calls in `construct`) are replaced by wrappers
that record the call when the scope module's forward is running. Everything is put back on exit.

MindSpore has no dispatch mode like torch's, so a thread-local flag makes an op that calls other ops
(`ops.softmax` -> the `Softmax` primitive) one record. Calls that return no tensor (`ops.shape`, `asnumpy`) leave none.
"""
from __future__ import annotations

import functools
import gc
import inspect
import threading
import types
from collections.abc import Iterator
from typing import Any, Callable

import mindspore
import mindspore.mint.nn.functional
import mindspore.ops.functional

from aligner.dumping.mindspore_hooks import check_eager, check_pynative
from aligner.dumping.options import Options
from aligner.dumping.scope import OpRecorder, check_scope, framework_dir, inplace
from aligner.dumping.session import Session

NAMESPACES = (("ops", mindspore.ops), ("ops.functional", mindspore.ops.functional), ("mint", mindspore.mint),
              ("mint.nn.functional", mindspore.mint.nn.functional))
OPERATORS = frozenset({"__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__",
                       "__imul__", "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__",
                       "__ifloordiv__", "__mod__", "__rmod__", "__imod__", "__pow__", "__rpow__", "__matmul__",
                       "__rmatmul__", "__neg__", "__pos__", "__abs__", "__invert__", "__and__", "__or__", "__xor__",
                       "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__getitem__", "__setitem__"})
COMPUTING_PROPERTIES = frozenset({"T", "mT", "H", "mH"})
# Tensor methods that compute no numbers; skipped so that host copies and metadata never pass through a wrapper.
SKIPPED = frozenset({"asnumpy", "numpy", "item", "tolist", "dim", "ndimension", "numel", "nelement", "data_ptr",
                     "is_contiguous", "is_floating_point", "is_complex", "register_hook", "init_data", "set_data",
                     "contiguous", "stride", "storage_offset", "untyped_storage", "element_size"})
# Primitives of the framework's hook plumbing (a Cell's backward hooks, which a model may register): not its ops.
HOOK_PRIMITIVES = frozenset({"CellBackwardHook"})
FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)
_MISSING = object()
_busy = threading.local()  # .on: a recorded op is running on this thread (its inner ops are part of it)


def _primitive_classes(cls: type) -> Iterator[type]:
    """`cls` and all its subclasses, each once."""
    seen: set[type] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.add(c)
            yield c
            todo.extend(c.__subclasses__())


class Patches:
    """Attributes replaced on modules and classes, put back (or removed) in reverse order by `remove`."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        self.saved.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, value)

    def remove(self) -> None:
        while self.saved:
            owner, name, original = self.saved.pop()
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def _wrap(recorder: OpRecorder, fn: Callable[..., Any], label: str | None, modifies: bool) -> Callable[..., Any]:
    """`fn` recording its calls as op `label` (None: a Primitive's `__call__`, named after the primitive's class)."""

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        if getattr(_busy, "on", False) or not recorder.active():
            return fn(*args, **kwargs)
        _busy.on = True
        try:
            return recorder.call(fn, label or f"ops.{type(args[0]).__name__}", args, kwargs, modifies)
        finally:
            _busy.on = False

    return op


def _patch(patches: Patches, recorder: OpRecorder) -> None:
    for prefix, module in NAMESPACES:
        for name, value in list(vars(module).items()):
            if not name.startswith("_") and isinstance(value, FUNCTIONS):
                patches.set(module, name, _wrap(recorder, value, f"{prefix}.{name}", False))
    tensor = mindspore.Tensor
    for name in dir(tensor):
        if (name.startswith("_") and name not in OPERATORS) or name in SKIPPED:
            continue
        value = inspect.getattr_static(tensor, name)
        if isinstance(value, property) and name in COMPUTING_PROPERTIES and value.fget is not None:
            patches.set(tensor, name, property(_wrap(recorder, value.fget, f"Tensor.{name}", False)))
        elif isinstance(value, FUNCTIONS):
            patches.set(tensor, name, _wrap(recorder, value, f"Tensor.{name}", inplace(name)))
    for cls in _primitive_classes(mindspore.ops.Primitive):
        if "__call__" in vars(cls) and cls.__name__ not in HOOK_PRIMITIVES:
            patches.set(cls, "__call__", _wrap(recorder, vars(cls)["__call__"], None, False))


def install(model: mindspore.nn.Cell, session: Session, opts: Options) -> list[Any]:
    """Check the mode, the model and the scope, then wrap every op; returns the handle that unwraps them."""
    check_pynative()
    check_eager(model)
    check_scope(opts.scope, (path for path, _ in model.cells_and_names()), type(model).__name__)
    patches = Patches()
    collecting = gc.isenabled()
    gc.disable()  # building ~3400 wrappers would trigger collections over MindSpore's objects: 4x the patching time
    try:
        _patch(patches, OpRecorder(session, opts, (framework_dir(mindspore),), __file__))
    except BaseException:
        patches.remove()
        raise
    finally:
        if collecting:
            gc.enable()
    return [patches]
