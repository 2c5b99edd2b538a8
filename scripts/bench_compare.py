"""Benchmark `align compare` against a naive numpy loop on the same files, in the same run, and end to end at scale.

Writes PAIRS pairs of 1M-element float32 .npy files (the second half diverging) as two plain .npy directories, then
times, in interleaved rounds: the naive loop (np.load both, np.allclose, max abs error, cosine), the `align compare`
pipeline (read -> match -> metrics in worker processes -> verdicts -> report), and its --bisect mode (tensor pairs
read). Throughput counts the bytes of both sides. The files were just written, so the page cache is warm: this
measures compute, not the disk. Peak memory (tracemalloc, numpy included; one worker, in-process) is measured
separately for 1M- and 4M-element tensors.

    .venv/bin/python scripts/bench_compare.py --large --numel 4194304   # 3.2 GB per side: vs the mmap-touch floor
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from aligner.dumping.manifest import FORMAT, MANIFEST, VERSION
from aligner.pipelines.compare.run import compare
from aligner.render.compare import write_compare_json


def write_pairs(root: Path, pairs: int, numel: int) -> int:
    """Two directories of `pairs` .npy files each; the second half diverges. Returns the bytes written."""
    rng = np.random.default_rng(0)
    for side in ("a", "b"):
        (root / side).mkdir(parents=True, exist_ok=True)
    base = rng.standard_normal(numel, dtype=np.float32)
    for i in range(pairs):
        ref = np.roll(base, i * 7919)
        other = ref + np.float32(1e-7) * ref if i < pairs // 2 else ref + np.float32(1e-3) * np.roll(base, 1)
        np.save(root / "b" / f"{i:04d}_t{i}.npy", ref)
        np.save(root / "a" / f"{i:04d}_t{i}.npy", other.astype(np.float32))
    return 2 * pairs * numel * 4


def naive(root: Path) -> int:
    """The loop a user would write: load both, allclose, max abs error, cosine."""
    diverged = 0
    for fa in sorted((root / "a").glob("*.npy")):
        a, b = np.load(fa), np.load(root / "b" / fa.name)
        close = np.allclose(a, b, rtol=1.3e-6, atol=1e-5)
        _max_abs = float(np.abs(a - b).max())
        _cosine = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
        diverged += not close
    return diverged


def aligner_run(root: Path, bisect: bool = False, workers: int | None = None) -> dict:
    out = root / ("bisect.json" if bisect else "result.json")
    out.unlink(missing_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        result = compare(str(root / "a"), str(root / "b"), bisect=bisect, workers=workers)
        with open(out, "w", encoding="utf-8") as fh:  # the JSON report, as `align compare --json` writes it
            write_compare_json(result, fh)
    return json.loads(out.read_text())


def cpu_seconds() -> float:
    """CPU time of this process and of its finished child processes (the compare worker processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds incl. worker processes, result) of one call."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    result = fn()
    return time.perf_counter() - t0, cpu_seconds() - c0, result


def interleaved(fns: dict, repeat: int) -> dict:
    """Run the functions in turn, `repeat` rounds, so that a machine shared with other jobs loads them alike."""
    runs: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            runs[name].append(timed(fn))
    return runs


def peak_memory(root: Path, numel: int) -> float:
    """Peak traced memory (MiB) of one in-process comparison (one worker: the code each worker process runs per
    pair) of 8 pairs of `numel`-element tensors."""
    sub = root / f"mem{numel}"
    write_pairs(sub, 8, numel)
    tracemalloc.start()
    aligner_run(sub, workers=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    shutil.rmtree(sub)
    return peak / 2**20


def align_cli(*args: str, env: dict[str, str] | None = None) -> float:
    """Wall seconds of one `align ...` process, start to exit (the user's view: interpreter start and imports
    included); exit 0 or 1 (a verdict), anything else fails the benchmark. `env`: the process's environment
    (default: this one's)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "aligner.cli", *args], capture_output=True, env=env)
    elapsed = time.perf_counter() - start
    assert done.returncode in (0, 1), done.stderr.decode()[-500:]
    return elapsed


def python_c(code: str, env: dict[str, str] | None = None) -> float:
    """Wall seconds of `python -c CODE` (e.g. "import numpy": the floor any numpy tool starts from here)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - start


# What `align compare` must import before any code of its own: numpy, its command line (click), its table (rich),
# the manifest decoder (msgspec) and the standard modules aligner.cli and its atomic writes use.
LIBRARIES = "import numpy, click, logging, json, csv, msgspec, rich.console, rich.table"


def bytecode_current() -> bool:
    """Whether every aligner module has current bytecode (pip compiles a wheel's; `make install` runs compileall):
    without it, and with PYTHONDONTWRITEBYTECODE set as some sandboxes do, every run compiles aligner from source."""
    import importlib.util

    import aligner

    root = Path(aligner.__file__).parent
    for source in root.rglob("*.py"):
        cached = Path(importlib.util.cache_from_source(str(source)))
        if not cached.exists() or cached.stat().st_mtime < source.stat().st_mtime:
            return False
    return True


def write_stats_dumps(root: Path, records: int) -> None:
    """Two stats-only aligner dumps of `records` module outputs each (MindSpore vs PyTorch names and types), the
    last 10% diverging: the manifests a long stats-only run writes."""
    for side, framework in (("a", "mindspore"), ("b", "pytorch")):
        (root / side).mkdir(parents=True)
        with open(root / side / MANIFEST, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"format": FORMAT, "version": VERSION, "framework": framework,
                                 "framework_version": "x", "aligner_version": "x", "mode": "stats", "seed": None,
                                 "rank": None, "world_size": None}) + "\n")
            for i in range(records):
                v = 1.0 + (i % 97) / 100 + (0.5 if side == "a" and i > records * 0.9 else 0.0)
                stats = {"min": -v, "max": v, "mean": v / 10, "l2": v * 30, "nan": 0, "inf": 0, "zeros": 0.0,
                         "near_zero": 0.01, "near_one": 0.2, "tiny": 0.0, "numel": 4096}
                fh.write(json.dumps({"seq": i, "step": 0, "module": f"layers.{i // 10}.fc{i % 10}",
                                     "type": "Dense" if side == "a" else "Linear", "kind": "forward", "io": "output",
                                     "index": 0, "dtype": "float32", "shape": [4, 1024], "stats": stats,
                                     "file": None, "call": i + 1, "parent": f"layers.{i // 10}"}) + "\n")


def scale(root: Path, repeat: int, records: int) -> None:
    """End-to-end figures: `align compare` processes against the naive loop (100 pairs), the fixed start cost
    against `python -c "import numpy"`, and matching + verdicts of `records` stats-only records per side."""
    write_pairs(root / "e2e", 100, 1 << 20)
    tiny = root / "tiny"
    for side in ("a", "b"):
        (tiny / side).mkdir(parents=True)
        np.save(tiny / side / "x.npy", np.ones(4, np.float32))
    write_stats_dumps(root / "long", records)
    tiny_args = ("compare", str(tiny / "a"), str(tiny / "b"))
    runs = interleaved({"naive": lambda: naive(root / "e2e"),
                        "cli": lambda: align_cli("compare", str(root / "e2e" / "a"), str(root / "e2e" / "b"),
                                                 "--json", str(root / "e2e.json"), "--force"),
                        "start": lambda: align_cli(*tiny_args),
                        "numpy": lambda: python_c("import numpy"),
                        "libraries": lambda: python_c(LIBRARIES),
                        "long": lambda: align_cli("compare", str(root / "long" / "a"), str(root / "long" / "b"))},
                       repeat)
    median = {name: statistics.median(w for w, _, _ in r) for name, r in runs.items()}
    print(f"\nend to end, {repeat} interleaved rounds (median wall s)")
    print(f"100 pairs x 1M float32: naive loop in-process {median['naive']:.2f} s, `align compare` process "
          f"{median['cli']:.2f} s -> {median['naive'] / median['cli']:.1f}x the naive loop (goal >= 5x)")
    numpy_s = median["numpy"]
    print(f"fixed start cost (`align compare` of one 4-element pair): {median['start']:.3f} s; "
          f"`python -c \"import numpy\"`: {numpy_s:.3f} s -> {median['start'] / numpy_s:.2f}x "
          f"(goal: 0.12 s where numpy's import takes 0.09 s, 1.33x)"
          + ("" if bytecode_current() else " [aligner's bytecode is missing or stale: compiled from source]"))
    libraries = median["libraries"]
    print(f"  importing the libraries it needs, before any code of its own (numpy, click, rich, msgspec, ...): "
          f"{libraries:.3f} s -> {libraries / numpy_s:.2f}x")
    print(f"{records} stats-only records per side, `align compare` process: {median['long']:.2f} s (goal < 4 s)")


def touch_floor(root: Path, threads: int = 2) -> int:
    """The floor of any comparison: every byte of both sides mapped from the page cache and reduced once (np.max over
    an mmap of each file), on `threads` threads. Returns the files read."""
    from concurrent.futures import ThreadPoolExecutor

    files = sorted((root / "a").glob("*.npy")) + sorted((root / "b").glob("*.npy"))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda f: float(np.load(f, mmap_mode="r").max()), files))
    return len(files)


def large(root: Path, pairs: int, numel: int, repeat: int) -> None:
    """`align compare` end to end (a process: start, imports and --json included) on `pairs` pairs of `numel`-element
    float32 .npy files against, in the same interleaved rounds, the mmap-touch floor and the naive numpy loop; best
    of the rounds (a shared machine: the best round is the one least slowed by other jobs)."""
    nbytes = write_pairs(root, pairs, numel)
    gb = nbytes / 1e9
    load_before = os.getloadavg()
    runs = interleaved({"floor": lambda: touch_floor(root),
                        "naive": lambda: naive(root),
                        "cli": lambda: align_cli("compare", str(root / "a"), str(root / "b"), "--json",
                                                 str(root / "large.json"), "--force")}, repeat)
    best = {name: min(w for w, _, _ in r) for name, r in runs.items()}
    loads = f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after (1-min load average, {os.cpu_count()} CPUs)"
    print(f"data: {pairs} pairs x {numel} float32 per side, {gb / 2:.2f} GB per side, page cache warm; "
          f"{repeat} interleaved rounds, wall s per round (best GB/s, both sides); load {loads}")
    for name, label in (("floor", "mmap-touch floor (np.max over mmaps, 2 threads)"),
                        ("naive", "naive loop (np.load both, allclose, max abs err, cosine)"),
                        ("cli", "`align compare --json` process, end to end")):
        print(f"  {label}: " + "  ".join(f"{w:.2f}" for w, _, _ in runs[name]) + f"  ({gb / best[name]:.2f} GB/s)")
    print(f"align compare: {best['floor'] / best['cli']:.2f}x the mmap-touch floor (goal >= 0.5x), "
          f"{best['naive'] / best['cli']:.1f}x the naive loop (goal >= 5x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000, help="stats-only records per side (end to end)")
    parser.add_argument("--only-scale", action="store_true", help="only the end-to-end figures")
    parser.add_argument("--large", action="store_true",
                        help="only `align compare` end to end against the mmap-touch floor and the naive loop on "
                             "--pairs pairs of --numel elements (issue 32: 200 x 4M float32, 3.2 GB per side)")
    args = parser.parse_args()
    if args.large:
        root = Path(tempfile.mkdtemp(prefix="bench_compare_"))
        try:
            large(root, args.pairs, args.numel, args.repeat)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    if args.only_scale:
        root = Path(tempfile.mkdtemp(prefix="bench_compare_"))
        try:
            scale(root, args.repeat, args.records)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    root = Path(tempfile.mkdtemp(prefix="bench_compare_"))
    try:
        nbytes = write_pairs(root, args.pairs, args.numel)
        gb = nbytes / 1e9
        runs = interleaved({"naive": lambda: naive(root), "align": lambda: aligner_run(root),
                            "bisect": lambda: aligner_run(root, bisect=True)}, args.repeat)
        n_div, result, bis = runs["naive"][-1][2], runs["align"][-1][2], runs["bisect"][-1][2]
        found = sum(r["status"] == "diverged" for r in result["rows"])
        assert found == n_div == args.pairs // 2, (found, n_div)
        first = result["rows"][result["findings"][0]["first"]]["module"]
        assert bis["rows"][bis["findings"][0]["first"]]["module"] == first
        mem = {n: peak_memory(root, n) for n in (1 << 20, 1 << 22)}
        print(f"data: {args.pairs} pairs x {args.numel} float32 elements, {gb:.2f} GB (both sides), page cache warm")
        print(f"{args.repeat} interleaved rounds; wall s (GB/s) per round, then CPU s incl. workers (GB per CPU s)")
        for name, label in (("naive", "naive loop    "), ("align", "align compare ")):
            walls = "  ".join(f"{w:5.2f} ({gb / w:4.2f})" for w, _, _ in runs[name])
            cpus = "  ".join(f"{c:5.2f} ({gb / c:4.2f})" for _, c, _ in runs[name])
            print(f"{label}: wall {walls}\n{'':15}  cpu  {cpus}")
        ratios = [n[0] / a[0] for n, a in zip(runs["naive"], runs["align"])]
        t_align = statistics.median(w for w, _, _ in runs["align"])
        best = min(w for w, _, _ in runs["align"])
        print(f"align (summary): median {t_align:.2f} s = {gb / t_align:.2f} GB/s, "
              f"best {best:.2f} s = {gb / best:.2f} GB/s ({found} diverging, first at {first})")
        print("ratio naive/align per round: " + "  ".join(f"{r:.1f}x" for r in ratios)
              + f"  -> median {statistics.median(ratios):.1f}x the naive loop")
        t_bisect = statistics.median(w for w, _, _ in runs["bisect"])
        print(f"align --bisect : {t_bisect:6.3f} s  read {bis['bisect_reads']} of {args.pairs} tensor pairs")
        print("peak traced memory, one worker: " + ", ".join(f"{mib:.1f} MiB for {n >> 20}M-element tensors"
                                                 for n, mib in mem.items()))
        scale(root / "scale", args.repeat, args.records)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
