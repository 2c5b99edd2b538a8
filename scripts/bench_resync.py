"""Time and memory of `align compare` on long dumps that do not pair record by record (a call recorded on one side
only, as between PyTorch and MindSpore), against the same dumps paired in step and the parse floor, in one run.

    .venv/bin/python scripts/bench_resync.py [--records 1000000] [--model 10000] [--rounds 2] [--keep DIR]

Writes stats-only dumps of `records` module outputs a side, a model of `model` calls a step (the same module paths
each step, the last 10% of the records diverging): the in-step pair (MindSpore vs PyTorch names, one record each
call), and the resync pair, the same with a Dropout that hands back its input after every 50th call on the MindSpore
side (folded away) and a record only the PyTorch side holds after every 200th (listed as "only in reference"). Each
`align compare` runs in a child process of its own (bench_records.run: peak RSS from os.wait4) and is printed as a
ratio to the in-step compare and to the parse floor of one side, all interleaved round by round (best of `rounds`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from bench_records import floor, run

from aligner.dumping.manifest import FORMAT, MANIFEST, VERSION

FOLDED_EVERY, ONLY_EVERY = 50, 200


def write_dump(root: Path, framework: str, records: int, model: int, extra: bool) -> None:
    """One stats-only dump of `records` calls, `model` a step; with `extra`, the side's calls the other lacks."""
    root.mkdir(parents=True)
    with open(root / MANIFEST, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"format": FORMAT, "version": VERSION, "framework": framework, "framework_version": "x",
                             "aligner_version": "x", "mode": "stats", "seed": None, "rank": None,
                             "world_size": None}) + "\n")
        ms = framework == "mindspore"
        seq = 0
        for i in range(records):
            v = 1.0 + (i % 97) / 100 + (0.5 if ms and i > records * 0.9 else 0.0)
            layer, step = (i % model) // 10, i // model
            calls = [(f"layers.{layer}.fc{i % 10}", "Dense" if ms else "Linear", v)]
            if extra and ms and i % FOLDED_EVERY == FOLDED_EVERY - 1:
                calls.append((f"layers.{layer}.drop{i % 10}", "Dropout", v))  # hands back the record before
            if extra and not ms and i % ONLY_EVERY == ONLY_EVERY - 1:
                calls.append((f"layers.{layer}.scale{i % 10}", "Scale", v * 3.0))
            for module, kind, x in calls:
                seq += 1
                stats = {"min": -x, "max": x, "mean": x / 10, "l2": x * 30, "nan": 0, "inf": 0, "zeros": 0.0,
                         "near_zero": 0.01, "near_one": 0.2, "tiny": 0.0, "numel": 4096}
                fh.write(json.dumps({"seq": seq, "step": step, "module": module, "type": kind, "kind": "forward",
                                     "io": "output", "index": 0, "dtype": "float32", "shape": [4, 1024],
                                     "stats": stats, "file": None, "call": seq,
                                     "parent": f"layers.{layer}"}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per side")
    parser.add_argument("--model", type=int, default=10_000, help="module calls a step")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved runs of each; the best is kept")
    parser.add_argument("--keep", type=Path, help="write the dumps here (reused when present) instead of a temp dir")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_resync_"))
    try:
        dumps = {}
        for name, extra in (("in_step", False), ("resync", True)):
            a, b = root / f"{args.records}_{name}" / "a", root / f"{args.records}_{name}" / "b"
            if not (a / MANIFEST).exists() or not (b / MANIFEST).exists():
                shutil.rmtree(a.parent, ignore_errors=True)
                write_dump(a, "mindspore", args.records, args.model, extra)
                write_dump(b, "pytorch", args.records, args.model, extra)
            dumps[name] = (a, b)
        argvs = {"in_step": ["compare", *map(str, dumps["in_step"])],
                 "in_step --json": ["compare", *map(str, dumps["in_step"]), "--json", str(root / "i.json"), "--force"],
                 "resync": ["compare", *map(str, dumps["resync"])],
                 "resync --json": ["compare", *map(str, dumps["resync"]), "--json", str(root / "r.json"), "--force"]}
        best: dict[str, tuple[float, float, int, float]] = {}
        for _ in range(args.rounds):
            for name in ("floor", *argvs):
                got = floor(dumps["in_step"][0] / MANIFEST) if name == "floor" else run(argvs[name])
                if name not in best or got[1] < best[name][1]:
                    best[name] = got
        for name, (peak, wall, code, cpu) in best.items():
            print(f"{name:14s} {args.records:>9,d} records/side: peak RSS {peak:8.1f} MiB, {wall:7.1f} s = "
                  f"{wall / best['in_step'][1]:5.2f}x the in-step compare, {wall / best['floor'][1]:5.2f}x the "
                  f"floor ({cpu:.1f} s CPU; exit {code}, best of {args.rounds})", flush=True)
        report = json.loads((root / "r.json").read_text())
        print(f"resync report counts: {report['counts']}")
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} after the runs")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
