"""Where compare's independent work runs: here (the default, no cluster needed) or on an existing cluster.

An engine maps a picklable function over a list of independent tasks (per-rank comparisons, batches of tensor pairs)
and returns the results in order. Files are read by whoever runs a task, so a cluster's workers must see the same
paths (shared storage).
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Engine(Protocol):
    """Runs independent tasks; `map` keeps the order of `items`."""

    name: str

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]: ...

    def close(self) -> None: ...


class LocalEngine:
    """The default: tasks run one after another in this process (compare parallelises metric work itself)."""

    name = "local"

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        return [fn(item) for item in items]

    def close(self) -> None:
        pass


def open_engine(name: str | None = None, address: str | None = None) -> Engine:
    """The engine called `name` ("local" when None); `address` names an existing cluster to join."""
    if name in (None, "local"):
        return LocalEngine()
    from aligner.core.errors import AlignerError

    raise AlignerError(f"--engine {name}: unknown engine (choose local)")
