"""PyTorch op-level capture (`aligner.dump(ops=True, scope=...)`): a TorchFunctionMode, active while the dump context
is, records every torch function, `torch.nn.functional` call and Tensor method or operator called while the scope
module's forward runs (at any depth).

Torch disables the mode inside its own handler, so an op that calls other ops (F.softmax -> Tensor.softmax) is one
record, and the host copies the recorder makes are not ops. Calls that compute no numbers are skipped: metadata
(`size`, `dim`, the `shape` property) and autograd bookkeeping (`detach`, `register_hook`); calls that return no tensor
leave no record. Tensor calls made by aligner's own module hooks (`view_as`) are not the model's and are skipped.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from aligner.dumping.options import Options
from aligner.dumping.scope import OpRecorder, check_scope, framework_dir, inplace
from aligner.dumping.session import Session

# Tensor methods that compute no numbers (or only autograd state): recorded by no op-level dump.
SKIPPED = frozenset({"size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset", "element_size",
                     "is_contiguous", "is_floating_point", "is_complex", "data_ptr", "get_device", "untyped_storage",
                     "item", "tolist", "numpy", "__len__", "__bool__", "__format__", "__repr__", "__hash__",
                     "__reduce_ex__", "__array__", "detach", "detach_", "requires_grad_", "retain_grad",
                     "register_hook", "contiguous", "__set__", "__setstate__", "__deepcopy__"})
# Tensor properties that compute: transposes and complex parts (every other property is metadata or autograd state).
COMPUTING_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag"})
# Where torch reports a function's module -> the prefix under which the dump names it.
_PREFIXES = {"torch.nn.functional": "F", "torch._C._nn": "F", "torch": "torch", "torch.functional": "torch",
             "torch._C._VariableFunctions": "torch", "torch._C._linalg": "torch.linalg",
             "torch._C._special": "torch.special", "torch._C._fft": "torch.fft"}


def op_name(func: Callable[..., Any]) -> str:
    """The name an op record gives a torch callable: "torch.matmul", "F.softmax", "Tensor.mul", "Tensor.mT"."""
    name = getattr(func, "__name__", type(func).__name__)
    if name == "__get__":  # a property read: name the property
        owner = getattr(func, "__self__", None)
        prop = getattr(owner, "__name__", None) or getattr(getattr(owner, "fget", None), "__name__", "property")
        return f"Tensor.{prop}"
    if getattr(func, "__qualname__", "").startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or ""
    prefix = _PREFIXES.get(module, module)
    return f"{prefix}.{name}" if prefix else name


def _skipped(func: Callable[..., Any]) -> bool:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        return getattr(owner, "__name__", None) not in COMPUTING_PROPERTIES
    return name in SKIPPED


class _OpMode(TorchFunctionMode):
    """Records each op called while the scope module runs; passes every call through unchanged."""

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.recorder.active() or _skipped(func):
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        modifies = inplace(name) or kwargs.get("out") is not None or kwargs.get("inplace") is True
        return self.recorder.call(func, op_name(func), args, kwargs, modifies)


class _ModeHandle:
    """Leaves the mode when the dump context exits (once)."""

    def __init__(self, mode: _OpMode) -> None:
        self.mode: _OpMode | None = mode

    def remove(self) -> None:
        if self.mode is not None:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)


def install(model: torch.nn.Module, session: Session, opts: Options) -> list[Any]:
    """Check the scope and enter the op-recording mode; returns the handle that leaves it."""
    check_scope(opts.scope, (path for path, _ in model.named_modules()), type(model).__name__)
    mode = _OpMode(OpRecorder(session, opts, (framework_dir(torch),), __file__))
    mode.__enter__()
    return [_ModeHandle(mode)]
