"""Where compare's independent work runs: here (the default, no cluster needed) or on an existing Ray cluster.

An engine maps a picklable function over a list of independent tasks (per-rank comparisons, batches of tensor pairs)
and returns the results in order. Files are read by whoever runs a task, so a cluster's workers must see the same
paths (shared storage). Ray, not Dask: the LLM RL stacks whose dumps this compares (verl, OpenRLHF) already run a Ray
cluster, and `ray.init(address=...)` joins it as one more driver.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import urllib.parse
from typing import IO, Any, Callable, Iterator, Protocol, Sequence, TypeVar

from aligner.core.errors import AlignerError

T = TypeVar("T")
R = TypeVar("R")

ENGINES = ("local", "ray")
LOCAL_CLUSTER = "local"  # --address local: start a throwaway single-node Ray cluster for this run
# Connecting to a live head takes 1-2 s here. A port that refuses or never answers fails the probe at once or within
# PROBE_TIMEOUT; one that accepts TCP but is no Ray head makes ray.init retry for minutes (measured: still waiting
# after 5 min against an HTTP server), so the whole join is bounded by CONNECT_TIMEOUT.
PROBE_TIMEOUT = 5.0
CONNECT_TIMEOUT = 60.0
_GCS_PORT = 6379      # what `ray start --head` listens on unless told otherwise
_CLIENT_PORT = 10001  # the Ray Client server's default (ray://host)


class Engine(Protocol):
    """Runs independent tasks; `map` keeps the order of `items`."""

    name: str
    workers: int  # how many tasks can run at once (CPUs of the cluster; 1 here)

    def map(self, fn: Callable[[T], R], items: Sequence[T], done: Callable[[R], None] | None = None) -> list[R]:
        """fn(item) for every item, results in the order of `items`; `done(result)` as each one finishes."""
        ...

    def close(self) -> None: ...


class LocalEngine:
    """The default: tasks run one after another in this process (compare parallelises metric work itself)."""

    name = "local"
    workers = 1

    def map(self, fn: Callable[[T], R], items: Sequence[T], done: Callable[[R], None] | None = None) -> list[R]:
        out = []
        for item in items:
            out.append(fn(item))
            if done:
                done(out[-1])
        return out

    def close(self) -> None:
        pass


class RayEngine:
    """Tasks as Ray tasks (one CPU each) on the cluster this process joined; `close` leaves the cluster running,
    or stops it when this engine started it (--address local)."""

    name = "ray"

    def __init__(self, ray: Any, address: str, owned: bool) -> None:
        self._ray = ray
        self.address = address  # as the user named it ("auto" when taken from the environment)
        self._owned = owned     # this engine called ray.init, so close() calls ray.shutdown
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[[T], R], items: Sequence[T], done: Callable[[R], None] | None = None) -> list[R]:
        ray = self._ray

        def task(item: T) -> R:  # `fn` travels once with the function, not once per task
            return fn(item)

        remote = ray.remote(num_cpus=1)(task)
        refs = [remote.remote(item) for item in items]
        try:
            if done:
                pending = list(refs)
                while pending:
                    ready, pending = ray.wait(pending, num_returns=1)
                    done(ray.get(ready[0]))
            return list(ray.get(refs))
        except ray.exceptions.RayTaskError:
            raise  # the function itself failed: its own exception, with the worker's traceback
        except ray.exceptions.RayError as exc:  # a worker or node died past Ray's retries, an object was lost
            raise AlignerError(f"the Ray cluster at {self.address} lost a task: {_first_line(exc)}") from exc

    def close(self) -> None:
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()


def open_engine(name: str | None = None, address: str | None = None, workers: int | None = None) -> Engine:
    """The engine called `name` ("local" when None); AlignerError for an unknown name or a cluster not reachable.

    "ray" joins an existing cluster: `address` (host:port of its head, ray://host:port for Ray Client), else
    $RAY_ADDRESS, else the cluster started on this machine by `ray start --head`; never a silently started local one.
    `address` "local" starts a throwaway single-node cluster with `workers` CPUs (default: all), stopped by close().
    A process already connected to a cluster (ray.init called, e.g. a verl driver) uses that one when no address is
    given.
    """
    if name in (None, "local"):
        if address is not None:
            raise AlignerError(f"--address {address}: only for --engine ray (the local engine needs no cluster)")
        return LocalEngine()
    if name != "ray":
        raise AlignerError(f"--engine {name}: unknown engine (choose {' or '.join(ENGINES)})")
    return _join_ray(address, workers)


def _join_ray(address: str | None, workers: int | None) -> RayEngine:
    try:
        import ray
    except ImportError as exc:
        raise AlignerError("--engine ray needs Ray installed: pip install 'aligner[cluster]'") from exc
    if workers is not None and address != LOCAL_CLUSTER:
        raise AlignerError("--workers with --engine ray sizes only --address local; a joined cluster's CPUs decide")
    if ray.is_initialized():
        if address is not None:
            raise AlignerError(f"--address {address}: this process is already connected to a Ray cluster; "
                               f"give no address to use that one")
        return RayEngine(ray, "the connected cluster", owned=False)
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if target == LOCAL_CLUSTER:
        # in this thread: the processes of the new cluster die with the thread that started them (PR_SET_PDEATHSIG)
        try:
            ray.init(num_cpus=workers, include_dashboard=False, **options)
        except Exception as exc:  # no room for its object store, ports taken, ...
            raise AlignerError(f"could not start a local Ray cluster: {_first_line(exc)}") from exc
    else:
        if target != "auto":
            _probe(target)
        _join_within(ray, target, options, CONNECT_TIMEOUT)
    return RayEngine(ray, target, owned=True)


def _host_port(address: str) -> tuple[str, int]:
    """(host, port) of a head address: host:port, a bare host, or ray://host[:port]."""
    client = address.startswith("ray://")
    split = urllib.parse.urlsplit(address if client else f"//{address}")
    try:
        port = split.port
    except ValueError as exc:
        raise AlignerError(f"--address {address}: not host:port ({exc})") from exc
    if not split.hostname:
        raise AlignerError(f"--address {address}: not host:port")
    return split.hostname, port or (_CLIENT_PORT if client else _GCS_PORT)


def _probe(address: str) -> None:
    """Fail fast, in one line, when nothing listens at the cluster's address (ray.init would retry for minutes)."""
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise AlignerError(f"--address {address}: no Ray cluster reachable at {host}:{port} ({why}); start one "
                           f"with `ray start --head` or name its head node") from exc


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def _held_stderr() -> Iterator[IO[bytes]]:
    """The process's stderr (file descriptor 2, where Ray's C++ core writes) into a temp file, and back after."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield held
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _join_within(ray: Any, address: str, options: dict[str, Any], timeout: float) -> None:
    """ray.init(address) in a daemon thread, given up after `timeout` seconds (it cannot be cancelled; a CLI run
    exits right after the error, abandoning the thread). What the attempt writes to stderr is held back: replayed
    when it joins, dropped when it fails, so a failure is our one line, not Ray's warning per retry before it."""
    failure: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address, **options)
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=connect, name="aligner-ray-init", daemon=True)
    with _held_stderr() as held:
        thread.start()
        thread.join(timeout)
        held.seek(0)
        said = held.read()
    if said and not thread.is_alive() and not failure:
        sys.stderr.write(said.decode(errors="replace"))
    if thread.is_alive():
        raise AlignerError(f"could not join the Ray cluster at {address}: no answer within {timeout:g} s (is it a "
                           f"Ray head node's address?)")
    if failure:
        raise AlignerError(f"could not join the Ray cluster at {address}: {_first_line(failure[0])}") from failure[0]
