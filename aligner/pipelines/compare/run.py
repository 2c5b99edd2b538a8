"""The `align compare` pipeline: read both sides -> match records -> metrics -> verdicts -> a CompareResult."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from aligner.core.collect import gc_paused
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.core.progress import SILENT, Progress
from aligner.core.tolerance import CALIBRATION_K, ToleranceSpec
from aligner.dumping.pair.matching import Pair
from aligner.dumping.pair.paired import check_same_model, read_pair
from aligner.pipelines import compare as package  # the parts loaded on first use: see compare/__init__.py
from aligner.pipelines.compare.engine import Engine, LocalEngine
from aligner.pipelines.compare.evaluate import Row, evaluate
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.verdict import bisect as bisect_rows
from aligner.pipelines.compare.verdict import judge

if TYPE_CHECKING:
    from aligner.pipelines.compare.calibrate import Calibration


def label(root: Path, framework: str) -> str:
    """"dumps_ms/ (mindspore)": the framework a known name, or "unknown framework" (never the manifest's own text,
    which the zoom-in code and commands would otherwise echo)."""
    return f"{root} ({Framework.parse(framework) or 'unknown framework'})"


# Below either size one worker is fastest: per-pair Python work dominates, threads queue on the GIL and worker
# processes on handing results back (1024 pairs of 16K-element tensors: 0.19 s in one worker, 0.21 s in two
# processes, ~2x slower in two threads; 64 pairs of 256K-element tensors: 0.089 s in one, 0.064 s in two processes).
_PARALLEL_MIN_ELEMENTS = 1 << 24  # tensor elements of the whole run, both sides
_PARALLEL_MIN_PAIR_ELEMENTS = 1 << 18  # mean tensor elements per pair, both sides


def _parallel(pairs: list[Pair], workers: int) -> bool:
    """Whether this run is worth spreading over `workers`: enough pairs, and big tensors (`package.evaluate_parallel`
    picks processes or threads)."""
    if workers < 2 or len(pairs) < 2 * workers:
        return False
    total = sum(p.elements for p in pairs)
    return not (total < _PARALLEL_MIN_ELEMENTS or total < _PARALLEL_MIN_PAIR_ELEMENTS * len(pairs))


def evaluate_pairs(pairs: list, tolerance: ToleranceSpec, workers: int | None,
                   progress: Callable[[], None] | None = None, engine: Engine | None = None) -> list[Row]:
    """Evaluate each distinct pair of tensor files once (an input linked to the output that returned it is the same
    pair of files), then give every row its pair's result."""
    first: dict[tuple, int] = {}
    owner = list(range(len(pairs)))  # the row whose result each row takes (itself, or the first with its files)
    for i, p in enumerate(pairs):
        if p.a is not None and p.b is not None and p.a.path and p.b.path:
            ref = p.b.record
            owner[i] = first.setdefault((p.a.path, p.b.path, tolerance.chosen(ref.module, (ref.step, ref.seq))), i)
    unique = [i for i, o in enumerate(owner) if o == i]
    rows = _evaluate_unique([pairs[i] for i in unique] if len(unique) < len(pairs) else pairs, tolerance, workers,
                            progress, engine)
    if len(unique) == len(pairs):
        return rows
    if progress:
        for _ in range(len(pairs) - len(unique)):
            progress()
    done = dict(zip(unique, rows))
    return [done[i] if owner[i] == i else Row(pairs[i], done[owner[i]].metrics, done[owner[i]].error, read=True)
            for i in range(len(pairs))]


def _evaluate_unique(pairs: list, tolerance: ToleranceSpec, workers: int | None,
                     progress: Callable[[], None] | None = None, engine: Engine | None = None) -> list[Row]:
    """Tasks of `engine` when one is given (a cluster, not the LocalEngine); else one worker for short runs and
    small tensors, or several (`package.evaluate_parallel`: forked worker processes or threads)."""
    if engine is not None and engine.name != LocalEngine.name:
        return package.evaluate_on(engine, pairs, tolerance, progress)
    n = workers or os.cpu_count() or 1
    if _parallel(pairs, n):
        return package.evaluate_parallel(pairs, tolerance, n, progress)
    rows = []
    for pair in pairs:
        rows.append(evaluate(pair, tolerance))
        if progress:
            progress()
    return rows


@gc_paused()
def compare(dumps_a: str, dumps_b: str, *, ref: str | None = None, map_file: str | None = None,
            tolerance: ToleranceSpec | None = None, bisect: bool = False, workers: int | None = None,
            strict: bool = False, calibrate: str | None = None, calibrate_k: float = CALIBRATION_K,
            progress: Progress = SILENT, engine: Engine | None = None, trust_pickle: bool = False) -> CompareResult:
    """Compare dump directory A against the reference B (PyTorch by default) and find where they part.

    calibrate: a float64 dump of the reference model on the same input (`aligner.noise_floor`); each reference
    record's tolerance becomes `calibrate_k` times its own error against float64 where that exceeds the default.
    engine: where the metrics of the pairs are computed (`open_engine`; None or the local engine: here, as `workers`
    says); the calibration pass stays here. trust_pickle: msprobe's PyTorch `.pt` tensors may be read.
    Raises AlignerError for unusable input (missing directory, bad --map, both arguments the same directory, a
    float64 dump that cannot calibrate this comparison, --bisect with an engine).
    """
    if bisect and engine is not None and engine.name != LocalEngine.name:
        raise AlignerError(f"--bisect reads a few pairs one after another: nothing for --engine {engine.name} to "
                           f"distribute")
    paired = read_pair(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=tolerance, trust_pickle=trust_pickle)
    migrated, reference, pairs, tolerance = paired.migrated, paired.reference, paired.pairs, paired.tolerance
    check_same_model(pairs, migrated, reference)
    calibration: Calibration | None = None
    if calibrate is not None:
        cluster = engine if engine is not None and engine.name != LocalEngine.name else None
        calibration = package.calibrate_pairs(calibrate, pairs, reference, migrated, tolerance, calibrate_k, workers,
                                              cluster)
        tolerance = dataclasses.replace(tolerance, calibrated=calibration.tolerances,
                                        calibrated_from=calibration.source, calibration_k=calibration.k)
    noise = calibration.noise if calibration is not None else {}

    def noted(i: int, row: Row) -> Row:
        return dataclasses.replace(row, noise=noise[i]) if i in noise else row

    if bisect:
        rows = [noted(i, Row(p)) for i, p in enumerate(pairs)]
        verdict = bisect_rows(rows, lambda i: noted(i, evaluate(pairs[i], tolerance)))
    else:
        with progress.task("comparing", total=len(pairs)) as task:
            rows = evaluate_pairs(pairs, tolerance, workers, task.advance, engine)
        rows = [noted(i, row) for i, row in enumerate(rows)] if noise else rows  # (the others' noise stays None)
        verdict = judge(rows)
    if verdict.findings and migrated.calls and reference.calls:  # the blamed module's settings, from its calls
        verdict = package.with_settings(verdict, rows, migrated, reference)
    return CompareResult(label(migrated.root, migrated.framework), label(reference.root, reference.framework),
                         tuple(rows), verdict,
                         tuple(migrated.problems + reference.problems), tolerance, strict, calibration,
                         tuple(paired.maps))
