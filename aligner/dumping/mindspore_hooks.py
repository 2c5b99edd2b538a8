"""MindSpore capture (PyNative mode): Cell forward hooks, tensor gradient hooks and Parameter gradient hooks.

Gradients are taken without `Cell.register_backward_hook`: MindSpore 2.10 runs a cell backward hook from the Python
thread, which then spins waiting for the backend (a resnet18 step's floor cost 1.3-1.7x a plain step on 2 cores,
docs/scale-mindspore.md). Instead, for each cell whose gradients are recorded:

* grad_output: `Tensor.register_hook` on each output, registered in the forward hook: it sees the gradient with respect
  to the value the cell returned. A call returning several outputs hands on a copy of each, hooked: a hook on one of
  its own outputs would also see what flows back through the cell's use of it (`return y, y.sum()`);
* grad_input: the forward pre-hook hands the cell `ops.deepcopy` of each input that gradients flow through (a
  floating tensor that requires grad); a hook on the copy sees only this cell's share of the input's gradient (the
  same tensor read by two cells gets two copies). A copy is an op queued like any other; a view would wait for the op
  that writes its input (MindSpore builds views from the storage at once). The session is told that each copy holds
  its input's numbers (`Session.same_tensors`), so what the cell's own code does with it links to the input's record.
  An int tensor, a mask without a gradient path, or a forward outside `mindspore.grad` gets no copy (a hook cannot be
  registered on a tensor that does not require grad). In-place ops in a cell change the copy, as the cell backward
  hook's own copy did: the gradient, loss and parameter gradients equal the cell backward hook's (tests/dumping);
* param_grad: `Parameter.register_hook`, which sees each parameter's gradient when `mindspore.value_and_grad` /
  `mindspore.grad` differentiates the network, so the user's training step needs no change.

A cell's grad_output records come before its parameters' gradients and its grad_input records after them, as torch's
hooks order them (a cell backward hook gave all of them at once, after the parameters'); several outputs' or inputs'
records of one call come in the order autograd reaches them, as in torch. A cell handing its (copied) input back
(Dropout with p=0) records its grad_output first (`_Call`). Cells come in the cell backward hooks' order.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, Callable

import mindspore as ms

from aligner.core.errors import AlignerError
from aligner.dumping.calls import CallHooks
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.options import Options
from aligner.dumping.session import Session
from aligner.dumping.tensors import map_tensors, tensors_in

_copy = ms.ops.deepcopy  # bound at import: ops=True wraps ms.ops' functions while a dump runs
# dtypes a gradient flows through (an int tensor or a mask gets no copy: MindSpore gives it no gradient)
_FLOATING = frozenset({ms.float16, ms.float32, ms.float64, ms.bfloat16, ms.complex64, ms.complex128})


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


def differentiable(tensor: ms.Tensor) -> bool:
    """Whether a gradient can reach `tensor` (reading its dtype and flag waits for no op)."""
    return tensor.dtype in _FLOATING and bool(getattr(tensor, "_requires_grad", False))


def _differentiable_outputs(output: Any) -> list[tuple[int, ms.Tensor]]:
    """(position among the output's tensors, tensor) of each output tensor a gradient can reach."""
    return [(i, t) for i, t in enumerate(tensors_in(output)) if isinstance(t, ms.Tensor) and differentiable(t)]


class _Call:
    """One call's gradient hooks in flight: which inputs' copies the cell handed back as outputs, and an input's
    gradient held until that output's own hook has recorded its grad_output (both hooks see the same gradient)."""

    def __init__(self) -> None:
        self.copies: list[tuple[int, ms.Tensor]] = []  # (input index, its copy)
        self.handed: dict[int, int] = {}  # id of a copy handed back -> its hooks not run yet
        self.held: dict[int, tuple[int, ms.Tensor]] = {}  # id of a handed-back copy -> (input index, gradient)


class _CellHooks(CallHooks):
    """The forward pre-hook and forward hook of one cell, and the tensor hooks that take its gradients."""

    def __init__(self, path: str, cell: ms.nn.Cell, session: Session, opts: Options, is_leaf: bool) -> None:
        super().__init__(path, cell, session, opts, is_leaf, _buffers)
        self.calls: list[_Call] = []  # stack: re-entrant calls

    def pre(self, cell: ms.nn.Cell, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        frame = self.enter((args, kwargs))  # the inputs themselves: links to their producers by identity
        if not self.grads:
            return None
        call = _Call()
        self.calls.append(call)
        try:
            return self._copied(args, kwargs, call)
        except Exception as exc:  # the cell runs on its own inputs, without grad_input records
            call.copies.clear()
            self.session.failed(self.path, self.type, Kind.BACKWARD, Io.GRAD_INPUT, exc, call=frame.call,
                                parent=self.session.parent(frame))
            return None

    def _copied(self, args: tuple, kwargs: dict, call: _Call) -> tuple[tuple, dict] | None:
        """The call's arguments with a copy of each input a gradient can reach, hooked before the cell runs (an
        in-place op in the cell then leaves the hook on the value it was given); None when no input is."""

        def hooked(index: int, c: ms.Tensor) -> bool:
            if not getattr(c, "_requires_grad", False):  # a forward outside mindspore.grad: nothing to hook
                return False
            token = self.session.handed_input(c, self.path, self.type, index) if self.session.open else None
            c.register_hook(functools.partial(self._input_grad, call, index, id(c), token))
            call.copies.append((index, c))
            return True

        new_args, new_kwargs = self._swapped((args, kwargs), hooked)
        return (new_args, new_kwargs) if call.copies else None

    def post(self, cell: ms.nn.Cell, args: tuple, kwargs: dict, output: Any) -> Any:
        self.exit(cell, output)
        if not self.grads:
            return None
        call = self.calls.pop() if self.calls else _Call()
        copies = {id(c) for _, c in call.copies}
        handed_on = None
        try:
            outs = _differentiable_outputs(output)
            if len(outs) > 1:  # one output may be computed from another: hand on copies (see `_copied_outputs`)
                handed_on = output = self._copied_outputs(output)
                outs = _differentiable_outputs(output)
            for i, t in outs:
                if id(t) in copies:  # an input handed back: its grad_output goes first (`_input_grad`)
                    call.handed[id(t)] = call.handed.get(id(t), 0) + 1
                t.register_hook(functools.partial(self._output_grad, call, i, id(t)))
        except Exception as exc:  # a hook never breaks the forward it records
            self.session.failed(self.path, self.type, Kind.BACKWARD, Io.GRAD_OUTPUT, exc)
        call.copies.clear()  # the hooks hold what they need; the copies live as long as the graph does
        return handed_on

    def _copied_outputs(self, output: Any) -> Any:
        """`output` with a copy of each tensor a gradient can reach. A hook on an output tensor sees its whole
        gradient, which includes what flows back through the cell's own use of it (`return y, y.sum()`: the second
        output's share); a hook on a copy sees only the gradient from outside, as a cell backward hook does. A call
        with one such output needs no copy: the cell's own use of it leads nowhere a gradient comes from."""
        return self._swapped(output, lambda index, c: True)

    def _swapped(self, obj: Any, keep: Callable[[int, ms.Tensor], bool]) -> Any:
        """`obj` with each tensor a gradient can reach replaced by a copy, where `keep(flat index, copy)` says so
        (in `tensors_in` order); the session learns that each copy kept holds its original's numbers."""
        position = itertools.count()
        originals: list[ms.Tensor] = []
        copies: list[ms.Tensor] = []

        def copy(t: ms.Tensor) -> ms.Tensor:
            index = next(position)
            if not differentiable(t):
                return t
            c = _copy(t)
            if not keep(index, c):
                return t
            originals.append(t)
            copies.append(c)
            return c

        swapped = map_tensors(copy, obj)
        if self.session.open:
            self.session.same_tensors(originals, copies)
        return swapped

    def _output_grad(self, call: _Call, index: int, key: int, grad: ms.Tensor | None) -> None:
        self.emit_grad(Io.GRAD_OUTPUT, index, grad)
        if key in call.handed:
            call.handed[key] -= 1
            if not call.handed[key]:
                del call.handed[key]
                if key in call.held:
                    self.emit_grad(Io.GRAD_INPUT, *call.held.pop(key))

    def _input_grad(self, call: _Call, index: int, key: int, token: int | None, grad: ms.Tensor | None) -> None:
        """A copy's gradient: held while the same tensor, handed back, waits for its grad_output hook (registered
        after this one, it runs after it unless an in-place op in the cell made the output a later node); a copy the
        cell wrote into in place gets a record saying so instead (`Session.written_input`)."""
        written = self.session.written_input(token) if token is not None and self.session.open else None
        if written is not None:
            self.session.failed(self.path, self.type, Kind.BACKWARD, Io.GRAD_INPUT, written, index=index)
            call.handed.pop(key, None)
            return
        if key in call.handed:
            call.held[key] = (index, grad)
        else:
            self.emit_grad(Io.GRAD_INPUT, index, grad)


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
