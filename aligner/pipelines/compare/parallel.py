"""compare's metric work on several CPUs of this machine: forked worker processes where they can be forked, else
threads (the kernel releases the GIL). Loaded only when a run is big enough to split (`run._parallel`), so a short
comparison never imports multiprocessing or concurrent.futures.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import sys
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Sequence

from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.pair.matching import Pair
from aligner.pipelines.compare.evaluate import Row, evaluate

_BATCH = 8  # pairs per task handed to a worker process
_FORKED: dict[int, list] = {}  # pairs lists that forked worker processes read by key (inherited, never pickled)
# their tolerances, also inherited: a calibrated spec holds one tolerance per record, too much to pickle per task
_FORKED_TOLERANCE: dict[int, ToleranceSpec] = {}


def evaluate_parallel(pairs: list[Pair], tolerance: ToleranceSpec, workers: int,
                      progress: Callable[[], None] | None = None) -> list[Row]:
    """evaluate() of every pair, `workers` at a time: forked processes on Linux (threads of one process serialize on
    its memory map while they map and drop file pages: 200 x 1M-element pairs took 0.41 s with threads, 0.29 s
    forked), threads elsewhere or when a worker process dies or cannot be started."""
    if sys.platform.startswith("linux") and not multiprocessing.current_process().daemon:
        try:
            return _evaluate_processes(pairs, tolerance, workers, progress)
        except (BrokenProcessPool, OSError):  # a worker died or could not be started: threads instead
            pass
    return evaluate_all(pairs, tolerance, workers, progress)


def _evaluate_batch(key: int, start: int, stop: int) -> list:
    tolerance = _FORKED_TOLERANCE[key]
    return [(row.metrics, row.error) for row in (evaluate(p, tolerance) for p in _FORKED[key][start:stop])]


def _evaluate_processes(pairs: list[Pair], tolerance: ToleranceSpec, workers: int,
                        progress: Callable[[], None] | None) -> list[Row]:
    """evaluate() of every pair in forked worker processes, `_BATCH` pairs per task; rows keep the parent's pairs."""
    key = id(pairs)
    _FORKED[key], _FORKED_TOLERANCE[key] = pairs, tolerance
    rows: list[Row | None] = [None] * len(pairs)
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            tasks = {pool.submit(_evaluate_batch, key, s, min(s + _BATCH, len(pairs))): s
                     for s in range(0, len(pairs), _BATCH)}
            for task in concurrent.futures.as_completed(tasks):
                for i, (metrics, error) in enumerate(task.result(), tasks[task]):
                    rows[i] = Row(pairs[i], metrics, error, read=True)
                    if progress:
                        progress()
    finally:
        del _FORKED[key], _FORKED_TOLERANCE[key]
    return rows  # type: ignore[return-value]


def evaluate_all(pairs: Sequence[Pair], tolerance: ToleranceSpec, workers: int,
                 progress: Callable[[], None] | None = None) -> list[Row]:
    """Evaluate every pair in `workers` threads, calling `progress` after each."""
    def run(pair: Pair) -> Row:
        row = evaluate(pair, tolerance)
        if progress:
            progress()
        return row

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, pairs))
