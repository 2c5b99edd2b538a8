"""Full dumps still being written after their context exited (`aligner.dump(..., wait=False)`).

Such a context returns once its step's records are handed to the directory's writer thread, which writes them while
the next step runs. Before anything in this process reads a dump, it waits here for every such writer (the readers
in aligner.dumping.read call `settle`), and so does the process's exit, so a dump is complete whenever it is read.
A write error is raised by the next context on the directory, by `wait_dumps`, or printed at exit.
"""
from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from aligner.core.errors import AlignerError

_finishers: dict[Path, Callable[[], None]] = {}  # directory -> waits for its writer, raising its write error
_lock = threading.Lock()
_at_exit = False


def hold(path: Path, finish: Callable[[], None]) -> None:
    """Register `path`'s writer as still writing; `finish` waits for it (and raises its write error)."""
    global _at_exit
    with _lock:
        _finishers[path] = finish
        if not _at_exit:
            atexit.register(_settle_at_exit)
            _at_exit = True


def take(path: Path) -> None:
    """`path`'s writer is in use again (a later context writes through it) or done: no longer waited for here."""
    with _lock:
        _finishers.pop(path, None)


def settle() -> None:
    """Wait for every writer still writing a dump of this process; raise the first write error (AlignerError) after
    all have finished."""
    if not _finishers:  # the usual case: nothing pending, no lock taken
        return
    with _lock:  # each leaves the registry once its writer is done (a finish under way makes a second one wait)
        finishers = list(_finishers.values())
    first: AlignerError | None = None
    for finish in finishers:
        try:
            finish()
        except AlignerError as exc:
            first = first or exc
    if first is not None:
        raise first


def wait_dumps() -> None:
    """Wait until every full dump this process wrote with `wait=False` is on disk; raise the first write error."""
    settle()


def _settle_at_exit() -> None:
    try:
        settle()
    except AlignerError as exc:  # the process is ending: say so on stderr rather than lose it
        print(f"aligner: {exc}", file=sys.stderr)
