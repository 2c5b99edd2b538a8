"""The `align compare` pipeline: read both sides -> match records -> metrics -> verdicts -> reports; returns the exit code."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

from aligner.pipelines.compare.evaluate import Row, evaluate, evaluate_all
from aligner.pipelines.compare.matching import match, param_namer
from aligner.render.compare import Report, print_table, summary, write_csv, write_html, write_json
from aligner.pipelines.compare.sources import Source, read_source
from aligner.pipelines.compare.verdict import bisect as bisect_rows
from aligner.pipelines.compare.verdict import judge
from aligner.core.errors import EXIT_FOUND, EXIT_OK, EXIT_USAGE, AlignerError

_PROGRESS_MIN = 200  # pairs before a progress bar is worth showing


def choose_reference(ref: str | None, frameworks: tuple[str, str]) -> int:
    """Index (0 or 1) of the reference side: --ref first|second|pytorch|mindspore; default PyTorch, else second."""
    if ref is None:
        return 0 if frameworks[0] == "pytorch" and frameworks[1] != "pytorch" else 1
    if ref in ("first", "second"):
        return 0 if ref == "first" else 1
    sides = [i for i, fw in enumerate(frameworks) if fw == ref]
    if len(sides) != 1:
        raise AlignerError(f"--ref {ref}: {'neither' if not sides else 'both'} side(s) were dumped by {ref} "
                           f"(manifests say {frameworks[0]} and {frameworks[1]}); use --ref first|second")
    return sides[0]


def _label(source: Source) -> str:
    return f"{source.root} ({source.framework})"


# Below either size one worker is fastest: per-pair Python work dominates, threads queue on the GIL and worker
# processes on handing results back (1024 pairs of 16K-element tensors: 0.19 s in one worker, 0.21 s in two
# processes, ~2x slower in two threads; 64 pairs of 256K-element tensors: 0.089 s in one, 0.064 s in two processes).
_PARALLEL_MIN_ELEMENTS = 1 << 24  # tensor elements of the whole run, both sides
_PARALLEL_MIN_PAIR_ELEMENTS = 1 << 18  # mean tensor elements per pair, both sides
_BATCH = 8  # pairs per task handed to a worker process
_FORKED: dict[int, list] = {}  # pairs lists that forked worker processes read by key (inherited, never pickled)


def _elements(pairs: list) -> int:
    total = 0
    for pair in pairs:
        for item in (pair.a, pair.b):
            if item is not None and item.path is not None:
                try:
                    total += math.prod(item.record.shape or ())
                except TypeError:
                    pass
    return total


def _parallel_mode(pairs: list, workers: int) -> str:
    """"single", "processes" or "threads" for this run.

    Processes where they can be forked (Linux): the kernel releases the GIL, but threads of one process serialize on
    its memory map while they map and drop file pages (200 x 1M-element pairs: 0.41 s with threads, 0.29 s forked).
    """
    import multiprocessing

    total = _elements(pairs)
    if workers < 2 or len(pairs) < 2 * workers or total < _PARALLEL_MIN_ELEMENTS \
            or total < _PARALLEL_MIN_PAIR_ELEMENTS * len(pairs):
        return "single"
    if sys.platform.startswith("linux") and not multiprocessing.current_process().daemon:
        return "processes"
    return "threads"


def _evaluate_batch(key: int, start: int, stop: int, rtol: float | None, atol: float | None) -> list:
    return [(row.metrics, row.error) for row in (evaluate(p, rtol, atol) for p in _FORKED[key][start:stop])]


def _evaluate_processes(pairs: list, rtol: float | None, atol: float | None, workers: int,
                        progress: Callable[[], None] | None) -> list[Row]:
    """evaluate() of every pair in forked worker processes, `_BATCH` pairs per task; rows keep the parent's pairs."""
    import concurrent.futures
    import multiprocessing

    key = id(pairs)
    _FORKED[key] = pairs
    rows: list[Row | None] = [None] * len(pairs)
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            tasks = {pool.submit(_evaluate_batch, key, s, min(s + _BATCH, len(pairs)), rtol, atol): s
                     for s in range(0, len(pairs), _BATCH)}
            for task in concurrent.futures.as_completed(tasks):
                for i, (metrics, error) in enumerate(task.result(), tasks[task]):
                    rows[i] = Row(pairs[i], metrics, error, read=True)
                    if progress:
                        progress()
    finally:
        del _FORKED[key]
    return rows  # type: ignore[return-value]


def _evaluate(pairs: list, rtol: float | None, atol: float | None, workers: int | None,
              progress: Callable[[], None] | None = None) -> list[Row]:
    """One worker for short runs and small tensors; else forked worker processes, or evaluate_all's threads."""
    import os

    n = workers or os.cpu_count() or 1
    mode = _parallel_mode(pairs, n)
    if mode == "processes":
        from concurrent.futures.process import BrokenProcessPool

        try:
            return _evaluate_processes(pairs, rtol, atol, n, progress)
        except (BrokenProcessPool, OSError):  # a worker died or could not be started: threads instead
            pass
    return evaluate_all(pairs, rtol, atol, 1 if mode == "single" else n, progress)


def _evaluate_with_progress(pairs: list, rtol: float | None, atol: float | None, workers: int | None) -> list[Row]:
    """Evaluate every pair, with a progress bar on stderr when it is a terminal and the run is long."""
    if len(pairs) < _PROGRESS_MIN or not sys.stderr.isatty():
        return _evaluate(pairs, rtol, atol, workers)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("comparing", total=len(pairs))
        return _evaluate(pairs, rtol, atol, workers, progress=lambda: bar.advance(task))


def _write(path: str, writer: Callable, report: Report) -> None:
    from aligner.core.atomic import atomic_open

    if path == "-":
        writer(report, sys.stdout)
        return
    with atomic_open(path, "w") as fh:
        writer(report, fh)


def run_compare(dumps_a: str, dumps_b: str, *, ref: str | None = None, map_file: str | None = None,
                rtol: float | None = None, atol: float | None = None, bisect: bool = False,
                json_out: str | None = None, csv_out: str | None = None, html_out: str | None = None,
                full: bool = False, workers: int | None = None) -> int:
    """Run the comparison, print/write the reports, and return the exit code (0 match, 1 divergence, 2 input errors)."""
    rename = None
    if map_file is not None:
        from aligner.mapping import load_user_map

        rename = load_user_map(map_file).rename_path
    sources = (read_source(dumps_a), read_source(dumps_b))
    if Path(dumps_a).resolve() == Path(dumps_b).resolve():
        raise AlignerError(f"both arguments name the same directory {dumps_a}")
    r = choose_reference(ref, (sources[0].framework, sources[1].framework))
    side_a, side_b = sources[1 - r], sources[r]
    first, second = sources
    namer = param_namer(first.items, first.framework, second.framework, rename)
    pairs = match(side_a.items, side_b.items, namer if r == 1 else None, namer if r == 0 else None)
    if bisect:
        rows = [Row(p) for p in pairs]
        verdict = bisect_rows(rows, lambda i: evaluate(pairs[i], rtol, atol))
    else:
        rows = _evaluate_with_progress(pairs, rtol, atol, workers)
        verdict = judge(rows)
    report = Report(_label(side_a), _label(side_b), rows, verdict, side_a.problems + side_b.problems)
    to_stdout = "-" in (json_out, csv_out)
    if json_out:
        _write(json_out, write_json, report)
    if csv_out:
        _write(csv_out, write_csv, report)
    if html_out:
        _write(html_out, write_html, report)
    if not to_stdout:
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 160)
        print_table(report, console, full)
        console.print(summary(report), highlight=False, soft_wrap=True)
    unmatched = any(row.status == "unmatched" for row in rows)
    if verdict.findings or unmatched:
        return EXIT_FOUND
    return EXIT_USAGE if report.errors or report.problems else EXIT_OK
