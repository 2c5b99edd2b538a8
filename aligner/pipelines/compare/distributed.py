"""compare's metric work on an Engine (`align compare --engine ray`): batches of pairs go out as records and file
paths, each worker reads the tensor files itself from storage it shares with this machine, and only the metrics come
back. The rows, and so the verdict, are the ones the local run gives: the same `evaluate` on the same files. The
float64 noise of `--calibrate` goes out the same way (`measure_on`).
"""
from __future__ import annotations

import dataclasses
import functools
import socket
from pathlib import Path
from typing import Callable

from aligner.core.errors import AlignerError
from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.pair.matching import Pair
from aligner.dumping.read.source import Item
from aligner.metrics.measure import Metrics
from aligner.pipelines.compare.calibrate import Noise, measure
from aligner.pipelines.compare.engine import Engine
from aligner.pipelines.compare.evaluate import Row, evaluate

TASKS_PER_WORKER = 4  # batches per worker: a slow node or a big tensor holds up at most a quarter of a worker's share
# A Ray task costs about 1 ms to schedule and return here; 4M elements (16 MB of float32 per side) take ~10 ms to
# read and compare, so no batch is made smaller than that unless there are fewer elements in all.
MIN_TASK_ELEMENTS = 1 << 22


@dataclasses.dataclass
class Outcome:
    """What a worker sends back for one pair: its metrics or error, and a file it could not see (None: saw all)."""

    metrics: Metrics | None
    error: str | None
    unseen: str | None = None


def _portable(item: Item | None) -> Item | None:
    """The item with an absolute tensor path: a worker's working directory is not this process's."""
    if item is None or item.path is None or item.path.is_absolute():
        return item
    return dataclasses.replace(item, path=item.path.absolute())


def batches(pairs: list[Pair], workers: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) slices of `pairs` of about equal tensor elements: TASKS_PER_WORKER per worker, none
    under MIN_TASK_ELEMENTS unless that leaves a single one."""
    if not pairs:
        return []
    sizes = [max(1, p.elements) for p in pairs]
    total = sum(sizes)
    count = max(1, min(len(pairs), workers * TASKS_PER_WORKER, total // MIN_TASK_ELEMENTS))
    out: list[tuple[int, int]] = []
    start = done = 0
    for i, size in enumerate(sizes):
        done += size
        if done * count >= total * (len(out) + 1) and len(out) < count - 1:
            out.append((start, i + 1))
            start = i + 1
    if start < len(pairs):
        out.append((start, len(pairs)))
    return out


def _unseen(pair: Pair) -> str | None:
    """A tensor file of `pair` that this process cannot see, if any."""
    return next((str(it.path) for it in (pair.a, pair.b) if it is not None and it.path is not None
                 and not it.path.exists()), None)


def evaluate_batch(tolerance: ToleranceSpec, pairs: list[Pair]) -> tuple[str, list[Outcome]]:
    """Run on a worker: evaluate() each pair; (this host's name, one Outcome per pair)."""
    out = []
    for pair in pairs:
        row = evaluate(pair, tolerance)
        out.append(Outcome(row.metrics, row.error, _unseen(pair) if row.error else None))
    return socket.gethostname(), out


def measure_batch(pairs: list[Pair]) -> tuple[str, list[tuple[Noise | str, str | None]]]:
    """Run on a worker: the float64 noise of each (reference, float64 twin) pair, or why it cannot be measured, with
    a file the worker could not see; (this host's name, one per pair)."""
    out: list[tuple[Noise | str, str | None]] = []
    for pair in pairs:
        assert pair.a is not None and pair.b is not None
        got = measure(pair.a, pair.b)
        out.append((got, _unseen(pair) if isinstance(got, str) else None))
    return socket.gethostname(), out


def _shipped(pairs: list[Pair], workers: int) -> tuple[list[tuple[int, int]], list[list[Pair]]]:
    """The slices of `pairs` a cluster's tasks take, and each slice with absolute tensor paths."""
    slices = batches(pairs, workers)
    return slices, [[Pair(_portable(p.a), _portable(p.b), p.matched_by) for p in pairs[start:stop]]
                    for start, stop in slices]


def _seen(engine: Engine, host: str, unseen: str | None) -> None:
    """AlignerError when a worker could not see a file that this machine can: the dumps are not shared storage."""
    if unseen is not None and Path(unseen).exists():
        raise AlignerError(f"worker {host} of the {engine.name} cluster cannot see {unseen}, which this machine "
                           f"reads: put both dumps on storage every worker mounts at the same path")


def measure_on(engine: Engine, pairs: list[tuple[Item, Item]]) -> list[Noise | str]:
    """measure(reference, twin) of every pair as tasks of `engine`, in order."""
    _, work = _shipped([Pair(ref, twin) for ref, twin in pairs], engine.workers)
    out: list[Noise | str] = []
    for host, results in engine.map(measure_batch, work):
        for got, unseen in results:
            _seen(engine, host, unseen)
            out.append(got)
    return out


def _ticker(progress: Callable[[], None]) -> Callable[[tuple[str, list[Outcome]]], None]:
    """A batch's completion as one progress tick per pair."""
    def done(result: tuple[str, list[Outcome]]) -> None:
        for _ in result[1]:
            progress()
    return done


def evaluate_on(engine: Engine, pairs: list[Pair], tolerance: ToleranceSpec,
                progress: Callable[[], None] | None = None) -> list[Row]:
    """evaluate() of every pair as tasks of `engine`; rows keep this process's pairs. AlignerError when a worker
    cannot see a tensor file that this machine can (the dumps are not on storage the workers share)."""
    slices, work = _shipped(pairs, engine.workers)
    results = engine.map(functools.partial(evaluate_batch, tolerance), work, _ticker(progress) if progress else None)
    rows = []
    for (host, outcomes), (start, _) in zip(results, slices):
        for i, outcome in enumerate(outcomes, start):
            _seen(engine, host, outcome.unseen)
            rows.append(Row(pairs[i], outcome.metrics, outcome.error, read=True))
    return rows
