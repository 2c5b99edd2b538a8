"""`align compare` of two multi-rank dumps (the `rank{N}/` folders `aligner.dump` writes under torch.distributed or
mindspore.communication): each rank compared as `compare` compares two dumps, the ranks in parallel, and which ranks
part first.

Local parallelism: one forked process per rank at a time (at most `workers`, default one per CPU), each comparing
its rank with `workers // processes` workers of its own, so a rank with big tensors can still fork its pair batches
and the two levels together never ask for more CPUs than given. Ranks are independent reads of separate folders, the
coarsest split there is; threads would queue on the GIL in compare's per-pair Python work (see compare/parallel.py).
Forking pays only when tensor bytes dominate: each rank's CompareResult (a row per record) is pickled back to this
process, which unpickles them one after another (1280 rows: 0.09-0.25 s against the compare's own 0.5 s).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import multiprocessing
import os
import shlex
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Mapping

from aligner.core.errors import AlignerError, ExitCode
from aligner.core.progress import SILENT, Progress
from aligner.core.result import SCHEMAS, check_schema, typed
from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.read.ranks import folder_size, holds_ranks, read_ranks
from aligner.pipelines.compare.engine import Engine, open_engine
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.run import compare


class RankStatus(enum.Enum):
    """One rank's outcome: its folders agree, differ, are missing on a side, or could not be compared."""

    MATCH = "match"
    DIVERGED = "diverged"
    MISSING = "missing"
    ERROR = "error"


@dataclasses.dataclass(frozen=True)
class RankOutcome:
    """One rank's comparison (None when a folder is missing or could not be compared, with why)."""

    rank: int
    result: CompareResult | None = None
    missing: tuple[str, ...] = ()   # the sides without this rank's folder: "first", "second"
    error: str | None = None        # the one-line error comparing it raised (different models, unreadable, ...)
    first: tuple[int, int] | None = None  # (step, seq) of the reference record of its earliest divergence

    @classmethod
    def compared(cls, rank: int, result: CompareResult | None, error: str | None) -> RankOutcome:
        """A rank whose folders were compared (`result`), or could not be (`error`)."""
        if result is None or not result.verdict.findings:
            return cls(rank, result, error=error)
        recs = [result.rows[f.first].pair.ref.record for f in result.verdict.findings]
        return cls(rank, result, error=error, first=min((r.step, r.seq) for r in recs))

    @property
    def status(self) -> RankStatus:
        if self.missing:
            return RankStatus.MISSING
        if self.result is None:
            return RankStatus.ERROR
        code = self.result.exit_code
        return RankStatus.MATCH if code is ExitCode.OK else RankStatus.DIVERGED if code is ExitCode.FOUND \
            else RankStatus.ERROR

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "status": self.status.value, "missing": list(self.missing), "error": self.error,
                "first_step": self.first[0] if self.first else None,
                "first_seq": self.first[1] if self.first else None,
                "compare": self.result.to_dict() if self.result is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankOutcome:
        first = None if data["first_step"] is None else (typed(data["first_step"], int, "first_step"),
                                                         typed(data["first_seq"], int, "first_seq"))
        result = None if data["compare"] is None else CompareResult.from_dict(data["compare"])
        return cls(typed(data["rank"], int, "rank"), result,
                   tuple(typed(m, str, "missing side") for m in data["missing"]),
                   None if data["error"] is None else typed(data["error"], str, "error"), first)


@dataclasses.dataclass(frozen=True)
class RankedCompareResult:
    """Two multi-rank dumps compared rank by rank; `bool(result)` is `passed`; a `Result` (aligner.core.result).
    `first`/`second`: the dumps in argument order (each rank's own result names its compared and reference sides)."""

    first: str
    second: str
    world_size: int
    world_known: bool          # False: no header named the world size; it is the highest rank folder + 1
    ranks: tuple[RankOutcome, ...]   # rank 0, 1, ... world_size - 1
    engine: str = "local"
    processes: int = 1         # local engine: the forked processes that compared ranks side by side (1: none)

    @property
    def diverged(self) -> list[int]:
        """Ranks that diverge, earliest first: by the step, then the execution order, of their first divergence."""
        hit = [(o.first, o.rank) for o in self.ranks if o.first is not None]
        return [rank for _, rank in sorted(hit)]

    @property
    def first_divergent(self) -> list[int]:
        """The rank(s) whose divergence comes first (several when they part at the same record)."""
        hit = [o for o in self.ranks if o.first is not None]
        if not hit:
            return []
        earliest = min(o.first for o in hit if o.first is not None)
        return [o.rank for o in hit if o.first == earliest]

    def missing(self, side: str) -> list[int]:
        """Ranks whose folder `side` ("first" or "second") lacks."""
        return [o.rank for o in self.ranks if side in o.missing]

    @property
    def passed(self) -> bool:
        """Every rank present on both sides, and none diverged (per-rank `--strict` included)."""
        return all(o.status is RankStatus.MATCH for o in self.ranks)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def exit_code(self) -> ExitCode:
        """1 for a divergence or a missing rank (a rank that did not dump is a failed run); else 2 if a rank could
        not be compared or its inputs were unreadable; else 0."""
        if any(o.status in (RankStatus.DIVERGED, RankStatus.MISSING) for o in self.ranks):
            return ExitCode.FOUND
        if any(o.status is RankStatus.ERROR or o.result is not None and o.result.exit_code == ExitCode.USAGE
               for o in self.ranks):
            return ExitCode.USAGE
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain data: the rank table, and each compared rank's own compare result."""
        return {"schema": SCHEMAS["multi-rank compare"], "first": self.first, "second": self.second,
                "world_size": self.world_size, "world_known": self.world_known, "engine": self.engine,
                "processes": self.processes,
                "passed": self.passed, "exit_code": int(self.exit_code), "first_divergent": self.first_divergent,
                "diverged": self.diverged, "missing_first": self.missing("first"),
                "missing_second": self.missing("second"), "ranks": [o.to_dict() for o in self.ranks]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankedCompareResult:
        """A saved rank-by-rank comparison read back; NotAResultError, ValueError, KeyError or TypeError when `data`
        is not one."""
        data = check_schema(data, "multi-rank compare", ("first", "second", "world_size", "ranks"))
        return cls(typed(data["first"], str, "first"), typed(data["second"], str, "second"),
                   typed(data["world_size"], int, "world_size"), typed(data["world_known"], bool, "world_known"),
                   tuple(RankOutcome.from_dict(typed(o, dict, "rank")) for o in typed(data["ranks"], list, "ranks")),
                   typed(data["engine"], str, "engine"), typed(data["processes"], int, "processes"))



# Measured with scripts/bench_ranks.py, 4 ranks, 2 CPUs under load from other jobs, forked against one after
# another: tensor bytes per record (one side, folder_size) of 163 KB ran 0.68x (8 x Linear(512), 226 records per rank)
# and of 2 KB 0.75x (64 x Linear(32), 1794 records); 617 KB ran 1.22-1.37x (12 x Linear(1024), 338 records). Fork
# from 512 KB per record, and 64 MB per rank (both sides) so that no fork is started for a few large records.
_FORK_MIN_BYTES_PER_RECORD = 512 << 10
_FORK_MIN_BYTES_PER_RANK = 64 << 20


def _worth_forking(folders: list[Path], ranks: int) -> bool:
    """Whether the ranks' tensors are big enough per record for forked processes to beat one after another."""
    lines, size = map(sum, zip(*(folder_size(f) for f in folders))) if folders else (0, 0)
    return size >= _FORK_MIN_BYTES_PER_RANK * ranks and size >= _FORK_MIN_BYTES_PER_RECORD * max(lines, 1)


@dataclasses.dataclass(frozen=True)
class _Task:
    """One rank's comparison, as handed to a worker (picklable)."""

    rank: int
    a: str
    b: str
    options: dict[str, Any]


def _compare_rank(task: _Task) -> tuple[CompareResult | None, str | None]:
    """Compare one rank's folders; a one-line input error is returned (that rank is reported, the others go on)."""
    try:
        return compare(task.a, task.b, **task.options), None
    except AlignerError as exc:
        return None, str(exc)


def _run_local(tasks: list[_Task], processes: int, advance: Callable[[], None]) -> tuple[list[tuple], int]:
    """The tasks' results in `processes` forked worker processes (Linux, outside a daemon), else one after another;
    and how many processes ran them."""
    if processes >= 2 and sys.platform.startswith("linux") and not multiprocessing.current_process().daemon:
        try:
            results: list[tuple | None] = [None] * len(tasks)
            with concurrent.futures.ProcessPoolExecutor(
                    processes, mp_context=multiprocessing.get_context("fork")) as pool:
                futures = {pool.submit(_compare_rank, t): i for i, t in enumerate(tasks)}
                for future in concurrent.futures.as_completed(futures):
                    results[futures[future]] = future.result()
                    advance()
            return results, processes  # type: ignore[return-value]
        except (BrokenProcessPool, OSError):  # a worker died or could not start: one after another instead
            pass
    out = []
    for task in tasks:
        out.append(_compare_rank(task))
        advance()
    return out, 1


def compare_ranks(dumps_a: str | os.PathLike, dumps_b: str | os.PathLike, *, ref: str | None = None,
                  map_file: str | None = None, tolerance: ToleranceSpec | None = None, bisect: bool = False,
                  workers: int | None = None, strict: bool = False, engine: Engine | None = None,
                  progress: Progress = SILENT) -> RankedCompareResult:
    """Compare two multi-rank dumps rank by rank (each as `compare` does, with the same options) on `engine` (the
    local one when None: ranks in forked processes when worth it; a cluster engine runs one task per rank, each on one
    CPU). A rank folder missing on one side is reported and the others compared; AlignerError for mixed world sizes
    or a side that is not a multi-rank dump."""
    paths = (Path(dumps_a), Path(dumps_b))
    if paths[0].resolve() == paths[1].resolve():
        raise AlignerError(f"both arguments name the same directory {dumps_a}")
    for mine, other in (paths, paths[::-1]):
        if not holds_ranks(mine):
            raise AlignerError(f"mixed world sizes: {other} holds rank folders (a multi-rank dump) but {mine} "
                               f"{'does not' if mine.is_dir() else 'is not a directory'}; compare one rank's "
                               f"folder with it (align compare {shlex.quote(str(other / 'rank0'))} "
                               f"{shlex.quote(str(mine))})")
    sides = (read_ranks(paths[0]), read_ranks(paths[1]))
    known = [s.world_size for s in sides if s.world_size is not None]
    if len(set(known)) > 1:
        raise AlignerError(f"mixed world sizes: {paths[0]} was dumped by {sides[0].world_size} ranks and "
                           f"{paths[1]} by {sides[1].world_size}; compare runs of the same world size")
    world = known[0] if known else max(max(s.folders) for s in sides) + 1
    for side in sides:
        beyond = [r for r in side.folders if r >= world]
        if beyond:
            raise AlignerError(f"mixed world sizes: {side.root} holds rank{beyond[0]}/ but the other side was "
                               f"dumped by {world} ranks")
    outcomes = [RankOutcome(r, missing=tuple(n for n, s in zip(("first", "second"), sides) if r not in s.folders))
                for r in range(world)]  # the present ones are replaced by their comparison below
    present = [o for o in outcomes if not o.missing]
    owned = engine is None
    runner = open_engine() if engine is None else engine
    cpus = workers or os.cpu_count() or 1
    processes = max(1, min(cpus, len(present)))
    if runner.name == "local" and processes > 1 and not _worth_forking(
            [side.folders[o.rank] for o in present for side in sides], len(present)):
        processes = 1
    per_rank = 1 if runner.name != "local" else max(1, cpus // processes)  # a cluster task holds one CPU
    # absolute paths: a cluster worker runs in the directory its cluster was started from
    options = {"ref": ref, "map_file": None if map_file is None else str(Path(map_file).absolute()),
               "tolerance": tolerance, "bisect": bisect, "workers": per_rank, "strict": strict}
    tasks = [_Task(o.rank, str(sides[0].folders[o.rank].absolute()), str(sides[1].folders[o.rank].absolute()),
                   options) for o in present]
    try:
        with progress.task("comparing ranks", total=len(tasks)) as bar:
            if runner.name == "local":
                results, processes = _run_local(tasks, processes, bar.advance)
            else:
                results = runner.map(_compare_rank, tasks, lambda _: bar.advance())
    finally:
        if owned:
            runner.close()
    done = {o.rank: RankOutcome.compared(o.rank, result, error) for o, (result, error) in zip(present, results)}
    return RankedCompareResult(str(paths[0]), str(paths[1]), world, bool(known),
                               tuple(done.get(o.rank, o) for o in outcomes), runner.name,
                               processes if runner.name == "local" else 1)
