"""Where captured tensors go: a background thread that writes a dump directory, or an in-memory list.

Hooks hand over a host copy of each tensor and return at once; the writer thread computes statistics, hashes the
bytes, writes `tensors/<digest>.npy` (once per distinct tensor) and appends the record to `manifest.jsonl`, so a
training step waits on disk only when the bounded queue is full. In a stats-only dump a tensor on an accelerator
arrives as a record whose statistics were computed where it lives (`aligner.dumping.fstats`), with no data: the
thread only appends it; a CPU tensor's host copy still comes here for its statistics (off the training thread).
"""
from __future__ import annotations

import os
import queue
import threading
from pathlib import Path

import numpy as np
import xxhash

from aligner.core.dtypes import to_storable
from aligner.core.errors import AlignerError
from aligner.core.progress import SILENT, Progress
from aligner.dumping.manifest import MANIFEST, TENSOR_DIR, Record
from aligner.metrics.stats import fast_stats, tensor_stats

_STOP = object()
# The most bytes of host copies waiting for the writer thread (one larger tensor still passes alone): with the item
# count bound below, what a full dump holds in memory beyond the model's own tensors.
MAX_QUEUED_BYTES = 512 << 20


def digest(array: np.ndarray) -> str:
    """Content address of a stored array: dtype, shape and bytes (so equal bytes in another shape differ). XXH3-128,
    a non-cryptographic hash: 12 GB/s here against blake2b's 0.7 GB/s (0.9 s of every 622 MB step); file names only
    need to tell a dump's own tensors apart, not to resist a forger."""
    h = xxhash.xxh3_128()
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).data)
    return h.hexdigest()


class MemorySink:
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


class BackgroundWriter:
    """Appends records to a dump directory from a worker thread; `close` joins it and raises any write error."""

    def __init__(self, directory: Path, stats_only: bool, written: set[str], max_queue: int = 4096,
                 progress: Progress = SILENT, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self.directory = directory
        self.progress = progress
        self.stored = 0  # records written so far (read by close() for its progress bar)
        self.stats_only = stats_only
        self.host_arrays = not stats_only  # stats-only records of device tensors arrive with their statistics
        self.computes_stats = True  # host copies (of CPU tensors, in stats-only dumps too) get statistics here
        self.written = written  # digests already on disk in this directory (shared across context entries)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self.max_bytes = max_bytes
        self._queued_bytes = 0  # bytes of host copies queued and not yet written
        self._room = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="aligner-dump-writer", daemon=True)
        self._thread.start()

    def put(self, record: Record, array: np.ndarray | None) -> None:
        """Queue one tensor, or a record with no data (None); blocks only while the queue is full; raises if an earlier
        write failed."""
        self._raise_if_failed()
        size = 0 if array is None else array.nbytes
        with self._room:  # one tensor larger than the cap still goes through, alone
            while self._queued_bytes and self._queued_bytes + size > self.max_bytes and self._thread.is_alive():
                self._room.wait(timeout=1.0)
            self._queued_bytes += size
        self._queue.put((record, array))

    def close(self) -> None:
        """Write everything still queued (with a progress bar where the caller gave one), stop the thread, and raise
        the first write error if there was one."""
        start, pending = self.stored, self._queue.qsize()
        self._queue.put(_STOP)
        with self.progress.task("writing dump", total=pending) as task:
            shown = 0
            while self._thread.is_alive():
                self._thread.join(timeout=0.1)
                done = min(self.stored - start, pending)
                task.advance(done - shown)
                shown = done
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            raise AlignerError(f"writing dump {self.directory} failed: {err}") from err

    def _run(self) -> None:
        # every failure is kept for put()/close() to raise in the training thread; the queue is always drained
        manifest = None
        try:
            manifest = open(self.directory / MANIFEST, "a", encoding="utf-8")
        except OSError as exc:
            self._error = exc
        while (item := self._queue.get()) is not _STOP:
            if self._error is None and manifest is not None:
                try:
                    manifest.write(self._store(self.directory / TENSOR_DIR, *item) + "\n")
                    self.stored += 1
                except BaseException as exc:
                    self._error = exc
            if item[1] is not None:
                with self._room:
                    self._queued_bytes -= item[1].nbytes
                    self._room.notify_all()
        if manifest is not None:
            try:
                manifest.flush()
                os.fsync(manifest.fileno())
                manifest.close()
            except OSError as exc:
                self._error = self._error or exc

    def _store(self, tensor_dir: Path, record: Record, array: np.ndarray | None) -> str:
        if array is None:  # a link (same_as), or a stats-only record whose stats came with it
            return record.to_json()
        record.stats = fast_stats(array)
        if not self.stats_only:
            stored = to_storable(array)
            name = f"{digest(stored)}.npy"
            if name not in self.written:
                tensor_dir.mkdir(exist_ok=True)
                tmp = tensor_dir / f".{name}.tmp"
                with open(tmp, "wb") as fh:
                    np.save(fh, stored, allow_pickle=False)
                os.replace(tmp, tensor_dir / name)
                self.written.add(name)
            record.file = f"{TENSOR_DIR}/{name}"
        return record.to_json()
