"""What replay does in each framework: turn recorded arrays into tensors, find a submodule by path, call it, and pull
a vector-Jacobian product back through it. torch and MindSpore are imported inside the functions (`align --help`
stays fast)."""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from aligner.core.dtypes import FLOATING, canonical, contiguous, numpy_to_torch, to_numpy
from aligner.core.frameworks import Framework
from aligner.dumping.calls import BUFFERS
from aligner.dumping.tensors import tensors_in, to_host


class Runner(Protocol):
    """One framework's side of a replay."""

    framework: Framework

    def tensor(self, array: np.ndarray, dtype: str) -> Any: ...

    def dtype(self, name: str) -> Any: ...

    def modules(self, model: Any) -> dict[str, Any]: ...

    def forward(self, module: Any, args: list[Any], kwargs: dict[str, Any]) -> list[np.ndarray]: ...

    def backward(self, module: Any, args: list[Any], kwargs: dict[str, Any], inputs: list[int],
                 grads: list[np.ndarray | None]) -> dict[int, np.ndarray]: ...

    def buffers(self, module: Any) -> dict[str, Any]: ...

    def set_training(self, module: Any, training: bool) -> bool: ...

    def state(self, model: Any) -> list[tuple[Any, np.ndarray]]: ...

    def assign(self, target: Any, value: np.ndarray) -> None: ...


def put_back(run: Runner, saved: list[tuple[Any, np.ndarray]]) -> None:
    """Put back what `Runner.state` saved (a replay in training mode updates running statistics)."""
    for target, value in saved:
        run.assign(target, value)


def _host(output: Any) -> list[np.ndarray]:
    return [to_host(t) for t in tensors_in(output)]


class TorchRunner:
    framework = Framework.PYTORCH

    def tensor(self, array: np.ndarray, dtype: str) -> Any:
        return numpy_to_torch(np.asarray(array, to_numpy(dtype)))

    def dtype(self, name: str) -> Any:
        import torch

        return getattr(torch, canonical(name))

    def modules(self, model: Any) -> dict[str, Any]:
        return dict(model.named_modules())

    def forward(self, module: Any, args: list[Any], kwargs: dict[str, Any]) -> list[np.ndarray]:
        import torch

        with torch.no_grad():
            return _host(module(*args, **kwargs))

    def backward(self, module: Any, args: list[Any], kwargs: dict[str, Any], inputs: list[int],
                 grads: list[np.ndarray | None]) -> dict[int, np.ndarray]:
        import torch

        tensors = list(tensors_in((args, kwargs)))
        wanted = [i for i in inputs if canonical(tensors[i].dtype) in FLOATING]
        for i in wanted:
            tensors[i].requires_grad_(True)
        outputs = [t for t in tensors_in(module(*args, **kwargs))]
        pairs = [(o, torch.from_numpy(contiguous(np.asarray(g, np.float32))).to(o.dtype))
                 for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        if not pairs or not wanted:
            return {}
        got = torch.autograd.grad([o for o, _ in pairs], [tensors[i] for i in wanted], [g for _, g in pairs],
                                  allow_unused=True)
        return {i: to_host(g) for i, g in zip(wanted, got) if g is not None}

    def set_training(self, module: Any, training: bool) -> bool:
        previous = bool(module.training)
        module.train(training)
        return previous

    def buffers(self, module: Any) -> dict[str, Any]:
        import torch

        return {BUFFERS[n]: t for n in ("running_mean", "running_var")
                if isinstance(t := getattr(module, n, None), torch.Tensor)}

    def state(self, model: Any) -> list[tuple[Any, np.ndarray]]:
        return [(b, to_host(b)) for b in model.buffers()]

    def assign(self, target: Any, value: np.ndarray) -> None:
        import torch

        with torch.no_grad():
            target.copy_(self.tensor(value, canonical(value.dtype)))


class MindSporeRunner:
    framework = Framework.MINDSPORE

    def tensor(self, array: np.ndarray, dtype: str) -> Any:
        import mindspore as ms

        if canonical(dtype) == "bfloat16":
            return ms.Tensor(np.asarray(array, np.float32)).astype(ms.bfloat16)
        return ms.Tensor(contiguous(np.asarray(array, to_numpy(dtype))))

    def dtype(self, name: str) -> Any:
        import mindspore as ms

        return getattr(ms, canonical(name))

    def modules(self, model: Any) -> dict[str, Any]:
        return dict(model.cells_and_names())

    def forward(self, module: Any, args: list[Any], kwargs: dict[str, Any]) -> list[np.ndarray]:
        return _host(module(*args, **kwargs))

    def backward(self, module: Any, args: list[Any], kwargs: dict[str, Any], inputs: list[int],
                 grads: list[np.ndarray | None]) -> dict[int, np.ndarray]:
        import mindspore as ms

        tensors = list(tensors_in((args, kwargs)))
        wanted = [i for i in inputs if canonical(tensors[i].dtype) in FLOATING]
        if not wanted:
            return {}
        slots = {id(tensors[i]): k for k, i in enumerate(wanted)}

        def call(*diff: Any) -> Any:
            def put(value: Any) -> Any:  # the differentiated tensors in their places in the call
                if id(value) in slots:
                    return diff[slots[id(value)]]
                if isinstance(value, (list, tuple)):
                    return type(value)(put(v) for v in value)
                if isinstance(value, dict):
                    return {k: put(v) for k, v in value.items()}
                return value

            return module(*put(list(args)), **put(dict(kwargs)))

        outputs, pullback = ms.vjp(call, *[tensors[i] for i in wanted])
        flat = list(tensors_in(outputs))
        cotangent = [ms.Tensor(contiguous(np.asarray(g, np.float32))).astype(o.dtype) if g is not None
                     else ms.ops.zeros_like(o) for o, g in zip(flat, grads + [None] * (len(flat) - len(grads)))]
        got = pullback(cotangent[0] if not isinstance(outputs, (tuple, list)) else type(outputs)(cotangent))
        got = got if isinstance(got, (tuple, list)) else (got,)
        return {i: to_host(g) for i, g in zip(wanted, got) if g is not None}

    def set_training(self, module: Any, training: bool) -> bool:
        previous = bool(module.training)
        module.set_train(training)
        return previous

    def buffers(self, module: Any) -> dict[str, Any]:
        import mindspore as ms

        return {BUFFERS[n]: t for n in ("moving_mean", "moving_variance", "running_mean", "running_var")
                if isinstance(t := getattr(module, n, None), ms.Tensor)}

    def state(self, model: Any) -> list[tuple[Any, np.ndarray]]:
        return [(p, to_host(p)) for _, p in model.parameters_and_names() if not p.requires_grad]

    def assign(self, target: Any, value: np.ndarray) -> None:
        target.set_data(self.tensor(value, canonical(value.dtype)))


def runner(framework: str) -> Runner:
    """The runner of a framework ("pytorch" or "mindspore")."""
    return MindSporeRunner() if framework == Framework.MINDSPORE else TorchRunner()
