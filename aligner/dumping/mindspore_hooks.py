"""MindSpore capture (PyNative mode): Cell forward/backward hooks and Parameter gradient hooks.

MindSpore 2.10's `Cell.register_backward_hook(hook(cell, grad_input, grad_output))` uses torch's meaning (grad_input:
gradients with respect to the cell's inputs), and `Parameter.register_hook` sees each parameter's gradient when
`mindspore.value_and_grad` / `mindspore.grad` differentiates the network, so the user's training step needs no change.
"""
from __future__ import annotations

import functools
from typing import Any

import mindspore as ms

from aligner.core.errors import AlignerError
from aligner.dumping.calls import CallHooks
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.options import Options
from aligner.dumping.session import Session


def check_eager(model: ms.nn.Cell) -> None:
    """Refuse a model with a @mindspore.jit construct: it runs compiled as a graph, where no hook or op runs one by
    one (the hooks would be traced into the graph and fail there)."""
    for path, cell in model.cells_and_names():
        if getattr(getattr(cell, "construct", None), "__wrapped_by_jit__", False):
            raise AlignerError(f"aligner.dump records what MindSpore PyNative mode runs, but the construct of "
                               f"{path or 'the model'} ({type(cell).__name__}) is compiled by @mindspore.jit; "
                               "remove @jit while dumping to run it in PyNative mode")


def check_pynative() -> None:
    """Refuse GRAPH_MODE, where Cell hooks never run."""
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise AlignerError("aligner.dump needs MindSpore PyNative mode (Cell hooks do not run in GRAPH_MODE): call "
                           "mindspore.set_context(mode=mindspore.PYNATIVE_MODE) before building and running the model")


class _CellHooks(CallHooks):
    """The forward pre-hook, forward hook and backward hook of one cell."""

    def __init__(self, path: str, cell: ms.nn.Cell, session: Session, opts: Options, is_leaf: bool) -> None:
        super().__init__(path, cell, session, opts, is_leaf, _buffers)

    def pre(self, cell: ms.nn.Cell, args: tuple, kwargs: dict) -> None:
        self.enter((args, kwargs))

    def post(self, cell: ms.nn.Cell, args: tuple, kwargs: dict, output: Any) -> None:
        self.exit(cell, output)

    def backward(self, cell: ms.nn.Cell, grad_input: tuple, grad_output: tuple) -> None:
        if not self.session.open:
            return
        for io, grads in ((Io.GRAD_OUTPUT, grad_output), (Io.GRAD_INPUT, grad_input)):
            for i, g in enumerate(grads if isinstance(grads, (tuple, list)) else (grads,)):
                if g is not None:
                    self.session.emit_grad(self.path, self.type, io, i, g)


class _Handing:
    """Stands in for a hooked cell's backward-hook primitive while the dump runs (`remove` puts it back): MindSpore
    passes the cell's inputs and outputs through it, which hands them on as new objects on the same memory; the
    session is told which, so the next cell's input links to the record by identity, without reading its address
    (which waits for the op that writes it)."""

    def __init__(self, cell: ms.nn.Cell, session: Session) -> None:
        self.cell, self.session = cell, session
        self.primitive = cell._cell_backward_hook
        object.__setattr__(cell, "_cell_backward_hook", self)

    def __call__(self, tensors: Any) -> Any:
        handed = self.primitive(tensors)
        if self.session.open:
            self.session.same_tensors(tensors, handed)
        return handed

    def remove(self) -> None:
        object.__setattr__(self.cell, "_cell_backward_hook", self.primitive)


def _buffers(cell: ms.nn.Cell) -> list[tuple[str, Any]]:
    """The normalisation buffers of a cell (BatchNorm moving statistics, or PyTorch-named ones), if it has any."""
    return [(name, t) for name in ("moving_mean", "moving_variance", "running_mean", "running_var")
            if isinstance(t := getattr(cell, name, None), ms.Tensor)]


def install(model: ms.nn.Cell, session: Session, opts: Options, handles: list[Any]) -> None:
    """Register every hook the options ask for, appending each handle to `handles` as it is made."""
    check_pynative()
    check_eager(model)
    for path, cell in model.cells_and_names() if opts.module_hooks else ():  # every cell: the call stack
        is_leaf = next(iter(cell.cells()), None) is None
        hooks = _CellHooks(path, cell, session, opts, is_leaf)
        handles.append(cell.register_forward_pre_hook(hooks.pre, with_kwargs=True))
        handles.append(cell.register_forward_hook(hooks.post, with_kwargs=True, always_call=True))
        if opts.backward and opts.module_backward and opts.selects_module(path, is_leaf):
            handles.append(cell.register_backward_hook(hooks.backward))
            if session.by_identity and getattr(cell, "_cell_backward_hook", None) is not None:  # MindSpore 2.10's
                handles.append(_Handing(cell, session))
    if opts.backward and opts.param_grads:
        for name, param in model.parameters_and_names():
            if param.requires_grad and opts.selects_name(name):
                handles.append(param.register_hook(functools.partial(_param_grad, session, name)))


def state(model: ms.nn.Cell) -> list[tuple[str, str, ms.Tensor]]:
    """(name, "Parameter", value) for every parameter (MindSpore keeps BatchNorm statistics as Parameters too)."""
    return [(n, "Parameter", p) for n, p in model.parameters_and_names()]


def _param_grad(session: Session, name: str, grad: ms.Tensor) -> None:
    if session.open:
        session.emit(name, "Parameter", Kind.PARAM_GRAD, Io.GRAD, 0, grad)
