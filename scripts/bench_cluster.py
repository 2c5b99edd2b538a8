"""Benchmark `align compare --engine ray` against the local run on the same files, in the same run.

Writes PAIRS pairs of NUMEL-element float32 .npy files (the second half diverging; the writer of bench_compare.py),
then times, in interleaved rounds, the local pipeline (one worker, and the default forked worker pool) and the Ray
engine on throwaway local clusters of 1, 2, ... CPUs (`--address local`; the first run on each cluster, which starts
its worker processes, is timed apart). Every run's report must equal the local one. Ray's cost per task is measured
with empty tasks. Page cache warm: this measures compute and scheduling, not the disk. A machine of N cores shows
scaling up to N workers only; more nodes add their own cores and disks (see the plan in docs/at-scale.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench_compare import write_pairs

from aligner.pipelines.compare.engine import Engine, open_engine
from aligner.pipelines.compare.run import compare
from aligner.render.compare import to_json


def report(root: Path, engine: Engine | None = None, workers: int | None = None) -> str:
    """The comparison's JSON report, as text (what must not change with the engine)."""
    return json.dumps(to_json(compare(str(root / "a"), str(root / "b"), engine=engine, workers=workers)))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def task_cost(engine: Engine, n: int = 400) -> float:
    """Milliseconds per empty task, submitted and gathered as compare's batches are."""
    engine.map(int, ["0"] * 8)  # workers warm
    seconds, _ = timed(lambda: engine.map(int, ["1"] * n))
    return 1e3 * seconds / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    # a throwaway cluster on this machine only: bound to the loopback interface, not the machine's outward address
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Ray starts its workers at nice 15, behind every other process: on a machine shared with other jobs that
    # measures the other jobs; like against like, they run at the local run's priority here
    os.environ.setdefault("RAY_worker_niceness", "0")
    root = Path(tempfile.mkdtemp(prefix="bench_cluster_"))
    try:
        gb = write_pairs(root, args.pairs, args.numel) / 1e9
        baseline = report(root, workers=1)
        sizes = list(range(1, args.max_workers + 1))
        times: dict[str, list[float]] = {"local, 1 worker": [], f"local, default ({os.cpu_count()} CPUs)": []}
        first: dict[str, float] = {}
        costs: dict[str, float] = {}
        for n in sizes:
            name = f"ray, {n} worker{'s' * (n > 1)}"
            engine = open_engine("ray", "local", workers=n)
            try:
                first[name], out = timed(lambda: report(root, engine))  # noqa: B023 (called at once)
                assert out == baseline, f"{name}: the report differs from the local run's"
                times[name] = []
                for _ in range(args.repeat):  # rounds of this cluster, each next to a local round of each kind
                    times["local, 1 worker"].append(timed(lambda: report(root, workers=1))[0])
                    times[f"local, default ({os.cpu_count()} CPUs)"].append(timed(lambda: report(root))[0])
                    seconds, out = timed(lambda: report(root, engine))  # noqa: B023
                    assert out == baseline, f"{name}: the report differs from the local run's"
                    times[name].append(seconds)
                costs[name] = task_cost(engine)
            finally:
                engine.close()
        one = statistics.median(times["local, 1 worker"])
        ray_one = statistics.median(times["ray, 1 worker"])
        print(f"data: {args.pairs} pairs x {args.numel} float32 elements, {gb:.2f} GB (both sides), page cache warm; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; reports identical to the "
              f"local run's in every round")
        print(f"{'engine':<28} {'median s':>9} {'GB/s':>6} {'vs local 1':>11} {'vs ray 1':>9}  rounds (s)")
        for name, walls in times.items():
            med = statistics.median(walls)
            vs_ray = f"{ray_one / med:8.2f}x" if name.startswith("ray") else f"{'':9}"
            print(f"{name:<28} {med:9.2f} {gb / med:6.2f} {one / med:10.2f}x {vs_ray}  "
                  + " ".join(f"{w:.2f}" for w in walls))
        for name in first:
            print(f"{name}: first run {first[name]:.2f} s (starts its worker processes); "
                  f"{costs[name]:.2f} ms per empty task")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
