"""The dump context behind `aligner.dump` and `aligner.save` (re-exported by aligner.dumping).

    with aligner.dump(model, "dumps_pt/", step=step, steps=[0, 1]):
        loss = loss_fn(model(x), y)
        loss.backward()                 # MindSpore: grads = value_and_grad(...)(x, y) inside the context

See docs/dumping.md for the options and docs/dump-format.md for the on-disk format (aligner/dumping/manifest.py).
"""
from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.core.progress import SILENT, Progress
from aligner.dumping import ranks
from aligner.dumping.directory import DumpDir, claim
from aligner.dumping.manifest import Io, Kind
from aligner.dumping.options import Options
from aligner.dumping.randomness import pinned
from aligner.dumping.session import Session, activate, active
from aligner.dumping.tensors import framework_version, model_framework
from aligner.dumping.writer import BackgroundWriter, MemorySink, StatsSink

__all__ = ["dump", "save", "DumpContext", "MemoryCapture"]


def _install(framework: str, model: Any, session: Session, opts: Options, handles: list[Any]) -> None:
    """Register the hooks into `handles` as they are made, so a failure part-way removes the ones already there."""
    if framework == Framework.MINDSPORE:
        from aligner.dumping import inplace_mindspore
        from aligner.dumping import mindspore_hooks as hooks
        from aligner.dumping import ops_mindspore as op_hooks

        if session.by_identity:  # reads deferred: a write in place first makes the session read what it holds
            handles.append(inplace_mindspore.install(session))
    else:
        from aligner.dumping import ops_torch as op_hooks  # type: ignore[no-redef]
        from aligner.dumping import torch_hooks as hooks  # type: ignore[no-redef]
    # ops=True: op hooks first, so that a bad scope raises before any module hook exists
    if opts.ops:
        handles.extend(op_hooks.install(model, session, opts))
    hooks.install(model, session, opts, handles)
    if opts.params:
        for name, type_, value in hooks.state(model):
            if opts.selects_name(name):
                session.emit(name, type_, Kind.PARAM, Io.VALUE, 0, value)


class DumpContext:
    """Hooks `model` on entry, removes them and flushes the background writer on exit."""

    def __init__(self, model: Any, framework: str | None, opts: Options, step: int) -> None:
        self.framework = framework
        if framework == Framework.MINDSPORE:
            from aligner.dumping.mindspore_hooks import check_pynative

            check_pynative()
        self.model, self.opts, self.step = model, opts, step
        self.session: Session | None = None
        self._handles: list[Any] = []
        self._previous: Session | None = None
        # reason -> records this context wrote without data (a tensor no reader supports, an exception a hook met)
        self.skipped: collections.Counter[str] = collections.Counter()

    def _open(self) -> tuple[Any, int] | None:
        """The sink and first sequence number for this entry, or None when this step is not recorded."""
        raise NotImplementedError

    def _closed(self, session: Session) -> None:
        """Called after the sink is flushed."""

    def _finish(self, sink: Any) -> None:
        """Wait for the sink to hold everything the session handed it; raise its write error."""
        sink.close()

    def _waits_for(self, sink: Any) -> bool:
        """Whether `sink` is done with every array it was handed before this context returns (then the session may
        lend it the framework's memory at the last flush, not a copy)."""
        return False

    def __enter__(self) -> "DumpContext":
        opened = self._open()
        if opened is None:
            return self
        sink, first_seq = opened
        mindspore = self.framework == Framework.MINDSPORE
        self.session = session = Session(sink, self.step, first_seq, mindspore, mindspore and self._waits_for(sink))
        try:
            if self.framework is not None:
                _install(self.framework, self.model, self.session, self.opts, self._handles)
        except BaseException:
            self._remove_hooks()
            try:
                sink.close()
            finally:
                self._closed(session)
            raise
        self._previous = activate(self.session)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.session is None:
            return
        session, self.session = self.session, None
        self._remove_hooks()
        interrupted = True  # the flush stopped (a Ctrl-C): the sink is closed and the directory let go all the same
        try:
            session.close()
            interrupted = False
        finally:
            self.skipped.update(session.skipped)
            activate(self._previous)
            try:
                self._finish(session.sink)
            except AlignerError:
                if exc is None and not interrupted:  # never hide the user's own exception behind a write error
                    raise
            finally:
                self._closed(session)

    def _remove_hooks(self) -> None:
        """Remove the hooks and patches, the last made first (patches of the same attribute put back in order)."""
        for handle in reversed(self._handles):
            handle.remove()
        self._handles = []


class _DirectoryDump(DumpContext):
    """A DumpContext that writes a dump directory for the selected steps."""

    def __init__(self, model: Any, directory: str | os.PathLike, opts: Options, step: int,
                 steps: Iterable[int] | None, stats_only: bool, overwrite: bool, progress: Progress,
                 groups: Mapping[str, Sequence[Any]] | None = None, wait: bool = True) -> None:
        framework = model_framework(model)
        super().__init__(model, framework, opts, step)
        self.model_framework = framework  # a directory dump always has a model, so always a framework
        self.directory, self.stats_only, self.overwrite, self.wait = directory, stats_only, overwrite, wait
        self.progress = progress
        self.steps = None if steps is None else frozenset(int(s) for s in steps)
        self.groups = groups
        self._dir: DumpDir | None = None
        self._reduced: ranks.ReducedGrads | None = None

    def _open(self) -> tuple[Any, int] | None:
        layout = ranks.detect(self.model, self.model_framework, self.groups)
        self._dir = claim(ranks.directory(self.directory, layout), self.model_framework,
                          framework_version(self.model_framework), self.stats_only, self.overwrite, pinned(),
                          layout.header() if layout.distributed else None)
        try:
            if self.steps is not None and self.step not in self.steps:
                self._dir.release()
                return None
            if layout.distributed and self.model_framework == Framework.PYTORCH and self.opts.backward:
                self._reduced = ranks.ReducedGrads(self.model, self.opts)  # .grad after the all-reduce, at exit
            sink = StatsSink(self._dir.path) if self.stats_only else (
                self._dir.take_writer() or BackgroundWriter(self._dir.path, self._dir.written, progress=self.progress))
        except BaseException:
            self._dir.release()
            raise
        return sink, self._dir.next_seq

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self._reduced is not None and self.session is not None and exc is None:
                self._reduced.emit(self.session)
        finally:
            super().__exit__(exc_type, exc, tb)

    def _waits_for(self, sink: Any) -> bool:
        """A full dump's writer with wait=True: closed (every file written) before the context returns."""
        return self.wait and isinstance(sink, BackgroundWriter)

    def _finish(self, sink: Any) -> None:
        """wait=False: a full dump's writer goes on writing while the next step runs (aligner.dumping.pending)."""
        if self._dir is None or not isinstance(sink, BackgroundWriter):
            sink.close()
        elif self.wait:
            self._dir.close_writer(sink)
        else:
            self._dir.lend(sink)
            if sink.failed:  # raise what is known now, not a step later
                self._dir.finish()

    def _closed(self, session: Session) -> None:
        if self._dir is not None:
            self._dir.next_seq = session.seq
            self._dir.release()


class MemoryCapture(DumpContext):
    """A DumpContext that keeps (record, array) pairs in `self.items` instead of writing files (model None: probes)."""

    def __init__(self, model: Any, opts: Options | None = None, step: int = 0) -> None:
        framework = None if model is None else model_framework(model)
        super().__init__(model, framework, opts or Options(leaves_only=False), step)
        self.sink = MemorySink()
        self.items = self.sink.items

    def _open(self) -> tuple[Any, int]:
        return self.sink, len(self.items)


def dump(model: Any, directory: str | os.PathLike, *, step: int = 0, steps: Iterable[int] | None = None,
         include: str | None = None, exclude: str | None = None, leaves_only: bool = True, forward: bool = True,
         backward: bool = True, inputs: bool | None = None, ops: bool = False, scope: str | None = None,
         params: bool = False, stats_only: bool = False, overwrite: bool = False,
         progress: Progress = SILENT, groups: Mapping[str, Sequence[Any]] | None = None,
         wait: bool = True) -> DumpContext:
    """Context manager recording `model`'s forward outputs, backward gradients and parameter gradients to `directory`.

    The first `dump` on a directory in a process checks it is empty (or clears a previous dump with overwrite=True)
    and writes the header; later contexts on the same directory (one per training step) append to it. Only steps in
    `steps` (all when None) are recorded; `include`/`exclude` are regexes searched in module paths and parameter names.
    `progress` shows the writes still queued when the context exits (`aligner.dump` passes a terminal bar).

    inputs: None (default) records each call's inputs as links to the record that returned them, and stores those
    that code between module calls computed (what tells a module's own error from its parent's glue code); True
    stores every input; False none. ops=True also records every tensor operation called inside the forward of the
    module at `scope` (a path; the whole model when None), with the source line of each call: the zoom-in that
    names the op where the numbers part. params=True also records every parameter's and buffer's value as each
    step starts (what `align repro` packs with a layer, and what `align diff --grads` fits update rules on).

    Under an initialised torch.distributed or mindspore.communication with more than one rank, each rank writes
    `directory`/rank{N}/ with its rank, the world size and the groups in the header (`aligner.dumping.ranks`);
    groups={"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]} names the parallel groups (a name's partition of the
    ranks, or the group of this rank), which `align check` compares weights and gradients within.

    wait=False (full dumps): the context exits once its step's records are handed to the directory's writer thread,
    which writes them while the next step runs (at millisecond steps, most of a full dump's cost). Reading any dump
    in this process, `aligner.wait_dumps()`, and the process's exit wait for the writer first; a write error is
    raised by the next context on the directory or by `wait_dumps` (at exit it is printed).
    """
    if not isinstance(step, int):
        raise AlignerError(f"aligner.dump step must be an int, got {type(step).__name__}")
    # a stats-only dump cannot be replayed (no input data): no call signatures (4% of a resnet18 step)
    opts = dataclasses.replace(Options.build(include, exclude, leaves_only, forward, backward, inputs, ops, scope,
                                             params), calls=not stats_only)
    if not isinstance(wait, bool):
        raise AlignerError(f"aligner.dump wait must be True or False, got {wait!r}")
    return _DirectoryDump(model, directory, opts, step, steps, stats_only, overwrite, progress, groups, wait)


def save(name: str, tensor: Any) -> None:
    """Record a hand-placed probe in the active dump (a no-op outside one, so probes can stay in the code)."""
    if not isinstance(name, str) or not name:
        raise AlignerError(f"aligner.save needs a non-empty name string, got {name!r}")
    session = active()
    if session is not None and session.open:
        session.probe(name, tensor)
