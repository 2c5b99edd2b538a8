"""How code below `render/` reports progress without formatting anything: a small protocol that `render/` implements.

Pipelines take an optional `Progress`; the CLI passes rich's (on a terminal only), library users pass their own or
nothing.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Protocol


class Task(Protocol):
    """One bar: advanced as work completes."""

    def advance(self, amount: int = 1) -> None: ...


class Progress(Protocol):
    """Starts a task of known size; the context manager ends it."""

    def task(self, description: str, total: int) -> contextlib.AbstractContextManager[Task]: ...


class _Silent:
    def advance(self, amount: int = 1) -> None:
        pass


class NoProgress:
    """The default: reports nothing."""

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Task]:
        yield _Silent()


SILENT: Progress = NoProgress()
