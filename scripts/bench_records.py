"""Memory per manifest record of `align compare` and `align check` on long stats-only dumps: what a 1M-record run
costs, measured against a smaller run and against the parse floor in the same invocation.

    .venv/bin/python scripts/bench_records.py [--records 1000000] [--baseline 100000] [--keep DIR]
                                              [--only check|compare|compare-json|compare-html|compare-csv]
                                              [--rounds N]

Writes two stats-only dumps of `records` module outputs per side (MindSpore vs PyTorch names, the last 10% diverging,
the manifests a long stats-only run writes) and the same for `baseline` records, then runs `align compare A B` and
`align check A` on each in a child process of its own, and `align compare A B --json REPORT` (compare-json: the
report streamed, ~0.6 KB a row) (peak RSS from `os.wait4`: the kernel's figure for that process alone) and prints the
peak, the wall time, and the bytes per record above the baseline: (peak(records) - peak(baseline)) / (records -
baseline). `--only compare` runs compare and compare-json; `--only compare-html` runs compare and `align compare A B
--html PAGE` (the page's chart from a profile taken as the rows stream, its table around the findings);
`--only compare-csv` runs compare-json and `align compare A B --json REPORT --csv TABLE`. Past 16,384 rows a
compare with a report hands the rows to a writer process (render/report_rows.py): the CPU seconds printed are the
compare process's and its writer's together (os.wait4 counts the children a process waited for).

The floor: a child process that imports the manifest's decoder and msgspec-decodes side A's record lines block by
block, nothing else (process start and imports included, as in `align`'s runs). Each command's time is printed as a
ratio to it (compare reads two such manifests: 2x the floor is its parse floor). With --rounds N the floor and the
commands run N times, interleaved (floor, command, floor, ...), and the best time of each is kept: the round other
jobs on the machine slowed least. Each time is printed with the process's CPU seconds (user + system, from `os.wait4`):
on a machine other jobs load, the CPU time moves less than the wall time.

`--stages` times, in this process and on the baseline dumps, where a streamed compare's time goes: CPU microseconds a
row for reading both streams, + pairing them (`pairs_in_step`), + evaluating each block's pairs, + the window and the
counts (`_stream` with no sink), + the --json spool; each stage run `--rounds` times, interleaved, the best kept.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aligner.dumping.manifest import FORMAT, MANIFEST, VERSION

COMMANDS = ("compare", "compare-json", "check", "compare-html", "compare-csv")


def write_stats_dump(root: Path, framework: str, records: int, diverge: bool) -> None:
    """One stats-only dump of `records` forward outputs (the last 10% shifted when `diverge`)."""
    root.mkdir(parents=True)
    with open(root / MANIFEST, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"format": FORMAT, "version": VERSION, "framework": framework, "framework_version": "x",
                             "aligner_version": "x", "mode": "stats", "seed": None, "rank": None,
                             "world_size": None}) + "\n")
        kind = "Dense" if framework == "mindspore" else "Linear"
        for i in range(records):
            v = 1.0 + (i % 97) / 100 + (0.5 if diverge and i > records * 0.9 else 0.0)
            stats = {"min": -v, "max": v, "mean": v / 10, "l2": v * 30, "nan": 0, "inf": 0, "zeros": 0.0,
                     "near_zero": 0.01, "near_one": 0.2, "tiny": 0.0, "numel": 4096}
            fh.write(json.dumps({"seq": i, "step": 0, "module": f"layers.{i // 10}.fc{i % 10}", "type": kind,
                                 "kind": "forward", "io": "output", "index": 0, "dtype": "float32",
                                 "shape": [4, 1024], "stats": stats, "file": None, "call": i + 1,
                                 "parent": f"layers.{i // 10}"}) + "\n")


def run(argv: list[str], module: bool = True) -> tuple[float, float, int, float]:
    """(peak RSS in MiB, wall seconds, exit code, CPU seconds) of one `align` child process (`module` False: `python
    argv`)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *(["-m", "aligner.cli"] if module else []), *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if code not in (0, 1):
        raise SystemExit(f"align {' '.join(argv)} exited {code}: {err.strip()}")
    return usage.ru_maxrss / 1024, wall, code, usage.ru_utime + usage.ru_stime


# the parse floor: msgspec-decode every record line of one manifest in blocks, as the readers do, and nothing else
FLOOR = """
import sys
import msgspec
from aligner.dumping.manifest import Record
decoder, count = msgspec.json.Decoder(Record), 0
with open(sys.argv[1], "rb") as fh:
    fh.readline()
    while block := fh.read(1 << 23):
        if not block.endswith(b"\\n"):
            block += fh.readline()
        count += len(decoder.decode_lines(block))
"""


def floor(manifest: Path) -> tuple[float, float, int, float]:
    """(peak RSS in MiB, wall seconds, exit code, CPU seconds) of the parse floor on `manifest`."""
    return run(["-c", FLOOR, str(manifest)], module=False)


def stages(a: Path, b: Path, rounds: int) -> None:
    """Print the CPU microseconds a row of each stage of a streamed compare of a against b (see the docstring)."""
    import gc

    from aligner.core.progress import SILENT
    from aligner.core.tolerance import ToleranceSpec
    from aligner.dumping.read.stream import open_stream
    from aligner.pipelines.compare import stream
    from aligner.render.compare import ReportSpool

    tolerance = ToleranceSpec()

    def read(x, y, _):
        for _ in x:
            pass
        for _ in y:
            pass

    def pair(x, y, _):
        for _ in stream.pairs_in_step(x, y, x.framework != y.framework):
            pass

    def evaluate(x, y, _):
        for pairs, _buffers in stream.pairs_in_step(x, y, x.framework != y.framework):
            stream._evaluated(pairs, tolerance, None, lambda n: None, 0)

    def window(x, y, sink):
        stream._stream(x, y, tolerance, None, sink, stream.WINDOW, SILENT)

    steps = {"read both streams": read, "+ pairing": pair, "+ evaluating": evaluate,
             "+ window and counts": window, "+ the --json spool": window}
    best: dict[str, float] = {}
    gc.disable()  # as compare_streamed runs
    try:
        for _ in range(rounds):
            for name, step in steps.items():
                sink = ReportSpool(json_rows=True, csv_rows=False) if "json" in name else None
                start = time.process_time()
                with open_stream(a) as x, open_stream(b) as y:
                    step(x, y, sink)
                best[name] = min(best.get(name, math.inf), time.process_time() - start)
    finally:
        gc.enable()
    rows = sum(1 for line in open(a / MANIFEST, "rb")) - 1
    before = 0.0
    for name, seconds in best.items():
        print(f"  {name:22s} {seconds:6.2f} s CPU = {seconds / rows * 1e6:5.1f} us a row "
              f"(+{(seconds - before) / rows * 1e6:4.1f})", flush=True)
        before = seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per side of the long run")
    parser.add_argument("--baseline", type=int, default=100_000, help="records per side of the baseline run")
    parser.add_argument("--keep", type=Path, help="write the dumps here (reused when present) instead of a temp dir")
    parser.add_argument("--only", choices=COMMANDS, help="run only this command (and the floor)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of the floor and each command, interleaved; the "
                        "best of each is kept")
    parser.add_argument("--stages", action="store_true", help="time a streamed compare's stages in this process on "
                        "the baseline dumps, and nothing else")
    args = parser.parse_args()
    commands = (["compare", "compare-json"] if args.only == "compare" else ["compare", "compare-html"]
                if args.only == "compare-html" else ["compare-json", "compare-csv"] if args.only == "compare-csv"
                else [args.only] if args.only else ["compare", "compare-json", "check"])
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_records_"))
    try:
        peaks: dict[tuple[str, int], float] = {}
        for count in (args.baseline, args.records):
            a, b = root / f"{count}" / "a", root / f"{count}" / "b"
            if not (a / MANIFEST).exists():
                shutil.rmtree(root / f"{count}", ignore_errors=True)
                write_stats_dump(a, "mindspore", count, diverge=True)
                write_stats_dump(b, "pytorch", count, diverge=False)
            if args.stages:
                print(f"stages of a streamed compare, {count:,d} records a side (best of {args.rounds}):")
                stages(a, b, args.rounds)
                break
            argvs = {"compare": ["compare", str(a), str(b)], "check": ["check", str(a)],
                     "compare-json": ["compare", str(a), str(b), "--json", str(root / f"{count}.json"), "--force"],
                     "compare-html": ["compare", str(a), str(b), "--html", str(root / f"{count}.html"), "--force"],
                     "compare-csv": ["compare", str(a), str(b), "--json", str(root / f"{count}.json"), "--csv",
                                     str(root / f"{count}.csv"), "--force"]}
            best: dict[str, tuple[float, float, int, float]] = {}
            for _ in range(args.rounds):  # interleaved: load on the machine hits the floor and the commands alike
                for command in ("floor", *commands):
                    got = floor(a / MANIFEST) if command == "floor" else run(argvs[command])
                    if command not in best or got[1] < best[command][1]:
                        best[command] = got
            base = best["floor"][1]
            for command in ("floor", *commands):
                peak, wall, code, cpu = best[command]
                peaks[(command, count)] = peak
                print(f"{command:12s} {count:>9,d} records/side: peak RSS {peak:8.1f} MiB, {wall:7.1f} s = "
                      f"{wall / base:5.2f}x the floor ({cpu:6.1f} s CPU; exit {code}, best of {args.rounds})",
                      flush=True)
        if args.stages:
            return
        span = args.records - args.baseline
        for command in ("floor", *commands):
            per = (peaks[(command, args.records)] - peaks[(command, args.baseline)]) * (1 << 20) / span
            print(f"{command}: {per:,.0f} bytes per record above the {args.baseline:,d}-record baseline")
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} after the runs")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
