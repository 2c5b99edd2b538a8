"""Where captured tensors go: a background thread that writes a full dump directory, a batch of a stats-only dump's
records, or an in-memory list.

Full dumps: hooks hand over a host copy of each tensor and return at once; the writer thread computes statistics,
hashes the bytes, writes `tensors/<digest>.npy` (once per distinct tensor) and appends the record to
`manifest.jsonl`, so a training step waits on disk only when the bounded queue is full. Stats-only dumps: each record
arrives with statistics computed where its tensor lives (`aligner.dumping.fstats`) and no data; appending ~300 bytes
is cheaper on the training thread, in batches, than handing each record to a thread (and the GIL with it).

Neither fsyncs: a dump is read once the training process has ended, and the page cache outlives a crashed process
(an fsync per step cost up to 10 ms here, for a power cut the tensor files were never guarded against either).

Tensor files of DIRECT_MIN_BYTES or more are written with O_DIRECT where the file system takes it (`DirectWriter`):
the disk reads them from the writer's buffer, with no copy into the page cache and no dirty pages for the kernel to
write back, work that otherwise takes the cores training runs on (614 MB here: 0.03-0.05 s of CPU instead of 0.2-0.9
s). Smaller files go through the page cache: an O_DIRECT write waits for the disk (~0.14 ms a file here, whatever its
size), which a step of many small tensors then waits for at the context's exit, while writing back a few KiB costs
the kernel little.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import io
import mmap
import os
import queue
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from aligner.core.dtypes import to_storable
from aligner.core.errors import AlignerError
from aligner.core.progress import SILENT, Progress
from aligner.dumping.manifest import MANIFEST, TENSOR_DIR, Record
from aligner.dumping.session import Sink
from aligner.metrics.kernel import digest as kernel_digest
from aligner.metrics.stats import Stats, fast_stats, fast_stats_digest, tensor_stats

_STOP = object()
# The most bytes of host copies waiting for the writer thread (one larger tensor still passes alone): with the item
# count bound below, what a full dump holds in memory beyond the model's own tensors.
MAX_QUEUED_BYTES = 512 << 20


def digest(array: np.ndarray) -> str:
    """Content address of a stored array: dtype, shape and bytes (so equal bytes in another shape differ). XXH3-128,
    a non-cryptographic hash: 30 GB/s here against blake2b's 0.7 GB/s (0.9 s of every 622 MB step); file names only
    need to tell a dump's own tensors apart, not to resist a forger."""
    return kernel_digest(_head(array), np.ascontiguousarray(array)).hex()


def _head(array: np.ndarray) -> bytes:
    """What the digest hashes before an array's bytes."""
    return f"{array.dtype.str}{array.shape}".encode()


def stats_and_name(array: np.ndarray) -> tuple[Stats, str]:
    """A tensor's statistics and its file's name (`digest` of what is stored, `to_storable`): for float32/float64,
    one pass of the kernel over its memory."""
    stored = to_storable(array)
    both = fast_stats_digest(array, _head(array)) if stored is array else None
    if both is not None:
        return both[0], f"{both[1].hex()}.npy"
    return fast_stats(array), f"{digest(stored)}.npy"


# The smallest tensor file written with O_DIRECT. Here an O_DIRECT write costs ~0.14 ms a file plus ~0.75 ms a MiB,
# one through the page cache ~0.05 ms plus ~0.2 ms a MiB and, later, 0.3-1.5 ms a MiB of the kernel's writeback: they
# cost about the same at 256 KiB (docs/scale-mindspore.md has the figures by file size).
DIRECT_MIN_BYTES = 256 << 10
# how a tensor file (a temporary the writer names) is opened: never through a link planted at its name, never
# inherited by a child process
_NEW = os.O_NOFOLLOW | os.O_CLOEXEC
SMALL_FILE_BYTES = 64 << 10  # data written with its header in one system call (joining them copies the data)


class DirectWriter:
    """Writes .npy files of `min_bytes` (default DIRECT_MIN_BYTES) of data or more with O_DIRECT from one page-aligned
    buffer it reuses (as large as the largest file so far): header and C-order data copied in, the whole 4 KiB blocks
    written straight to the disk and the last partial block through the page cache (the same descriptor with O_DIRECT
    cleared), so the file is never longer than its length (cutting it back cost ~0.06 ms a file)."""

    ALIGN = 4096

    def __init__(self, min_bytes: int | None = None) -> None:
        self.supported = hasattr(os, "O_DIRECT")  # False once the file system has refused it
        self.min_bytes = DIRECT_MIN_BYTES if min_bytes is None else min_bytes
        self._buffer: mmap.mmap | None = None

    def save(self, path: str | Path, array: np.ndarray) -> bool:
        """Write `array` to `path` as np.save would; False (nothing written, or the file begun: write it another way)
        for an array under `min_bytes` or where the file system does not take O_DIRECT."""
        if not self.supported or array.nbytes < self.min_bytes:
            return False
        head = npy_header(array.dtype, array.shape)  # padded to 64 bytes: the data starts aligned for any dtype
        size = len(head) + array.nbytes
        padded = -(-size // self.ALIGN) * self.ALIGN
        if self._buffer is None or len(self._buffer) < padded:
            if self._buffer is not None:
                self._buffer.close()
            self._buffer = mmap.mmap(-1, padded)
        raw = np.frombuffer(self._buffer, np.uint8, count=padded)
        raw[:len(head)] = np.frombuffer(head, np.uint8)
        np.copyto(raw[len(head):size].view(array.dtype).reshape(array.shape), array)
        whole = size // self.ALIGN * self.ALIGN
        fd = None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT | _NEW, 0o666)
            _write_all(fd, memoryview(self._buffer)[:whole])
            if whole < size:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                _write_all(fd, memoryview(self._buffer)[whole:size])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.supported = False  # refused at the open or at the first write: through the page cache from now on
            return False
        finally:
            if fd is not None:
                os.close(fd)
        return True

    def write(self, path: str | Path, array: np.ndarray) -> None:
        """Write `array` to `path` as np.save writes a C-ordered array: with O_DIRECT where `save` takes it, else
        through the page cache, header and data in one system call (how every tensor file of a full dump is
        written)."""
        if self.save(path, array):
            return
        data = array if array.flags.c_contiguous else np.ascontiguousarray(array)  # (never 0-d to 1-d)
        head = npy_header(data.dtype, data.shape)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NEW, 0o666)
        try:
            if data.nbytes < SMALL_FILE_BYTES:  # one write: header and data joined (a copy of a few KiB)
                _write_all(fd, memoryview(head + data.tobytes()))
            else:
                _write_all(fd, memoryview(head))
                _write_all(fd, data.reshape(-1).view(np.uint8).data)
        finally:
            os.close(fd)


@functools.lru_cache(maxsize=1024)
def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The .npy header np.save writes for a C-ordered array (format 1.0; 2.0 where it is over 64 KiB, a shape of
    thousands of dimensions). Cached: a dump writes the same few shapes step after step."""
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    header = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(header, fields)
    except ValueError:
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, fields)
    return header.getvalue()


def _append(path: Path) -> io.TextIOWrapper:
    """The manifest opened to append lines (UTF-8), never through a link planted at its name."""
    return open(os.open(path, os.O_WRONLY | os.O_APPEND | _NEW), "a", encoding="utf-8")


def _write_all(fd: int, data: memoryview) -> None:
    """Write all of `data` to `fd` (os.write may take part of it)."""
    while data:
        data = data[os.write(fd, data):]


class MemorySink(Sink):
    """Keeps (record, array) pairs in memory; used by `check_determinism`."""

    host_arrays = True

    def __init__(self) -> None:
        self.items: list[tuple[Record, np.ndarray]] = []

    def put(self, record: Record, array: np.ndarray | None) -> None:
        if array is None:  # a link to an earlier record (same_as): nothing to keep
            return
        record.stats = tensor_stats(array)
        self.items.append((record, array))

    def close(self) -> None:
        """Nothing to flush."""


# Records a stats-only dump holds before appending them to its manifest (~300 bytes each: ~3 MB at most).
FLUSH_RECORDS = 10_000


class StatsSink(Sink):
    """A stats-only dump's records, appended to the manifest from the training thread every FLUSH_RECORDS and at
    close. A record arrives with its statistics; one with a host copy (the host-statistics path scripts/bench_dump.py
    times as "before") gets them computed here."""

    host_arrays = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lines: list[str] = []
        self._error: AlignerError | None = None  # the first failed append: raised again by every put and by close

    def put(self, record: Record, array: np.ndarray | None) -> None:
        """Keep one record (after a failed append, raise that failure: the records since cannot be written)."""
        if self._error is not None:
            raise self._error
        if array is not None:
            record.stats = fast_stats(array)
        self._lines.append(record.to_json())
        if len(self._lines) >= FLUSH_RECORDS:
            self._flush()

    def close(self) -> None:
        """Append what is left; raise the first failed append."""
        if self._error is None:
            self._flush()
        if self._error is not None:
            raise self._error

    def _flush(self) -> None:
        lines, self._lines = self._lines, []
        if not lines:
            return
        try:
            with _append(self.directory / MANIFEST) as manifest:
                manifest.write("\n".join(lines) + "\n")
        except OSError as exc:
            self._error = AlignerError(f"writing dump {self.directory} failed: {exc}")
            raise self._error from exc


class _Threads:
    """Daemon threads kept between full dumps, each running one writer at a time: starting a thread cost ~0.25 ms
    of every dumped step at millisecond MindSpore steps (the step's own threads hold the cores). A thread that has
    run its writer waits for the next; a forked child starts afresh (its parent's threads are not in it)."""

    _lock = threading.Lock()
    _idle: list[queue.SimpleQueue] = []

    @classmethod
    def run(cls, job: Callable[[], None]) -> None:
        """Run `job` on an idle thread, or a new one."""
        with cls._lock:
            slot = cls._idle.pop() if cls._idle else None
        if slot is None:
            slot = queue.SimpleQueue()
            threading.Thread(target=cls._serve, args=(slot,), name="aligner-dump-writer", daemon=True).start()
        slot.put(job)

    @classmethod
    def _serve(cls, slot: queue.SimpleQueue) -> None:
        while True:
            slot.get()()  # a job never raises: BackgroundWriter._run keeps every error for its caller
            with cls._lock:
                cls._idle.append(slot)

    @classmethod
    def forget(cls) -> None:
        """In a forked child: no thread of the parent's is there, and the lock may have been held at the fork."""
        cls._lock, cls._idle = threading.Lock(), []


os.register_at_fork(after_in_child=_Threads.forget)


class BackgroundWriter(Sink):
    """Appends a full dump's records and tensor files to its directory from a worker thread; `close` waits for it
    and raises any write error."""

    def __init__(self, directory: Path, written: set[str], max_records: int = 4096, progress: Progress = SILENT,
                 max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self.directory = directory
        self.progress = progress
        self.stored = 0  # records written so far (read by close() for its progress bar)
        self.host_arrays = True
        self.written = written  # digests already on disk in this directory (shared across context entries)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # batches of records (put_many), bounded below
        self.max_records, self.max_bytes = max_records, max_bytes
        self._queued_records = 0  # records queued and not yet written
        self._queued_bytes = 0  # bytes of their host copies
        self._records = 0  # records queued so far (close() shows those not yet written)
        self._room = threading.Condition()
        self._error: BaseException | None = None
        self._direct = DirectWriter()
        self._made = False  # whether the tensor folder is known to exist
        self._done = threading.Event()  # set once the worker has written (or dropped) everything and stopped
        self._pid = os.getpid()  # a forked child has no worker: nothing to wait for there
        _Threads.run(self._run)

    def put(self, record: Record, array: np.ndarray | None) -> None:
        """Queue one tensor, or a record with no data (None); blocks only while the queue is full; raises if an earlier
        write failed."""
        self.put_many([(record, array)])

    def put_many(self, items: list[tuple[Record, np.ndarray | None]]) -> None:
        """`put` each of `items` in order, as one item of the queue: the thread wakes once for them (a MindSpore
        step's records all arrive at its context's exit: handed one by one, the thread woke for each and took the GIL
        from the flush, ~1-2 ms a step at the twin CNN's 70 ms, docs/scale-mindspore.md)."""
        self._raise_if_failed()
        if not items:
            return
        size = sum(array.nbytes for _, array in items if array is not None)
        with self._room:  # a batch over either cap still goes through, alone
            while self._queued_records and (self._queued_bytes + size > self.max_bytes
                                            or self._queued_records + len(items) > self.max_records) \
                    and self._working():
                self._room.wait(timeout=1.0)
            self._queued_bytes += size
            self._queued_records += len(items)
            self._records += len(items)
        self._queue.put((items, size))

    def close(self) -> None:
        """Write everything still queued (with a progress bar where the caller gave one), stop the thread, and raise
        the first write error if there was one."""
        start, pending = self.stored, self._records - self.stored
        self._queue.put(_STOP)
        with self.progress.task("writing dump", total=pending) as task:
            shown = 0
            while self._working():
                self._done.wait(timeout=0.1)
                done = min(self.stored - start, pending)
                task.advance(done - shown)
                shown = done
        self._raise_if_failed()

    def _working(self) -> bool:
        """Whether the worker may still write (never in a forked child, where it does not exist)."""
        return not self._done.is_set() and os.getpid() == self._pid

    @property
    def failed(self) -> bool:
        """Whether a write has failed (close raises it)."""
        return self._error is not None

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            raise AlignerError(f"writing dump {self.directory} failed: {err}") from err

    def _run(self) -> None:
        # every failure is kept for put()/close() to raise in the training thread; the queue is always drained
        try:
            self._write_all()
        finally:
            self._done.set()

    def _write_all(self) -> None:
        manifest = None
        try:
            manifest = _append(self.directory / MANIFEST)
        except OSError as exc:
            self._error = exc
        tensor_dir = self.directory / TENSOR_DIR
        while (batch := self._queue.get()) is not _STOP:
            items, size = batch
            for record, array in items:
                if self._error is None and manifest is not None:
                    try:
                        manifest.write(self._store(tensor_dir, record, array) + "\n")
                        self.stored += 1
                    except BaseException as exc:
                        self._error = exc
            with self._room:
                self._queued_bytes -= size
                self._queued_records -= len(items)
                self._room.notify_all()
        if manifest is not None:
            try:
                manifest.close()
            except OSError as exc:
                self._error = self._error or exc

    def _store(self, tensor_dir: Path, record: Record, array: np.ndarray | None) -> str:
        if array is None:  # a link (same_as)
            return record.to_json()
        record.stats, name = stats_and_name(array)
        if name not in self.written:
            if not self._made:
                tensor_dir.mkdir(exist_ok=True)
                self._made = True
            folder = os.fspath(tensor_dir)
            tmp = f"{folder}/.{name}.tmp"
            self._direct.write(tmp, to_storable(array))
            os.replace(tmp, f"{folder}/{name}")
            self.written.add(name)
        record.file = f"{TENSOR_DIR}/{name}"
        return record.to_json()
