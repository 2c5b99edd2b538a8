"""The two sides of a doctor run: each factory called once (a spec resolved as `align audit` resolves it, or a
callable), what it returned unpacked, and the models run on the example inputs in their own framework."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.io.factory import load_factory, model_framework
from aligner.pipelines.audit.optsides import optimizer_framework, scheduler_framework
from aligner.pipelines.doctor.result import Sides

Factory = str | Callable[[], Any]


@dataclasses.dataclass
class Side:
    """One framework's model and what came with it (live objects: mutable, used by the stages in turn)."""

    framework: Framework
    spec: str | None
    model: Any
    optimizer: Any = None
    scheduler: Any = None
    loss_fn: Callable[[Any], Any] | None = None


def _name(factory: Factory) -> str:
    return repr(factory) if isinstance(factory, str) else getattr(factory, "__qualname__", type(factory).__name__)


def _spec(factory: Factory) -> str | None:
    """The MODULE:CALLABLE spec that reruns a factory by hand: given, or read from an importable callable."""
    if isinstance(factory, str):
        return factory
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if module and module != "__main__" and qualname.isidentifier() and not module.startswith("_aligner_factory_"):
        return f"{module}:{qualname}"
    return None


def _unpack(made: Any, label: str) -> tuple[Any, Any, Any, Any]:
    """(model, optimizer, scheduler, loss_fn) from a model or a (model, optimizer[, scheduler][, loss_fn]) tuple."""
    if not isinstance(made, tuple):
        return made, None, None, None
    if not 2 <= len(made) <= 4:
        raise AlignerError(f"factory {label} returned a tuple of {len(made)}; expected a model or (model, optimizer"
                           "[, scheduler][, loss_fn])")
    model, optimizer, *rest = made
    if optimizer is not None and optimizer_framework(optimizer) is None:
        raise AlignerError(f"factory {label} returned a {type(optimizer).__name__} as the optimizer, not a "
                           "torch.optim.Optimizer or a MindSpore optimizer")
    scheduler = loss_fn = None
    for item in rest:
        if item is not None and scheduler_framework(item) is not None and scheduler is None and loss_fn is None:
            scheduler = item
        elif callable(item) and loss_fn is None:
            loss_fn = item
        elif item is not None:
            raise AlignerError(f"factory {label} returned a {type(item).__name__} after the optimizer: expected a "
                               "learning-rate scheduler, then a loss function (output -> scalar)")
    return model, optimizer, scheduler, loss_fn


def build_side(factory: Factory) -> Side:
    """Call the factory once (a spec is imported first) and check it returned one model of either framework."""
    label = _name(factory)
    func = load_factory(factory) if isinstance(factory, str) else factory
    if not callable(func):
        raise AlignerError(f"factory {label} is not callable: give MODULE:CALLABLE, FILE.py:CALLABLE or a function")
    try:
        made = func()
    except Exception as exc:  # the user's code: one line, whatever it raised
        raise AlignerError(f"factory {label} raised {type(exc).__name__}: {exc}") from None
    model, optimizer, scheduler, loss_fn = _unpack(made, label)
    framework = model_framework(model)
    if framework is None:
        raise AlignerError(f"factory {label} returned {type(model).__name__}, not a torch.nn.Module or "
                           "mindspore.nn.Cell (or a (model, optimizer[, scheduler][, loss_fn]) tuple)")
    if optimizer is not None and optimizer_framework(optimizer) != framework:
        raise AlignerError(f"factory {label} returned a {framework.value} model with a "
                           f"{optimizer_framework(optimizer)} optimizer")
    return Side(framework, _spec(factory), model, optimizer, scheduler, loss_fn)


def build_sides(make_torch: Factory, make_ms: Factory) -> tuple[Side, Side]:
    """(torch side, MindSpore side): one model of each framework, in either order (as `align audit` takes them)."""
    a, b = build_side(make_torch), build_side(make_ms)
    if a.framework == b.framework:
        raise AlignerError(f"both factories ({_name(make_torch)}, {_name(make_ms)}) returned {a.framework.value} "
                           "models: give one torch.nn.Module and one mindspore.nn.Cell")
    return (a, b) if a.framework is Framework.PYTORCH else (b, a)


def _class(obj: Any) -> str | None:
    return None if obj is None else type(obj).__name__


def parameter_count(side: Side) -> int:
    """Elements in the model's parameters (torch: parameters(); MindSpore: trainable and not, as its checkpoint)."""
    if side.framework is Framework.PYTORCH:
        return sum(p.numel() for p in side.model.parameters())
    return sum(math.prod(p.shape) for p in side.model.get_parameters())


def describe(sides: tuple[Side, Side]) -> Sides:
    return Sides(specs=(sides[0].spec, sides[1].spec), classes=(_class(sides[0].model) or "", _class(sides[1].model)
                                                                 or ""),
                 optimizers=(_class(sides[0].optimizer), _class(sides[1].optimizer)),
                 schedulers=(_class(sides[0].scheduler), _class(sides[1].scheduler)),
                 loss_fns=(_class(sides[0].loss_fn), _class(sides[1].loss_fn)),
                 parameters=(parameter_count(sides[0]), parameter_count(sides[1])))


def split_inputs(inputs: Any) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """(positional, keyword) arrays: an array, a sequence of them, or a mapping of keyword ones (None: none)."""
    if inputs is None:
        return [], {}
    if isinstance(inputs, Mapping):
        return [], {str(k): np.asarray(v) for k, v in inputs.items()}
    if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)):
        return [np.asarray(v) for v in inputs], {}
    return [np.asarray(inputs)], {}


def tensors(framework: Framework, inputs: tuple[list[np.ndarray], dict[str, np.ndarray]]
            ) -> tuple[list[Any], dict[str, Any]]:
    """The inputs as that framework's tensors (dtypes kept)."""
    args, kwargs = inputs
    if framework is Framework.PYTORCH:
        import torch

        def make(a: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(a))
    else:
        import mindspore as ms

        def make(a: np.ndarray) -> Any:
            return ms.Tensor(np.ascontiguousarray(a))
    return [make(a) for a in args], {k: make(v) for k, v in kwargs.items()}


def run_model(side: Side, inputs: tuple[list[np.ndarray], dict[str, np.ndarray]]) -> Any:
    """One forward of the model on the inputs (torch without autograd); the model rejecting them is one line."""
    args, kwargs = tensors(side.framework, inputs)
    try:
        if side.framework is Framework.PYTORCH:
            import torch

            with torch.no_grad():
                return side.model(*args, **kwargs)
        return side.model(*args, **kwargs)
    except Exception as exc:  # the user's model: one line naming the side and the inputs it rejected
        shapes = ", ".join([str(list(a.shape)) for a in inputs[0]] + [f"{k}={list(v.shape)}"
                                                                      for k, v in inputs[1].items()])
        raise AlignerError(f"the {side.framework.value} model rejected the inputs ({shapes}): "
                           f"{type(exc).__name__}: {exc}") from None
