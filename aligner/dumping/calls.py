"""What both frameworks' forward hooks do around one module call: the call stack, input links, output records,
normalisation buffers after a training-mode forward, and recording a module whose children never run as modules.

Every module gets these hooks (so each record knows the module whose forward called it, `parent`); only selected
modules emit. Under `leaves_only`, a module with children that are never called as modules during its call (PyTorch's
`nn.MultiheadAttention` uses its `out_proj` weights functionally) is recorded as if it were a leaf: every module whose
forward runs leaves a record.
"""
from __future__ import annotations

from typing import Any, Callable

from aligner.dumping.manifest import Io, Kind
from aligner.dumping.options import Options
from aligner.dumping.session import Frame, Session
from aligner.dumping.signature import attributes, describe
from aligner.dumping.tensors import tensors_in

# Normalisation buffers, as PyTorch and MindSpore name them, recorded after a training-mode forward under PyTorch's
# names (BatchNorm momentum changes nothing but these).
BUFFERS = {"running_mean": Io.RUNNING_MEAN, "running_var": Io.RUNNING_VAR,
           "moving_mean": Io.RUNNING_MEAN, "moving_variance": Io.RUNNING_VAR}


class CallHooks:
    """Forward pre/post hook bodies for one module; the framework modules wire them to their hook APIs."""

    def __init__(self, path: str, module: Any, session: Session, opts: Options, is_leaf: bool,
                 buffers: Callable[[Any], list[tuple[str, Any]]]) -> None:
        self.path, self.type, self.session, self.opts = path, type(module).__name__, session, opts
        self.selected = opts.forward and opts.selects_module(path, is_leaf)
        # a non-leaf that leaves_only skips, recorded anyway when no record is made during its call
        self.fallback = opts.forward and not is_leaf and opts.leaves_only and opts.selects_name(path)
        self.buffers = buffers
        self.module = module
        self.described = False  # the module's attributes go on its first call record of the step
        self.frames: list[tuple[Frame, list[Any]]] = []  # stack: re-entrant calls
        self.grads = opts.backward and opts.module_backward and opts.selects_module(path, is_leaf)  # its gradients

    def emit_grad(self, io: Io, index: int, grad: Any) -> None:
        """Record one gradient of this module (nothing once the dump context has exited, or for no gradient)."""
        if grad is not None and self.session.open:
            self.session.emit_grad(self.path, self.type, io, index, grad)

    def enter(self, inputs: Any) -> Frame:
        """Push the call; record its inputs (links, or data for those no recorded call returned)."""
        session = self.session
        outermost = not session.stack
        frame = session.enter(self.path)
        kept: list[Any] = []
        if (self.selected or (outermost and self.opts.selects_name(self.path))) and self.opts.inputs is not False:
            # the model's own inputs are always recorded: a divergence there is in the data, not in any module
            self._guarded(frame, Io.INPUT, self._inputs, frame, inputs)
            frame.first_seq = session.seq  # what the children record starts here
        elif self.fallback:
            kept = [inputs]  # references only: recorded at exit if nothing inside was
            if self.opts.inputs is not False:
                self._observed(frame, Io.INPUT, inputs)
                frame.first_seq = session.seq
        if self.opts.forward:  # what enters a call was computed by its caller, unless known to come from elsewhere
            caller = session.parent(frame)
            for t in tensors_in(inputs):
                session.computed_in(t, caller)
        self.frames.append((frame, kept))
        return frame

    def _inputs(self, frame: Frame, inputs: tuple[tuple, dict]) -> None:
        """The call's signature, then each input tensor (a link or its data) with its place in the call."""
        parent = self.session.parent(frame)
        args, kwargs = inputs
        structure, places = describe(tuple(args), dict(kwargs))
        if self.opts.calls:
            self.session.emit_call(self.path, self.type, call=frame.call, parent=parent, args=structure,
                                   attrs=None if self.described else attributes(self.module))
            self.described = True
        for i, t in enumerate(tensors_in(inputs)):
            self.session.emit_input(self.path, self.type, Kind.FORWARD, i, t, call=frame.call, parent=parent,
                                    link=self.opts.inputs is None, arg=places[i])

    def exit(self, module: Any, output: Any) -> None:
        """Record the call's outputs (and BatchNorm buffers in training mode), then pop it."""
        if not self.frames:
            return
        frame, kept = self.frames.pop()
        session = self.session
        try:
            self._guarded(frame, Io.OUTPUT, self._outputs, frame, kept, module, output)
        finally:
            session.leave(frame)

    def _outputs(self, frame: Frame, kept: list[Any], module: Any, output: Any) -> None:
        """The call's outputs (and its inputs, for a non-leaf recorded as a leaf), then BatchNorm buffers."""
        session = self.session
        if self.selected or (self.fallback and session.seq == frame.first_seq):
            if not self.selected and kept and self.opts.inputs is not False:
                self._inputs(frame, kept[0])
            parent = session.parent(frame)
            for i, t in enumerate(tensors_in(output)):
                session.emit_output(self.path, self.type, Kind.FORWARD, i, t, call=frame.call, parent=parent)
            if getattr(module, "training", False):
                for name, value in self.buffers(module):
                    session.emit(self.path, self.type, Kind.BUFFER, BUFFERS[name], 0, value, call=frame.call,
                                 parent=parent)
        elif self.opts.forward:  # outputs not recorded: a later input made of them was computed by this module's code
            if self.fallback:
                self._observed(frame, Io.OUTPUT, output)
            for t in tensors_in(output):
                session.computed_in(t, self.path)

    def _observed(self, frame: Frame, io: Io, tensors: Any) -> None:
        """A block's (a module with children, under `leaves_only`) inputs or outputs as links or statistics; an
        input with its place in the call, so the two sides' keyword arguments pair by name."""
        parent = self.session.parent(frame)
        places = describe(tuple(tensors[0]), dict(tensors[1]))[1] if io == Io.INPUT else None
        for i, t in enumerate(tensors_in(tensors)):
            self.session.observe(self.path, self.type, io, i, t, call=frame.call, parent=parent,
                                 arg=places[i] if places is not None else None)

    def _guarded(self, frame: Frame, io: Io, record: Callable[..., None], *args: Any) -> None:
        """Run `record(*args)`; an exception it meets becomes a skipped record of this call (`Session.failed`), never
        one raised into the user's forward."""
        try:
            record(*args)
        except Exception as exc:  # a hook never breaks the forward it records
            self.session.failed(self.path, self.type, Kind.FORWARD, io, exc, call=frame.call,
                                parent=self.session.parent(frame))
