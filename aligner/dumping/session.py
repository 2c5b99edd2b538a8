"""The capture that is active right now: numbers records in execution order and feeds them to a sink."""
from __future__ import annotations

import collections
import threading
from typing import Any, Protocol

import numpy as np

from aligner.core.dtypes import canonical
from aligner.dumping.manifest import Record
from aligner.dumping.tensors import to_host


class Sink(Protocol):
    """Receives each record with its host array (BackgroundWriter or MemorySink)."""

    def put(self, record: Record, array: np.ndarray) -> None: ...

    def close(self) -> None: ...


class Session:
    """Sequence numbers, the step and per-name probe counters of one capture (hooks of both frameworks call emit)."""

    def __init__(self, sink: Sink, step: int, first_seq: int = 0) -> None:
        self.sink = sink
        self.step = step
        self.seq = first_seq
        self.open = True  # False once the context has exited: late gradient hooks are ignored
        self._probes: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # autograd may run hooks on another thread (CUDA devices)

    def emit(self, module: str, type_: str, kind: str, io: str, index: int, tensor: Any) -> None:
        """Copy `tensor` to the host and queue its record with the next sequence number."""
        array = to_host(tensor)
        with self._lock:
            record = Record(seq=self.seq, module=module, type=type_, kind=kind, io=io, index=index,
                            dtype=canonical(array.dtype), shape=list(array.shape), step=self.step)
            self.seq += 1
            self.sink.put(record, array)

    def probe(self, name: str, tensor: Any) -> None:
        """Record a hand-placed probe; repeated names in one step get index 0, 1, 2, ... in call order."""
        with self._lock:
            index = self._probes[name]
            self._probes[name] += 1
        self.emit(name, "probe", "probe", "output", index, tensor)


_active: Session | None = None


def active() -> Session | None:
    """The session `aligner.save` writes to, or None outside a dump context."""
    return _active


def activate(session: Session | None) -> Session | None:
    """Make `session` the active one and return the previous one (to restore on exit)."""
    global _active
    previous, _active = _active, session
    return previous
