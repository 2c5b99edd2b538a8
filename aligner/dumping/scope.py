"""What an op-level dump (`aligner.dump(ops=True, scope=...)`) records, shared by both frameworks' op hooks: the
scope module check, the source line of the model code that called an op, and the records of one op call."""
from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aligner.core.errors import AlignerError
from aligner.dumping.manifest import Kind
from aligner.dumping.options import Options
from aligner.dumping.session import Session
from aligner.dumping.signature import describe
from aligner.dumping.tensors import tensors_in

_ALIGNER_DIR = str(Path(__file__).parents[1]) + "/"
# In-place operator methods: the tensor they modify is the op's output.
INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                             "__imod__", "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                             "__irshift__"})


def check_scope(scope: str | None, paths: Iterable[str], model_type: str) -> None:
    """Raise a one-line AlignerError when `scope` names no module path of the model ("" and None: the whole model),
    listing the nearest paths."""
    if not scope:
        return
    names = [p for p in paths if p]
    if scope in names:
        return
    if not names:
        raise AlignerError(f"aligner.dump scope={scope!r}: {model_type} has no submodules; "
                           "leave scope out to record the ops of the whole model")
    nearest = difflib.get_close_matches(scope, names, n=3, cutoff=0.0)
    raise AlignerError(f"aligner.dump scope={scope!r} names no module of {model_type}; nearest: "
                       + ", ".join(repr(n) for n in nearest))


def framework_dir(module: Any) -> str:
    """The installation folder of a framework package (its frames are the framework's internals)."""
    return str(Path(module.__file__).parent) + "/"


def inplace(name: str) -> bool:
    """Whether a method name modifies its tensor (`add_`, `__iadd__`, `__setitem__`)."""
    return name in INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_"))


class OpRecorder:
    """Records op calls inside the scope module's forward: inputs (links to earlier records, or data), outputs, the
    innermost running module as `module`/`parent`, and the calling model code as `source`."""

    def __init__(self, session: Session, opts: Options, framework_dirs: tuple[str, ...], hook_file: str) -> None:
        self.session, self.opts = session, opts
        self.scope = opts.scope or ""
        self.skip_dirs = framework_dirs
        self.own_files = (__file__, hook_file)  # frames of the op hooks themselves

    def active(self) -> bool:
        """Whether an op called now is recorded: the context is open and the scope module's forward is running."""
        return self.session.open and self.session.inside(self.scope)

    def source(self) -> str | None:
        """'file.py:line' of the innermost frame outside the op hooks, the frameworks and aligner; None when the
        first frame outside the hooks and frameworks is aligner's own (module hooks call tensor methods too)."""
        frame = sys._getframe(1)
        while frame is not None:
            file = frame.f_code.co_filename
            if file not in self.own_files and not file.startswith(self.skip_dirs):
                return None if file.startswith(_ALIGNER_DIR) else f"{file}:{frame.f_lineno}"
            frame = frame.f_back  # type: ignore[assignment]
        return None

    def call(self, fn: Callable[..., Any], label: str, args: tuple, kwargs: dict, modifies: bool) -> Any:
        """Run `fn(*args, **kwargs)` and record it as op `label`; `modifies`: an in-place op, whose inputs are
        recorded before it runs and whose modified tensor is its output. A call returning no tensor (a size, a
        flag) leaves no record."""
        source = self.source()
        if source is None:
            return fn(*args, **kwargs)
        session = self.session
        parent = session.parent() or ""
        given = list(tensors_in((args, kwargs)))
        call = self._inputs(label, given, parent, source, (args, kwargs)) if modifies else None
        result = fn(*args, **kwargs)
        outputs = list(tensors_in(result)) or (given[:1] if modifies else [])
        if not outputs:
            return result
        if call is None:
            call = self._inputs(label, given, parent, source, (args, kwargs))
        for i, t in enumerate(outputs):
            session.emit_output(parent, label, Kind.OP, i, t, call=call, parent=parent, source=source)
        return result

    def _inputs(self, label: str, tensors: list[Any], parent: str, source: str, given: tuple[tuple, dict]) -> int:
        """A fresh call id, after recording the call's signature (its non-tensor arguments: an eps, an approximate
        mode, which a verdict blaming the op names when they differ) and its input tensors (unless inputs=False)."""
        call = self.session.new_call()
        places: list[str | None] = [None] * len(tensors)
        if self.opts.calls:
            structure, found = describe(tuple(given[0]), dict(given[1]))
            if len(found) == len(tensors):  # (the same walk; a tensor inside an object it does not open: no names)
                places = list(found)
            self.session.emit_call(parent, label, call=call, parent=parent, args=structure, attrs=None)
        if self.opts.inputs is not False:
            for i, t in enumerate(tensors):
                self.session.emit_input(parent, label, Kind.OP, i, t, call=call, parent=parent,
                                        link=self.opts.inputs is None, source=source, arg=places[i])
        return call
