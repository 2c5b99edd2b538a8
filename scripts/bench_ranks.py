"""Benchmark rank-by-rank `align compare` of two multi-rank dumps: compare_ranks on the local engine (the ranks in
forked processes when their tensors are big enough per record, else one after another) against the same comparisons
one rank after another in one process, in the same run.

Dumps a torch MLP (LAYERS Linear+ReLU layers of WIDTH units, batch 32, 2 steps, params=True) once per rank with that
rank's own batch, as `rank{N}/` folders, and copies the dump as the other side. Rounds alternate the two ways; the
median of each is printed with their ratio. The files were just written, so the page cache is warm: this measures
compute, not the disk.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aligner
from aligner.pipelines.compare.ranks import compare_ranks
from aligner.pipelines.compare.run import compare


def write_dumps(root: Path, ranks: int, layers: int, width: int) -> int:
    """Side "a" and its copy "b", `ranks` rank folders each; returns the records per rank."""
    import torch

    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*blocks)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    for rank in range(ranks):
        generator = torch.Generator().manual_seed(rank)
        for step in range(2):
            x = torch.randn(32, width, generator=generator)
            with aligner.dump(net, root / "a" / f"rank{rank}", step=step, params=True):
                net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    shutil.copytree(root / "a", root / "b")
    with open(root / "a" / "rank0" / "manifest.jsonl", encoding="utf-8") as fh:
        return sum(1 for _ in fh) - 1


def sequential(root: Path, ranks: int) -> None:
    for rank in range(ranks):
        result = compare(str(root / "a" / f"rank{rank}"), str(root / "b" / f"rank{rank}"))
        assert result.passed


def parallel(root: Path) -> int:
    """compare_ranks as `align compare` runs it; returns how many processes compared the ranks (1: it judged the
    dumps too small to fork for)."""
    result = compare_ranks(root / "a", root / "b")
    assert result.passed
    return result.processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_ranks_"))
    try:
        records = write_dumps(root, args.ranks, args.layers, args.width)
        times: dict[str, list[float]] = {"sequential": [], "parallel": []}
        processes = 1
        for _ in range(args.rounds):
            start = time.perf_counter()
            sequential(root, args.ranks)
            times["sequential"].append(time.perf_counter() - start)
            start = time.perf_counter()
            processes = parallel(root)
            times["parallel"].append(time.perf_counter() - start)
        seq, par = statistics.median(times["sequential"]), statistics.median(times["parallel"])
        print(f"{args.ranks} ranks x {records} records ({args.layers} x Linear({args.width}), 2 steps, params), "
              f"{os.cpu_count()} CPUs, median of {args.rounds} rounds")
        print(f"one rank after another: {seq:.3f} s   compare_ranks ({processes} process(es)): {par:.3f} s   "
              f"({seq / par:.2f}x)")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
