"""Read one model's layers for the audit, whichever framework it is: each module of a known kind with its path, the
framework class it is, its own parameters (as built), its compute dtype, and, after a forward pass on the example
inputs, its call order and input shape.

torch and MindSpore are imported inside the functions that need them (`align --help` stays fast).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.mapping.structural import neutral_leaf
from aligner.pipelines.audit.rules import RuleBook, qualname

_ROOTS = {Framework.PYTORCH: "torch.", Framework.MINDSPORE: "mindspore."}


@dataclasses.dataclass
class Layer:
    """One module of a known kind on one side."""

    path: str
    kind: str
    base: str                              # qualified name of the framework class that gave the kind
    module: Any = dataclasses.field(repr=False)
    params: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)   # neutral leaf -> values
    leaves: dict[str, str] = dataclasses.field(default_factory=dict)    # neutral leaf -> own leaf name
    dtype: str | None = None
    order: int = 0
    input_shape: tuple[int, ...] | None = None
    recognised: str = "class"     # "class" (a framework class, forward its own), "subclass" (its own forward) or
                                  # "name" (a third-party class taken by its name: only a probe can check it)
    tensors: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)   # neutral leaf -> the parameter
    called: bool = True           # False when example inputs ran and never reached it
    calls: tuple[tuple[int, tuple[int, ...] | None], ...] = ()   # (call order, input shape) of each call, traced
    call: int = 0                 # which of `calls` this entry stands for (see `per_call`)

    @property
    def needs_probe(self) -> bool:
        """Whether only running it tells what it computes (a forward of its own, or no framework class at all)."""
        return self.recognised != "class"

    @property
    def class_name(self) -> str:
        return type(self.module).__name__


_FORWARD = {Framework.PYTORCH: "forward", Framework.MINDSPORE: "construct"}


def kind_of(module: Any, framework: Framework, book: RuleBook) -> tuple[str, str, str] | None:
    """(kind, class that gave it, how recognised): the first framework class in the module's hierarchy that the rules
    name ("class", or "subclass" when the module's own class overrides its forward), else the first class whose name
    the rules know (`by_name`: a third-party layer subclassing no framework layer)."""
    mro = type(module).__mro__
    for cls in mro:
        if cls.__module__.startswith(_ROOTS[framework]) and cls.__name__ in book.kinds[framework]:
            forward = _FORWARD[framework]
            own = getattr(type(module), forward, None) is getattr(cls, forward, None)
            return book.kinds[framework][cls.__name__], qualname(cls), "class" if own else "subclass"
    for cls in mro:
        if not cls.__module__.startswith(_ROOTS[framework]) and cls.__name__ in book.by_name:
            return book.by_name[cls.__name__], qualname(cls), "name"
    return None


def _numpy(tensor: Any) -> np.ndarray:
    if hasattr(tensor, "detach"):
        tensor = tensor.detach().cpu()
        return (tensor.float() if str(tensor.dtype) == "torch.bfloat16" else tensor).numpy()
    if str(tensor.dtype) == "BFloat16":
        import mindspore as ms

        tensor = tensor.astype(ms.float32)
    return tensor.asnumpy()


def _dtype_name(dtype: Any) -> str:
    text = str(dtype).lower().replace("torch.", "")
    return {"float": "float32", "half": "float16"}.get(text, text)


def _children(model: Any, framework: Framework) -> list[tuple[str, Any]]:
    if framework == Framework.PYTORCH:
        return list(model.named_modules())
    return list(model.cells_and_names())


def _own_params(module: Any, framework: Framework) -> dict[str, Any]:
    if framework == Framework.PYTORCH:
        return dict(module.named_parameters(recurse=False))
    return {name: p for name, p in module.parameters_and_names(expand=False)}


def _compute_dtype(module: Any, framework: Framework, kind: str, params: dict[str, Any], book: RuleBook) -> str | None:
    """The precision the layer computes in: its parameters' dtype, or MindSpore's to_float / amp cast of the cell."""
    if framework == Framework.MINDSPORE:
        mixed = getattr(module, "mixed_precision_type", None)
        name = getattr(mixed, "name", "")
        if name in ("FP16", "BF16", "FP32"):
            return {"FP16": "float16", "BF16": "bfloat16", "FP32": "float32"}[name]
        if kind in book.amp_o1_float16 and type(module).__name__.endswith("Opt") \
                and "Opt_" in type(module).__module__:
            return "float16"
    floats = [_dtype_name(p.dtype) for p in params.values() if "float" in _dtype_name(p.dtype)]
    return floats[0] if floats else None


def collect(model: Any, framework: Framework, book: RuleBook) -> list[Layer]:
    """The model's layers of known kinds, in definition order."""
    out = []
    for i, (path, module) in enumerate(_children(model, framework)):
        found = kind_of(module, framework, book)
        if found is None:
            continue
        kind, base, how = found
        own = _own_params(module, framework)
        own = {leaf.rpartition(".")[2]: p for leaf, p in own.items() if p is not None}
        layer = Layer(path, kind, base, module, order=i,
                      dtype=_compute_dtype(module, framework, kind, own, book), recognised=how)
        for leaf, p in own.items():
            layer.params[neutral_leaf(leaf)] = _numpy(p)
            layer.leaves[neutral_leaf(leaf)] = leaf
            layer.tensors[neutral_leaf(leaf)] = p
        out.append(layer)
    return out


def per_call(layer: Layer) -> list[Layer]:
    """One entry per traced call, each with that call's order and input shape: a layer object called k times (mindcv's
    one `relu` after every conv) stands for k layers of the other side, one per call, when the two are paired."""
    if len(layer.calls) < 2:
        return [layer]
    return [dataclasses.replace(layer, order=order, input_shape=shape, call=n)
            for n, (order, shape) in enumerate(layer.calls)]


def _to_tensors(inputs: dict[str, np.ndarray], framework: Framework) -> dict[str, Any]:
    if framework == Framework.PYTORCH:
        import torch

        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in inputs.items()}
    import mindspore as ms

    return {k: ms.Tensor(np.ascontiguousarray(v)) for k, v in inputs.items()}


def _first_shape(args: Any) -> tuple[int, ...] | None:
    for a in args if isinstance(args, (tuple, list)) else (args,):
        if hasattr(a, "shape"):
            return tuple(int(d) for d in a.shape)
    return None


def trace(model: Any, framework: Framework, layers: list[Layer], inputs: dict[str, np.ndarray],
          positional: bool) -> None:
    """Run one forward pass on the example inputs, recording each layer's calls (order among all calls, input
    shape); the model's running statistics are put back afterwards, so the audit leaves the model as it found it."""
    by_module = {id(layer.module): layer for layer in layers}
    calls: dict[int, list[tuple[int, tuple[int, ...] | None]]] = {}
    counter = itertools.count()

    def pre(module: Any, args: Any) -> None:
        if id(module) in by_module:
            calls.setdefault(id(module), []).append((next(counter), _first_shape(args)))

    tensors = _to_tensors(inputs, framework)
    args, kwargs = (list(tensors.values()), {}) if positional else ([], tensors)
    handles = [layer.module.register_forward_pre_hook(pre) for layer in layers]
    saved = _save_state(model, framework)
    try:
        if framework == Framework.PYTORCH:
            import torch

            with torch.no_grad():
                model(*args, **kwargs)
        else:
            model(*args, **kwargs)
    except Exception as exc:  # the model's own error for this input: one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        shapes = ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in inputs.items())
        raise AlignerError(f"the {framework.value} model rejects the example input ({shapes}): "
                           f"{type(exc).__name__}: {first}") from None
    finally:
        for handle in handles:
            handle.remove()
        _restore_state(model, framework, saved)
    total = sum(len(c) for c in calls.values())
    for layer in layers:
        if id(layer.module) in calls:
            layer.calls = tuple(calls[id(layer.module)])
            layer.order, layer.input_shape = layer.calls[0]
        else:
            layer.order = total + layer.order   # not called: after every call, in definition order
            layer.called = False


def _save_state(model: Any, framework: Framework) -> dict[str, Any]:
    if framework == Framework.PYTORCH:
        return {name: b.detach().clone() for name, b in model.named_buffers()}
    return {name: p.asnumpy().copy() for name, p in model.parameters_and_names() if not p.requires_grad}


def _restore_state(model: Any, framework: Framework, saved: dict[str, Any]) -> None:
    if framework == Framework.PYTORCH:
        buffers = dict(model.named_buffers())
        for name, value in saved.items():
            buffers[name].data.copy_(value)
        return
    import mindspore as ms

    params = dict(model.parameters_and_names())
    for name, value in saved.items():
        params[name].set_data(ms.Tensor(value))
