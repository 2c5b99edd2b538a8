"""The GPU statistics kernel (`aligner.metrics.triton_stats`) on a lent GPU: first its numbers against numpy's
`tensor_stats` (every float width, NaN/Inf, threshold values, layouts, unaligned views), then the host time a record
costs to queue by each way a dump has (the kernel, the copy stage, torch's reductions), as a ratio to one torch op's
dispatch timed in the same run. The step-level figures are `bench_dump.py --device cuda --floor`'s.

    python scripts/bench_stats_kernel.py               # on a machine with a CUDA GPU and torch's CUDA build
    TRITON_INTERPRET=1 python scripts/bench_stats_kernel.py --device cpu   # a dry run of the script, by the interpreter
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, where aligner is not installed

from aligner.dumping import fstats
from aligner.dumping.fstats import QueuedStats, StatsStage, read_queued, torch_stats_queued
from aligner.metrics import triton_stats
from aligner.metrics.stats import NEAR_ONE, NEAR_ZERO, TINY, tensor_stats

RECORDS = 200


def sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize()


def reference(t: torch.Tensor) -> dict:
    host = t.cpu()
    array = host.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else host.numpy()
    return tensor_stats(array).to_dict()


def check(device: torch.device, sizes: tuple[int, ...]) -> int:
    """The kernel's statistics against numpy's for each case; returns the differences (printed)."""
    rng = np.random.default_rng(0)
    tensors = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for n in sizes:
            a = torch.from_numpy(rng.standard_normal(n) * 3).to(dtype)
            if n > 8:
                a[:8] = torch.tensor([float("nan"), float("-inf"), 0.0, NEAR_ZERO, -NEAR_ONE, TINY, 1e-7, 65504.0],
                                     dtype=torch.float64).to(dtype)
            tensors.append(a.to(device))
    base = torch.from_numpy(rng.standard_normal((8, 64, 28, 28)).astype(np.float32)).to(device)
    flat = base.reshape(-1)
    tensors += [base.contiguous(memory_format=torch.channels_last), base[:, ::2], base.permute(0, 2, 3, 1),
                flat[1:], flat[3:-5], flat.half()[1:], flat[16:]]
    stage = StatsStage()
    staged = [stage.reduce(t) for t in tensors]
    read = stage.read()
    bad = 0
    for s, t in zip(staged, tensors):
        if s is None or s.key[1] != fstats.KERNEL:
            bad += 1
            print(f"  not by the kernel: {t.dtype} {tuple(t.shape)} ({triton_stats.why_not()})")
            continue
        got, want = read[s.key][s.index].to_dict(), reference(t)
        for k, w in want.items():
            g = got[k]
            near = k in ("mean", "l2") and g is not None and w is not None and abs(g - w) <= 1e-9 * abs(w)
            if g != w and not near:
                bad += 1
                print(f"  differs: {t.dtype} {tuple(t.shape)} {k}: kernel {g!r}, numpy {w!r}")
    print(f"kernel against numpy: {len(tensors)} tensors, {bad} differences")
    return bad


def per_record(device: torch.device, numel: int, way: str) -> float:
    """Host microseconds to queue one record's statistics by `way` (best of 3 batches of RECORDS; the read after
    them not counted)."""
    x = torch.randn(numel, device=device)
    best = float("inf")
    for _ in range(3):
        sync(device)
        stage = StatsStage()
        start = time.perf_counter()
        if way == "torch":
            queued = [torch_stats_queued(x) for _ in range(RECORDS)]
            took = time.perf_counter() - start
            read_queued([q for q in queued if isinstance(q, QueuedStats)])
        else:
            for _ in range(RECORDS):
                if way == "kernel":
                    stage.reduce(x)
                else:  # the copy stage, read when full as the session does
                    if stage.full(x):
                        stage.read()
                    stage.add(x)
            took = time.perf_counter() - start
            stage.read()
        sync(device)
        best = min(best, took / RECORDS * 1e6)
    return best


def dispatch(device: torch.device) -> float:
    """Host microseconds of one torch op (`abs`) on the device: the baseline."""
    x = torch.randn(4096, device=device)
    best = float("inf")
    for _ in range(3):
        sync(device)
        start = time.perf_counter()
        for _ in range(2000):
            x.abs()
        sync(device)
        best = min(best, (time.perf_counter() - start) / 2000 * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    dry = device.type == "cpu"
    if dry:  # Triton's interpreter on CPU tensors: checks the script, not the GPU (TRITON_INTERPRET=1 first)
        triton_stats.DEVICES = frozenset({"cpu"})
    start = time.perf_counter()
    stage = StatsStage()
    stage.reduce(torch.ones(10, device=device))
    stage.read()
    print(f"torch {torch.__version__} on {device}; first kernel use (a compile, or Triton's cache): "
          f"{time.perf_counter() - start:.2f} s; not used because: {triton_stats.why_not()}")
    bad = check(device, (1, 1000, 1025) if dry else (1, 1000, 1025, 262_145, 6_422_528))
    base = dispatch(device)
    print(f"host microseconds to queue one record ({RECORDS} in a row, best of 3), and as multiples of one torch op's "
          f"dispatch ({base:.1f} us):")
    ways: dict[str, Callable[[int], Any]] = {
        "kernel": lambda n: per_record(device, n, "kernel"),
        "copy stage": lambda n: per_record(device, n, "copy") if n <= fstats.STAGE_MAX else None,
        "torch reductions": lambda n: per_record(device, n, "torch"),
    }
    for numel in (4096,) if dry else (4096, 200_704, 1_605_632, 6_422_528):
        cells = []
        for name, way in ways.items():
            us = way(numel)
            cells.append(f"{name} -" if us is None else f"{name} {us:.1f} us ({us / base:.1f}x)")
        print(f"  {numel:>9} elements: " + "; ".join(cells))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
