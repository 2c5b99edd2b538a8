"""The capture that is active right now: numbers records in execution order, tracks the module call stack, and
feeds records to a sink."""
from __future__ import annotations

import collections
import dataclasses
import itertools
import sys
import threading
import weakref
from typing import Any, Hashable, Protocol

import numpy as np

from aligner.core.dtypes import canonical
from aligner.dumping.fstats import (
    QueuedStats,
    Staged,
    StatsStage,
    fast_stats_of,
    ms_cpu_target,
    ms_deferrable,
    ms_views,
    on_host,
    read_queued,
    stats_of,
    torch_stats_queued,
)
from aligner.dumping.manifest import Io, Kind, Record
from aligner.dumping.tensors import (
    dtype_label,
    dtype_name,
    failure,
    shape_of,
    tensors_in,
    to_host,
    unstorable,
    view_key,
)
from aligner.metrics.stats import Stats

# False: stats-only captures copy every tensor to the host and the sink computes its statistics there (the path
# before in-framework statistics; scripts/bench_dump.py switches it off for its "before" column)
FRAMEWORK_STATS = True

# MindSpore on a CPU target dispatches its ops asynchronously: reading a tensor in a hook (its data, address, device
# or version) waits for its op, which serialises the step (a stats-only resnet18 step measured 2x the same hooks doing
# nothing). A dump instead keeps a reference to each float tensor (its ops return new tensors; a Parameter, which
# optimizers and BatchNorm change in place, is copied by an op queued behind the ones issued) and copies or reduces
# the batch when DEFER_BYTES are held or the context exits: memory in flight is bounded by DEFER_BYTES plus one
# tensor. Links then go by object identity alone (`Session.by_identity`). scripts/bench_dump.py turns DEFER off.
DEFER = True
DEFER_BYTES = 256 << 20
# A torch tensor on an accelerator (these device types) has its statistics queued the same way, for the same reason:
# reading them waits for the device. Its reductions are queued on the device at once (one Triton kernel launch where
# Triton runs: fstats.StatsStage), behind the op that wrote it and ahead of any later in-place op, and read back at the
# flush: one wait and one small transfer per flush instead of one per record. A full dump copies each tensor to the
# host at once: copies queued into pinned memory measured no faster on a GPU (the disk bounds a full dump) and slower
# on small tensors (docs/scale.md).
QUEUE_DEVICES = frozenset({"cuda", "xpu", "mps", "npu", "hpu", "mtia", "privateuseone"})
DEFER_RECORDS = 1 << 16  # records waiting at most (a queued statistic holds an 80-byte device vector, kernel rows 88 B)


# How many recent outputs a session holds to link inputs that view their memory (see Session._views): a chain's
# input is the output just before it; a residual's, a block's input a few cells back.
RECENT_VIEWS = 16


class Sink(Protocol):
    """Receives each record with its host array (BackgroundWriter or MemorySink); None for a record without data (an
    input that is an earlier record's tensor, `same_as`) and, when `host_arrays` is False (StatsSink), for every
    record: its `stats` were computed where the tensor lives and no tensor is copied to the host. A sink that cannot
    write keeps its error and raises it from `close` (put may raise it too: the session does not pass it on)."""

    host_arrays: bool

    def put(self, record: Record, array: np.ndarray | None) -> None: ...

    def put_many(self, items: list[tuple[Record, np.ndarray | None]]) -> None:
        """`put` each of `items` in order; a sink that takes them at once overrides this (BackgroundWriter: its
        thread wakes once for a MindSpore step's records, which all arrive at the context's exit)."""
        for record, array in items:
            self.put(record, array)

    def close(self) -> None: ...


@dataclasses.dataclass
class _Waiting:
    """A record waiting in order for the flush (see DEFER): `held` is the tensor to copy (or with `stats_only`, to
    reduce); `grad`, a gradient that becomes a link if it views the last gradient's memory."""

    record: Record
    array: np.ndarray | None
    held: Any
    stats_only: bool
    grad: bool = False


@dataclasses.dataclass
class Frame:
    """One module call in progress: its path, call id, and the sequence number its children's records start at."""

    path: str
    call: int
    first_seq: int


class Session:
    """Sequence numbers, call ids, the module call stack, the step and per-name probe counters of one capture (the
    hooks of both frameworks call emit)."""

    # whether inputs and gradients handed over as new objects are linked by the memory they view (`view_key`): a
    # dump saves a reduction per link; a capture that keeps MindSpore's ops asynchronous turns it off (reading a
    # MindSpore tensor's address waits for the op that writes it)
    link_views = True

    def __init__(self, sink: Sink, step: int, first_seq: int = 0, mindspore: bool = False,
                 lends_views: bool = False) -> None:
        """`mindspore`: the hooks are MindSpore's (on a CPU target, what they record waits for a flush: DEFER).
        `lends_views`: the sink is done with every array before the context returns (a full dump's writer, waited
        for), so the flush at close hands it MindSpore's memory itself, not a copy (nothing runs until then that could
        change it); a flush during the step still copies."""
        self.sink = sink
        self.lends_views = lends_views
        self.host_arrays = sink.host_arrays or not FRAMEWORK_STATS
        # records waiting for their data (see DEFER), in order, with the tensor each copies or reduces (None: none)
        self._pending: list[_Waiting] = []
        self._pending_bytes = 0
        self._defer_ms = mindspore and DEFER and ms_cpu_target()
        self._queue_torch = not mindspore and DEFER
        self._stats_stage = StatsStage()  # small accelerator tensors' statistics, reduced together at the flush
        # links by object identity only (no tensor's address or version read: each waits for its op); the MindSpore
        # hooks tell the session which copy of an input they hand a cell (`same_tensors`)
        self.by_identity = self._defer_ms
        if self.by_identity:
            self.link_views = False
        # writes in place seen so far (`writing_in_place`): what links by identity go by, as torch's go by `_version`
        self._writes = 0
        # id of a copy the MindSpore hooks hand a cell as an input (for its input gradient) -> (the copy, the cell's
        # path and type, the input's index, the copy's token): a write into it in place is one the cell's caller does
        # not see; the copies written so, by token, with the sentence their gradient record is skipped with. Tokens,
        # not ids: a copy's Python object may be freed during the step while its gradient still comes, and a later
        # copy then gets its id (1-3 a step of tests/dumping/test_mindspore_hooks.py's model did), so a note keyed by
        # id could go to another cell's gradient
        self._handed: dict[int, tuple[weakref.ref, str, str, int, int]] = {}
        self._written: dict[int, tuple[str, str, int, str]] = {}
        self._tokens = itertools.count()
        self.step = step
        self.seq = first_seq
        self.open = True  # False once the context has exited: late gradient hooks are ignored
        self.stack: list[Frame] = []
        self._calls = 0
        self._probes: collections.Counter[str] = collections.Counter()
        self._outputs: dict[int, tuple[weakref.ref, int, int | None]] = {}  # id(tensor) -> (ref, seq, version)
        # id(tensor) -> (ref, version, scope) for tensors no recorded call returned: the module whose code computed it
        # (a call whose output is not recorded returned it, or a caller handed it into a call), which a later input
        # record of the very tensor names (`scope`) when it is not that record's parent
        self._scopes: dict[int, tuple[weakref.ref, int | None, str]] = {}
        # view_key(tensor) -> (tensor, seq, version) of the last RECENT_VIEWS outputs, held so that their memory
        # cannot be reused: MindSpore hands a cell's output (with a backward hook) to the next cell as a new Python
        # object viewing the same memory, and the object the forward hook saw is gone by then
        self._views: collections.OrderedDict[Hashable, tuple[Any, int, int | None]] = collections.OrderedDict()
        # the last gradient recorded with data: (tensor, its view key, version, seq); the tensor is held so that its
        # memory cannot be reused while a later gradient is compared with it
        self._last_grad: tuple[Any, Hashable, int, int] | None = None
        self._lock = threading.Lock()  # autograd may run hooks on another thread (CUDA devices)
        self.skipped: collections.Counter[str] = collections.Counter()  # reason -> records skipped for it

    def close(self) -> None:
        """Stop recording (late gradient hooks are ignored), hand the sink every record still waiting for its
        statistics, and let go of every tensor held for links: the hooks left on the step's tensors refer back to
        this session, so what it holds would otherwise live as long as they do (a full dump of 30 steps grew by 70 MiB
        a step)."""
        self._note_written()
        with self._lock:
            self.open = False
            self._flush()
            self._outputs.clear()
            self._scopes.clear()
            self._handed.clear()
            self._views.clear()
            self._last_grad = None

    def next_step(self, step: int) -> None:
        """Go on recording `step` with the same hooks (aligner.watch): sequence numbers continue; probe counters and
        input links start afresh."""
        self._note_written()
        with self._lock:
            self.step = step
            self._probes.clear()
            self._outputs.clear()
            self._scopes.clear()
            self._handed.clear()
            self._views.clear()
            self._last_grad = None

    # -- call structure -------------------------------------------------------------------------------------------
    def new_call(self) -> int:
        """A fresh call id (module calls and op calls share the numbering)."""
        with self._lock:
            self._calls += 1
            return self._calls

    def enter(self, path: str) -> Frame:
        """A module call starts: push it (its parent is the call below it on the stack)."""
        frame = Frame(path, self.new_call(), self.seq)
        self.stack.append(frame)
        return frame

    def leave(self, frame: Frame) -> None:
        """A module call ends: pop it (and anything above it that an exception left behind)."""
        while self.stack:
            if self.stack.pop() is frame:
                return

    def parent(self, frame: Frame | None = None) -> str | None:
        """Path of the module whose forward is running around `frame` (the top of the stack when None); None when
        the call happens outside the model."""
        stack = self.stack
        if frame is not None:
            stack = stack[:next((i for i, f in enumerate(stack) if f is frame), len(stack))]
        return stack[-1].path if stack else None

    def inside(self, path: str) -> bool:
        """Whether a call of the module at `path` is running (at any depth of the stack)."""
        return any(f.path == path for f in self.stack)

    # -- records ----------------------------------------------------------------------------------------------------
    def emit(self, module: str, type_: str, kind: Kind, io: Io, index: int, tensor: Any, *,
             call: int | None = None, parent: str | None = None, source: str | None = None,
             arg: str | None = None, scope: str | None = None, stats_only: bool = False) -> int:
        """Queue `tensor`'s record with the next sequence number (returned): see `_emit`."""
        return self._emit(module, type_, kind, io, index, tensor, call=call, parent=parent, source=source, arg=arg,
                          scope=scope, stats_only=stats_only)

    def _emit(self, module: str, type_: str, kind: Kind, io: Io, index: int, tensor: Any, *,
              call: int | None = None, parent: str | None = None, source: str | None = None,
              arg: str | None = None, scope: str | None = None, stats_only: bool = False, grad: bool = False) -> int:
        """Queue `tensor`'s record with the next sequence number (returned): with a host copy of the tensor (full
        dumps), or (a sink without `host_arrays`) with its statistics, computed now where the tensor lives: on its
        accelerator (`stats_of`), or in host memory in one pass without a copy (`fast_stats_of`), or for MindSpore on
        a CPU target later, in a batch (`DEFER`), or for torch on an accelerator queued there and read back in a
        batch (`QUEUE_DEVICES`). A tensor that cannot be stored (a dtype no reader supports, a layout
        without strides) is a skipped record saying why: a dump never breaks the forward it records. `grad`: a
        gradient that a deferred record makes a link at the flush if it views the last gradient's memory."""
        array: np.ndarray | None = None
        stats: Stats | None = None
        skipped: str | None = None
        held: Any = None
        # statistics queued on the tensor's device below, under the lock
        queue = self._queue_torch and (stats_only or not self.host_arrays) and _on_queue_device(tensor)
        try:
            dtype, shape = dtype_name(tensor), shape_of(tensor)
            held = ms_deferrable(tensor, dtype) if self._defer_ms else None
            if held is not None or queue:
                array = None  # the host copy (full) or the statistics, at the flush
            elif self.host_arrays and not stats_only:
                array = host = to_host(tensor)
                dtype, shape = canonical(host.dtype), list(host.shape)
            else:
                stats = fast_stats_of(tensor) if on_host(tensor) else stats_of(tensor)
        except Exception as exc:  # whatever the tensor is, the user's forward goes on
            array, stats, skipped = None, None, unstorable(tensor, exc)
            dtype, shape = dtype_label(tensor), _shape(tensor)
        with self._lock:
            if queue and skipped is None:
                try:
                    held = self._queue(tensor)
                except Exception as exc:  # whatever the tensor is, the user's forward goes on
                    held, skipped = None, unstorable(tensor, exc)
                if isinstance(held, Stats):
                    stats, held = held, None
            seq = self.seq
            record = Record(seq=seq, module=module, type=type_, kind=kind, io=io, index=index, dtype=dtype,
                            shape=shape, step=self.step, stats=stats, call=call, parent=parent, source=source, arg=arg,
                            skipped=skipped, scope=scope)
            self._put(record, array, held, stats_only, grad)
        return seq

    def _queue(self, tensor: Any) -> Staged | QueuedStats | Stats:
        """An accelerator torch tensor's statistics queued on its device (see QUEUE_DEVICES), the lock held: through
        the session's stage (a float tensor by the Triton kernel where it runs; else a small one copied, one kernel), or
        reduced on its own; an empty tensor's at once. A copy stage with no room left is read first (a flush)."""
        stage = self._stats_stage
        staged = stage.reduce(tensor)
        if staged is None:
            if stage.full(tensor):
                self._flush()
            staged = stage.add(tensor)
        return staged or torch_stats_queued(tensor)

    def failed(self, module: str, type_: str, kind: Kind, io: Io, exc: Exception | str, *, call: int | None = None,
               parent: str | None = None, index: int = 0) -> None:
        """Record that a hook of `module` met `exc` (what it would have recorded is skipped, with the reason: the
        exception, or a sentence) instead of raising it into the user's forward or backward."""
        reason = exc if isinstance(exc, str) else failure(exc)
        with self._lock:
            self._put(Record(seq=self.seq, module=module, type=type_, kind=kind, io=io, index=index, dtype="",
                             shape=[], step=self.step, call=call, parent=parent, skipped=reason), None)

    def _put(self, record: Record, array: np.ndarray | None, held: Any = None, stats_only: bool = False,
             grad: bool = False) -> None:
        """Hand a record to the sink with the next sequence number (the lock held), counting a skipped one; behind
        records waiting for their data (`held`: the tensor to copy or reduce, see DEFER), it waits in order too. A
        sink that fails keeps its error and raises it at close (the context's exit), not inside the hook that wrote."""
        self.seq += 1
        if held is not None or self._pending:
            self._pending.append(_Waiting(record, array, held, stats_only, grad and held is not None))
            if held is not None:
                # `nbytes` waits for the op writing the tensor; computing it from the record instead only moved the
                # wait to the next hook (docs/scale-mindspore.md)
                self._pending_bytes += _held_bytes(held)
                if self._pending_bytes >= DEFER_BYTES or len(self._pending) >= DEFER_RECORDS:
                    self._flush()
            return
        self._hand(record, array)

    def _hand(self, record: Record, array: np.ndarray | None) -> None:
        if record.skipped is not None:
            self.skipped[record.skipped] += 1
        try:
            self.sink.put(record, array)
        except Exception:  # a write error of the sink's: Sink.close raises it
            pass

    def _hand_all(self, items: list[tuple[Record, np.ndarray | None]]) -> None:
        """`_hand` each of a flush's records, in one hand-over (`Sink.put_many`)."""
        for record, _ in items:
            if record.skipped is not None:
                self.skipped[record.skipped] += 1
        try:
            self.sink.put_many(items)
        except Exception:  # a write error of the sink's: Sink.close raises it
            pass

    def _flush(self) -> None:
        """Copy or reduce every held tensor (one wait for MindSpore's queued ops) and hand the waiting records over in
        order (the lock held)."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        queued = self._read_queued(pending)
        # the context's last flush: views, no copy
        host = ms_views() if self.lends_views and not self.open and pending else to_host
        handed: list[tuple[Record, np.ndarray | None]] = []
        for item in pending:
            record, array, held = item.record, item.array, item.held
            if item.grad and self._linked_grad(record, held):
                array = None
            elif isinstance(held, Staged | QueuedStats):
                read = queued[id(held)]
                if isinstance(read, str):
                    record.skipped = read
                else:
                    record.stats = read
            elif held is not None:
                try:
                    if self.host_arrays and not item.stats_only:
                        array = host(held)
                    else:
                        record.stats = fast_stats_of(held)
                except Exception as exc:  # whatever the tensor is, the dump goes on
                    record.skipped = unstorable(held, exc)
            handed.append((record, array))
        self._hand_all(handed)

    def _read_queued(self, pending: list[_Waiting]) -> dict[int, Stats | str]:
        """The statistics queued on accelerators for `pending`, by id of what is held (one transfer per stage buffer
        or device), or why a record could not be read (its skip reason: a device error surfaces here, not in the
        hooks, and the dump goes on)."""
        held = [w.held for w in pending]
        out: dict[int, Stats | str] = {}
        stats = [h for h in held if isinstance(h, QueuedStats)]
        staged = [h for h in held if isinstance(h, Staged)]
        try:
            out.update(zip(map(id, stats), read_queued(stats) if stats else ()))
        except Exception as exc:
            out.update((id(q), failure(exc)) for q in stats)
        try:
            by_buffer = self._stats_stage.read()
            out.update((id(s), by_buffer[s.key][s.index]) for s in staged)
        except Exception as exc:
            out.update((id(s), failure(exc)) for s in staged)
        return out

    def _linked_grad(self, record: Record, grad: Any) -> bool:
        """At the flush: make a gradient's record a link when it views the very memory of the last gradient recorded
        (as `emit_grad` does at once); else it becomes that last gradient."""
        last, key = self._last_grad, view_key(grad)
        if last is not None and key is not None and last[1] == key:
            record.same_as = last[3]
            return True
        if key is not None:
            self._last_grad = (grad, key, 0, record.seq)
        return False

    def observe(self, module: str, type_: str, io: Io, index: int, tensor: Any, *, call: int | None,
                parent: str | None, arg: str | None = None) -> None:
        """Record what a call `leaves_only` keeps no records of takes in or hands back (kind "block"): a link when it
        is an earlier record's tensor, else its statistics alone (never a file, and never a producer that later
        inputs link to: they keep their own data), so a verdict can tell a block's own code from its children's."""
        same = self.producer(tensor)
        if same is not None:
            self._emit_link(module, type_, Kind.BLOCK, io, index, tensor, call=call, parent=parent, same=same, arg=arg)
            return
        scope = self.scope_of(tensor) if io == Io.INPUT else None
        self.emit(module, type_, Kind.BLOCK, io, index, tensor, call=call, parent=parent, arg=arg,
                  scope=scope if scope != parent else None, stats_only=True)

    def emit_output(self, module: str, type_: str, kind: Kind, index: int, tensor: Any, *, call: int | None,
                    parent: str | None, source: str | None = None) -> int:
        """Emit a call's output and remember the tensor, so a later call taking it as input links to this record. An
        output that is an earlier record's tensor, unchanged (a module handing back its input: `nn.Identity`), is a
        link to it (`same_as`): same numbers, no second reduction or copy."""
        same = self.producer(tensor)
        if same is None:
            seq = self.emit(module, type_, kind, Io.OUTPUT, index, tensor, call=call, parent=parent, source=source)
        else:
            seq = self._emit_link(module, type_, kind, Io.OUTPUT, index, tensor, call=call, parent=parent, same=same,
                                  source=source)
        self.remember(tensor, seq)
        return seq

    def remember(self, tensor: Any, seq: int) -> None:
        """Make `tensor` (recorded as `seq`) the producer later inputs link to."""
        try:
            known = (weakref.ref(tensor), seq, self._version(tensor))
        except TypeError:  # not weakly referenceable: such inputs are stored, never linked
            return
        self._outputs[id(tensor)] = known
        key = view_key(tensor) if self.link_views else None
        if key is not None:
            self._views[key] = (tensor, seq, known[2])
            self._views.move_to_end(key)
            if len(self._views) > RECENT_VIEWS:
                self._views.popitem(last=False)

    def computed_in(self, tensor: Any, scope: str | None) -> None:
        """Note that code in the forward of `scope` computed `tensor`, unless a recorded call returned it or where it
        was computed is known already (it passes through unchanged). Only by identity: reading a MindSpore tensor's
        memory address would wait for its op."""
        if scope is None or self.scope_of(tensor) is not None:
            return
        known = self._outputs.get(id(tensor))
        if known is not None and known[0]() is tensor and known[2] == self._version(tensor):
            return
        try:
            self._scopes[id(tensor)] = (weakref.ref(tensor), self._version(tensor), scope)
        except TypeError:  # not weakly referenceable: its records name their parent
            pass

    def scope_of(self, tensor: Any) -> str | None:
        """The module whose code computed `tensor` as `computed_in` noted it (None: unknown, or changed since)."""
        known = self._scopes.get(id(tensor))
        if known is None or known[0]() is not tensor or known[1] != self._version(tensor):
            return None
        return known[2]

    def producer(self, tensor: Any) -> int | None:
        """The seq of the output record holding this very tensor, or (a new object) the very memory of a producer
        still alive, unchanged since (None: computed elsewhere)."""
        known = self._outputs.get(id(tensor))
        if known is not None and known[0]() is tensor:
            return known[1] if known[2] is not None and known[2] == self._version(tensor) else None
        held = self._views.get(view_key(tensor)) if self.link_views else None
        if held is None or held[2] is None or held[2] != self._version(held[0]):
            return None
        return held[1]

    def _version(self, tensor: Any) -> int | None:
        """How often `tensor` was changed in place (torch); when links go by identity alone (reading a MindSpore
        tensor's version waits for its op, and it counts no `__setitem__`), how many writes in place the session has
        seen (`writing_in_place`: any of them may have reached any tensor); None when nothing counts the changes (a
        tensor made under torch.inference_mode, which an in-place ReLU may change unseen): such a tensor is never
        linked."""
        if self.by_identity:
            return self._writes
        try:
            return getattr(tensor, "_version", 0)
        except RuntimeError:  # "Inference tensors do not track version counter"
            return None

    def writing_in_place(self, target: Any = None) -> None:
        """A MindSpore op is about to write `target` in place (`aligner.dumping.inplace_mindspore`): read every tensor
        held for a deferred record now, as its hook saw it, and link nothing seen so far by identity (the write may
        reach any of them through a view). A write into the copy of an input the hooks handed a cell is noted: without
        the dump the cell would write its caller's tensor (`handed_input`), and the copy's gradient record says so
        in its place (`written_input`)."""
        with self._lock:
            if not self.open:
                return
            self._writes += 1
            if self._pending_bytes:
                self._flush()
            handed = self._handed.get(id(target)) if target is not None else None
            if handed is not None and handed[0]() is target:
                self._written[handed[4]] = (handed[1], handed[2], handed[3], (
                    f"{handed[1]} wrote in place into its input {handed[3]}: under this dump it writes the copy the "
                    "dump hands it for this gradient, so its caller does not see the write and what runs after may "
                    "compute other numbers than without the dump; dump with backward=False to hand the cell its own "
                    "input"))

    def written_input(self, token: int) -> str | None:
        """Why the gradient of the input copy with `token` (what `handed_input` returned for it) is not recorded: the
        cell wrote into the copy in place (None: it did not)."""
        with self._lock:
            written = self._written.pop(token, None)
        return None if written is None else written[3]

    def _note_written(self) -> None:
        """The notes of copies written in place whose gradient never came (no gradient reached the cell's input): at
        the end of the step, in the place that gradient's record would have had."""
        with self._lock:
            written, self._written = list(self._written.values()), {}
        for module, type_, index, reason in written:
            self.failed(module, type_, Kind.BACKWARD, Io.GRAD_INPUT, reason, index=index)

    def handed_input(self, copy: Any, module: str, type_: str, index: int) -> int | None:
        """`copy` is what the MindSpore hooks hand `module` as its input `index` in place of the caller's tensor; its
        token, for `written_input` (None: not weakly referenceable, so a write into it goes unremarked)."""
        try:
            ref = weakref.ref(copy)
        except TypeError:
            return None
        token = next(self._tokens)
        self._handed[id(copy)] = (ref, module, type_, index, token)
        return token

    def same_tensors(self, before: Any, after: Any) -> None:
        """`after` holds the numbers of the tensors of `before`, in order, as new objects (the copies of its inputs
        the MindSpore hooks hand a cell, for its gradients): a later input that is one of them (in the cell's children
        or its own ops) links where the old object would."""
        for old, new in zip(tensors_in(before), tensors_in(after)):
            if new is old:
                continue
            for table in (self._outputs, self._scopes):
                known = table.get(id(old))
                if known is not None and known[0]() is old:
                    try:
                        table[id(new)] = (weakref.ref(new), *known[1:])
                    except TypeError:  # not weakly referenceable: stored, never linked
                        pass

    def emit_grad(self, module: str, type_: str, io: Io, index: int, grad: Any) -> None:
        """Record a module's gradient. One viewing the very memory of the last gradient recorded, unchanged since
        (the gradient a chain hands from one module back to the one before it; a pass-through module's grad_input,
        its grad_output) becomes a link to that record (`same_as`): same numbers, no second reduction or copy."""
        if self.by_identity:  # linked or not at the flush, where reading its address no longer waits
            self._emit(module, type_, Kind.BACKWARD, io, index, grad, grad=True)
            return
        if not self.link_views:
            self.emit(module, type_, Kind.BACKWARD, io, index, grad)
            return
        last, key = self._last_grad, view_key(grad)
        version = getattr(grad, "_version", 0)
        if last is not None and key is not None and last[1] == key and last[2] == version:
            self._emit_link(module, type_, Kind.BACKWARD, io, index, grad, call=None, parent=None, same=last[3])
            return
        seq = self.emit(module, type_, Kind.BACKWARD, io, index, grad)
        if key is not None:
            self._last_grad = (grad, key, version, seq)

    def emit_call(self, module: str, type_: str, *, call: int, parent: str | None, args: dict[str, Any],
                  attrs: dict[str, Any] | None) -> None:
        """Record a call's signature (no tensor): what a replay needs to call the module the same way."""
        with self._lock:
            record = Record(seq=self.seq, module=module, type=type_, kind=Kind.CALL, io=Io.SIGNATURE, index=0, dtype="",
                            shape=[], step=self.step, call=call, parent=parent, args=args, attrs=attrs)
            self._put(record, None)

    def emit_input(self, module: str, type_: str, kind: Kind, index: int, tensor: Any, *, call: int | None,
                   parent: str | None, link: bool, source: str | None = None, arg: str | None = None) -> None:
        """Record a call's input: with `link`, a record without data (`same_as`) when it is an earlier output
        unchanged; otherwise (computed by code between module calls, or `link` False) its data."""
        same = self.producer(tensor) if link else None
        if same is None:
            scope = self.scope_of(tensor)
            seq = self.emit(module, type_, kind, Io.INPUT, index, tensor, call=call, parent=parent, source=source,
                            arg=arg, scope=scope if scope != parent else None)
            if parent is None:  # a model input: what every call it feeds links to
                self.remember(tensor, seq)
            return
        self._emit_link(module, type_, kind, Io.INPUT, index, tensor, call=call, parent=parent, same=same,
                        source=source, arg=arg)

    def _emit_link(self, module: str, type_: str, kind: Kind, io: Io, index: int, tensor: Any, *, call: int | None,
                   parent: str | None, same: int, source: str | None = None, arg: str | None = None) -> int:
        """A record without data (its seq returned): `tensor` is what record `same` holds (a skipped record too when
        its dtype is one no reader supports, as the record it links to is)."""
        dtype = dtype_label(tensor)
        skipped = None
        try:
            dtype = dtype_name(tensor)
        except Exception as exc:  # never raised into the user's forward
            skipped = unstorable(tensor, exc)
        with self._lock:
            seq = self.seq
            record = Record(seq=seq, module=module, type=type_, kind=kind, io=io, index=index, dtype=dtype,
                            shape=_shape(tensor), step=self.step, call=call, parent=parent, same_as=same,
                            source=source, arg=arg, skipped=skipped)
            self._put(record, None)
        return seq

    def probe(self, name: str, tensor: Any) -> None:
        """Record a hand-placed probe; repeated names in one step get index 0, 1, 2, ... in call order."""
        with self._lock:
            index = self._probes[name]
            self._probes[name] += 1
        self.emit(name, "probe", Kind.PROBE, Io.OUTPUT, index, tensor, parent=self.parent())


def _on_queue_device(tensor: Any) -> bool:
    """Whether `tensor` is a strided torch tensor on a device of QUEUE_DEVICES (its record is queued there)."""
    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(tensor, torch.Tensor) and tensor.device.type in QUEUE_DEVICES
            and tensor.layout == torch.strided)


def _held_bytes(held: Any) -> int:
    """The memory a waiting record holds: a MindSpore tensor's bytes, a kernel's table rows on the device (up to 22 KiB
    a tensor: DEFER_BYTES bounds them too); a queued vector or a copy buffer's segment: none counted."""
    if isinstance(held, Staged):
        return held.table_bytes
    return 0 if isinstance(held, QueuedStats) else int(held.nbytes)


def _shape(tensor: Any) -> list[int]:
    """A tensor's shape as a list of ints, [] when it has none to read (never raises)."""
    try:
        return shape_of(tensor)
    except Exception:  # an object without a readable shape: its record says what else it knows
        return []


class _Active(threading.local):
    """The active session of each thread: two threads dumping two models keep their probes apart."""

    session: Session | None = None


_active = _Active()


def active() -> Session | None:
    """The session `aligner.save` writes to in this thread, or None outside a dump context."""
    return _active.session


def activate(session: Session | None) -> Session | None:
    """Make `session` this thread's active one and return the previous one (to restore on exit)."""
    previous, _active.session = _active.session, session
    return previous
