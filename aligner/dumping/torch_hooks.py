"""PyTorch capture: module forward hooks, tensor gradient hooks and parameter gradient hooks.

Backward capture deliberately avoids `register_full_backward_hook`, whose identity autograd Function breaks any later
in-place op on a module's output (`nn.ReLU(inplace=True)`, `out += identity` in ResNets). Instead:

* grad_output: a hook on each output tensor, registered before any later in-place op, so it sees the gradient with
  respect to the value the module returned;
* grad_input: the pre-hook hands the module a `view_as` alias of each input that requires grad (a view: no copy, no
  change to any number); a hook on the alias sees only this module's contribution to the input's gradient. When the
  module modifies that alias in place (an in-place activation), the alias's node leaves the graph, so the hook goes on
  the `CopySlices` node autograd inserts for the input's base instead (also when the input is itself a view);
* except for leaf modules that change their input in place (`inplace=True`): they get the input itself, no alias.
  An alias changed in place makes autograd rebase the input's whole storage (`CopySlices`: three copies of the
  gradient in backward, the largest hook cost on a ResNet); instead the hook goes on the node of the in-place op,
  whose first gradient is the one with respect to the input's value before it (one that leaves its input as it was
  gets a hook on the input: its whole gradient);
* an alias a module hands back untouched (`nn.Identity`, Dropout in eval mode) is swapped for the input itself by the
  forward hook, so the next module gets what it would get without hooks (a hook on a view that a later op changes in
  place never runs); its grad_input is then the gradient of that one tensor, as its grad_output, and its hooks run
  before those of the module that produced the tensor (backward order);
* param_grad: a hook on each parameter, i.e. the gradient of this backward pass before it is accumulated into `.grad`.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, Callable

import torch

from aligner.dumping.calls import CallHooks
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.options import Options
from aligner.dumping.session import Session
from aligner.dumping.tensors import map_tensors, tensors_in


class _ModuleHooks(CallHooks):
    """The pre-hook, forward hook and gradient hooks of one module."""

    def __init__(self, path: str, module: torch.nn.Module, session: Session, opts: Options, is_leaf: bool) -> None:
        super().__init__(path, module, session, opts, is_leaf, _buffers)
        self.direct = is_leaf and getattr(module, "inplace", False) is True  # its inputs get no alias
        # stack (re-entrant calls) of (input index, the alias or the input itself, its version, the input, the
        # input's node when the module was called)
        self.pending: list[list[tuple[int, torch.Tensor, int, torch.Tensor, Any]]] = []

    def pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        frame = self.enter((args, kwargs))
        if not (self.grads and torch.is_grad_enabled()):
            return None
        try:
            return self._aliased(args, kwargs)
        except Exception as exc:  # the module runs on its own inputs, without gradient records
            self.pending.append([])
            self.session.failed(self.path, self.type, Kind.BACKWARD, Io.GRAD_INPUT, exc, call=frame.call,
                                parent=self.session.parent(frame))
            return None

    def _aliased(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """The call's arguments with an alias of each input that requires grad (see the module docstring), or None
        when the module gets its inputs themselves; pushes what `post` hooks the gradients on."""
        aliases: list[tuple[int, torch.Tensor, int, torch.Tensor, Any]] = []
        position = itertools.count()  # flat index over all input tensors, as in forward input records

        def alias(t: torch.Tensor) -> torch.Tensor:
            index = next(position)
            if not t.requires_grad:
                return t
            a = t if self.direct else t.view_as(t)
            aliases.append((index, a, a._version, t, t.grad_fn))
            return a

        new_args, new_kwargs = map_tensors(alias, args), map_tensors(alias, kwargs)
        self.pending.append(aliases)
        return (new_args, new_kwargs) if aliases and not self.direct else None

    def post(self, module: torch.nn.Module, args: tuple, output: Any) -> Any:
        live = self.grads and torch.is_grad_enabled()
        aliases = self.pending.pop() if live and self.pending else []
        handed_back = {id(a): t for _, a, version, t, _ in aliases if a is not t and a._version == version}
        swapped = None
        if handed_back and any(id(o) in handed_back for o in tensors_in(output)):
            swapped = output = map_tensors(lambda o: handed_back.get(id(o), o), output)
        self.exit(module, output)
        if live:
            try:
                first = {id(t) for t in handed_back.values()} if swapped is not None else set()
                self._hook_grads(aliases, first, output)
            except Exception as exc:  # a hook never breaks the forward it records
                self.session.failed(self.path, self.type, Kind.BACKWARD, Io.GRAD_OUTPUT, exc)
        return swapped

    def _hook_grads(self, aliases: list[tuple[int, torch.Tensor, int, torch.Tensor, Any]],
                    first: set[int], output: Any) -> None:
        """Register the gradient hooks of one call: on its inputs (`aliases`) and its outputs; those of a handed-back
        input (`first`: its ids) go first (see the module docstring), so they are registered last to first."""
        for index, a, version, original, before in reversed(aliases):
            emit = functools.partial(self.emit_grad, Io.GRAD_INPUT, index)
            if id(original) in first:
                _first_hook(original, emit)
            elif a._version == version:
                a.register_hook(emit)
            elif a is original and original._base is None:  # a direct input changed in place: its own node
                _hook_op(original, before, emit)
            else:  # an alias or a view changed in place: the hook goes on the CopySlices node of the input's base
                _hook_inplace(original, emit)
        for i, t in reversed(list(enumerate(tensors_in(output)))):
            if t.requires_grad:
                emit = functools.partial(self.emit_grad, Io.GRAD_OUTPUT, i)
                if id(t) in first:
                    _first_hook(t, emit)
                else:
                    t.register_hook(emit)


def _buffers(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The normalisation buffers of a module (BatchNorm running statistics), if it has any."""
    return [(name, t) for name in ("running_mean", "running_var")
            if isinstance(t := getattr(module, name, None), torch.Tensor)]


def _first_hook(tensor: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> None:
    """Register a gradient hook on `tensor` that runs before the hooks registered on it so far."""
    earlier = list((getattr(tensor, "_backward_hooks", None) or {}).items())
    handle = tensor.register_hook(hook)
    hooks = getattr(tensor, "_backward_hooks", None)  # the dict autograd runs in insertion order (not move_to_end's)
    if isinstance(hooks, dict):  # a torch that keeps its hooks elsewhere: registration order stands
        hooks.clear()
        hooks[handle.id] = hook
        hooks.update(earlier)


def _hook_op(changed: torch.Tensor, before: Any, emit: Callable[[torch.Tensor | None], None]) -> None:
    """Record the gradient with respect to `changed`'s value before a module that did not alias it (not a view, so
    no `CopySlices`) changed it in place: the first gradient of the node of the first op in place, the one whose
    input edge leads to `before` (the input's node when the module was called). Not found within a few ops back:
    nothing is recorded."""
    node = changed.grad_fn
    for _ in range(8):
        if node is None or not node.next_functions:
            return
        if node.next_functions[0][0] is before:
            break
        node = node.next_functions[0][0]
    else:
        return

    def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
        emit(grad_inputs[0] if grad_inputs else None)

    node.register_hook(hook)


def _hook_inplace(original: torch.Tensor, emit: Callable[[torch.Tensor | None], None]) -> None:
    """Record the gradient with respect to `original`'s value before a module modified it in place (through our
    alias). Autograd rebases the whole storage: the base (`original` itself, or the tensor it is a view of -- e.g. the
    alias an earlier pass-through module such as `nn.Identity` returned) gets a `CopySlices` node whose first gradient
    is base-shaped; the part `original` covers is the module's grad_input."""
    base = original if original._base is None else original._base
    node = base.grad_fn
    if node is None:
        return
    size, stride, offset = original.size(), original.stride(), original.storage_offset() - base.storage_offset()

    def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
        grad = grad_inputs[0] if grad_inputs else None
        if grad is None or grad.shape == size:
            emit(grad)
        elif grad.shape == base.shape and grad.stride() == base.stride():
            emit(grad.as_strided(size, stride, grad.storage_offset() + offset))
        # otherwise the region of `original` cannot be located in the gradient: nothing is recorded

    node.register_hook(hook)


def install(model: torch.nn.Module, session: Session, opts: Options, handles: list[Any]) -> None:
    """Register every hook the options ask for, appending each handle to `handles` as it is made."""
    for path, module in model.named_modules() if opts.module_hooks else ():  # every module: the call stack
        hooks = _ModuleHooks(path, module, session, opts, next(module.children(), None) is None)
        handles.append(module.register_forward_pre_hook(hooks.pre, with_kwargs=True))
        handles.append(module.register_forward_hook(hooks.post, always_call=True))
    if opts.backward and opts.param_grads:
        for name, param in model.named_parameters():
            if param.requires_grad and opts.selects_name(name):
                handles.append(param.register_hook(functools.partial(_param_grad, session, name)))


def state(model: torch.nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """(name, "Parameter" | "Buffer", value) for every parameter and buffer, in state_dict order."""
    params = [(n, "Parameter", p) for n, p in model.named_parameters()]
    return params + [(n, "Buffer", b) for n, b in model.named_buffers()]


def _param_grad(session: Session, name: str, grad: torch.Tensor) -> None:
    if session.open:
        session.emit(name, "Parameter", Kind.PARAM_GRAD, Io.GRAD, 0, grad)
