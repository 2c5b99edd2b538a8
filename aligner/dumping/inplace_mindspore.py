"""MindSpore writes in place while a dump defers its reads (`session.DEFER`: a CPU target).

A deferred record holds its tensor and reads it at the flush. A write in place before then (`h[0] = 0` in a parent's
construct after a child returned `h`, `x.masked_fill_(...)`, `ops.assign`) would make the record show numbers its
module never returned, so that a compare blames the child for its parent's write; and a later input linked to the
record by identity would claim the old numbers. MindSpore's `_version` counts none of `__setitem__`, `assign` or
`set_data` (and reading it waits for the op). So while such a dump is open, every Python entry point that writes a
tensor in place first tells the session (`Session.writing_in_place`), which reads every tensor it holds then (a
flush, behind the ops already issued and ahead of the write) and links nothing it has seen by identity from then on
(the write may reach any of them through a view). The entry points: Tensor methods ending in `_`, `__setitem__`
and `assign_value`, the functions of `mindspore.ops`/`mint` that write (`assign`, `scatter_update`,
`inplace_add`, `zero_`, ...) or are called with `inplace=True`, and the Assign/Scatter/Inplace primitives a cell may
hold. `@mindspore.jit` code calling them runs as before (`_guard`). A model with none of them pays for the patching
alone. Writes the dump cannot see (a custom kernel writing its
input) are not caught; Parameters, which BatchNorm and optimizers change in place, are copied when recorded.

The guards are installed once for every such dump open in the process and removed when the last one leaves, so that
contexts exited in any order (A enters, B enters, A exits) leave B guarded and, after both, every entry point as it
was.
"""
from __future__ import annotations

import enum
import functools
import inspect
import re
import threading
from typing import Any, Callable

import mindspore

from aligner.dumping.ops_mindspore import FUNCTIONS, NAMESPACES, Patches
from aligner.dumping.scope import inplace
from aligner.dumping.session import Session

# Tensor methods that write their tensor without the trailing underscore; and `_` names that write nothing. Of the
# in-place operators only `__setitem__` writes: MindSpore's `x += y` returns a new tensor (tests/dumping check it).
_TENSOR_WRITES = frozenset({"assign_value", "__setitem__"})
_NOT_WRITES = frozenset({"requires_grad_", "is_", "shape_", "print_"})
# functions of mindspore.ops / mint that write their first argument (besides names ending in `_`)
_FUNCTION_WRITES = re.compile(r"(assign(_add|_sub)?|inplace_\w+|scatter_(nd_)?(update|add|sub|mul|div|max|min)"
                              r"|scatter_non_aliasing_add)")
# the primitives of mindspore.ops whose instances write an input (a cell may hold `ops.Assign()`; the optimizers'
# Apply* change Parameters, which are copied anyway)
_PRIMITIVE_WRITES = re.compile(r"(Assign|Inplace|Scatter|IndexAdd)\w*")


class _When(enum.Enum):
    """When an entry point writes: on every call, or when called with inplace=True."""

    ALWAYS = enum.auto()
    KEYWORD = enum.auto()


@functools.cache
def _entry_points() -> tuple[tuple[Any, str, _When, int], ...]:
    """(owner, name, when, at: the argument it writes) of every entry point that writes in place, found once per
    process. A writing primitive class gets a `__call__` of its own (patching `Primitive.__call__` instead costs ~0.8 ms
    a context: setting it touches each of its ~1900 subclasses); a primitive's first input is its argument 1."""
    found: list[tuple[Any, str, _When, int]] = []
    tensor = mindspore.Tensor
    for name in dir(tensor):
        if (name in _TENSOR_WRITES or (inplace(name) and not name.startswith("__"))) and name not in _NOT_WRITES:
            if isinstance(inspect.getattr_static(tensor, name), FUNCTIONS):
                found.append((tensor, name, _When.ALWAYS, 0))
    for _, module in NAMESPACES:
        for name, value in vars(module).items():
            if name.startswith("_") or not isinstance(value, FUNCTIONS):
                continue
            if (name.endswith("_") and name not in _NOT_WRITES) or _FUNCTION_WRITES.fullmatch(name):
                found.append((module, name, _When.ALWAYS, 0))
            elif "inplace" in _parameters(value):
                found.append((module, name, _When.KEYWORD, 0))
    found.extend((cls, "__call__", _When.ALWAYS, 1) for name, cls in vars(mindspore.ops).items()
                 if isinstance(cls, type) and issubclass(cls, mindspore.ops.Primitive)
                 and _PRIMITIVE_WRITES.fullmatch(name))
    return tuple(found)


def _parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return ()


class _Open:
    """The sessions the guards tell (every deferred MindSpore dump open in the process) and the guards' patches,
    installed while there is one."""

    lock = threading.Lock()
    sessions: tuple[Session, ...] = ()  # replaced, never changed in place: a guard iterates it without the lock
    patches: Patches | None = None


def _guard(fn: Callable[..., Any], when: _When, at: int) -> Callable[..., Any]:
    """`fn`, telling every open session before it writes its argument `at` (a primitive's first input is its argument
    1). The wrapper names `fn` as `__wrapped__`: MindSpore's graph compiler, parsing what `@mindspore.jit` code calls
    by name, follows it to `fn` (without it, a guarded `F.assign` failed nn.Adam's jitted construct: the compiler
    parsed the wrapper and met the session's lock)."""
    def tell(args: tuple) -> None:
        for session in _Open.sessions:
            session.writing_in_place(args[at] if len(args) > at else None)

    if when == _When.ALWAYS:
        def writes(*args: Any, **kwargs: Any) -> Any:
            tell(args)
            return fn(*args, **kwargs)
    else:
        def writes(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("inplace") is True:
                tell(args)
            return fn(*args, **kwargs)
    writes.__wrapped__ = fn  # type: ignore[attr-defined]
    return writes


# entry point's index in `_entry_points()` -> (what it was, its guard): one wrapper per entry point for the process,
# made again only when the entry point has changed since (a dump context made 146 of them, ~0.3 ms)
_guards: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _patched() -> Patches:
    """Every entry point guarded; the handle's `remove` puts them back."""
    # what each entry point is now (another patch of the user's included), all read before any is replaced: a class
    # inheriting a guarded `__call__` gets the original
    now = [getattr(owner, name) for owner, name, _, _ in _entry_points()]
    patches = Patches()
    try:
        for i, ((owner, name, when, at), original) in enumerate(zip(_entry_points(), now)):
            known = _guards.get(i)
            if known is None or known[0] is not original:
                known = _guards[i] = (original, _guard(original, when, at))
            patches.set(owner, name, known[1])
    except BaseException:
        patches.remove()
        raise
    return patches


class Guarded:
    """One session's place among those the guards tell; `remove` takes it out (and the guards with the last)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        with _Open.lock:
            if not _Open.sessions:
                _Open.patches = _patched()
            _Open.sessions += (session,)

    def remove(self) -> None:
        with _Open.lock:
            kept = tuple(s for s in _Open.sessions if s is not self.session)
            if len(kept) == len(_Open.sessions):  # removed already
                return
            _Open.sessions = kept
            if not _Open.sessions and _Open.patches is not None:
                _Open.patches.remove()
                _Open.patches = None


def install(session: Session) -> Guarded:
    """Guard every entry point for `session` (with every other open session); the handle's `remove` ends it."""
    return Guarded(session)
