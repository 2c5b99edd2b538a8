"""Benchmark `aligner.record_data` against a plain loop over the same torch DataLoader, in the same run.

SAMPLES images (3 x SIZE x SIZE float32, with an integer label and a 32-token sequence) in a TensorDataset, batches of
BATCH: the plain loop only iterates the loader (what any training loop pays anyway); record_data iterates it too and
digests and summarises every sample, then writes the data dump. Rounds are interleaved; the median and best of each
are printed with their ratio. `--tensors` also stores the batches.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import aligner


def loader(samples: int, size: int, batch: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(samples, 3, size, size, generator=g)
    labels = torch.randint(0, 100, (samples,), generator=g)
    ids = torch.randint(1, 30000, (samples, 32), generator=g)
    ids[::3, 20:] = 0
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels, ids), batch_size=batch)


def plain(data: torch.utils.data.DataLoader) -> float:
    start = time.perf_counter()
    for _batch in data:
        pass
    return time.perf_counter() - start


def recorded(data: torch.utils.data.DataLoader, root: Path, tensors: bool) -> float:
    out = root / "data"
    start = time.perf_counter()
    aligner.record_data(data, out, fields=["image", "label", "ids"], tensors=tensors)
    elapsed = time.perf_counter() - start
    shutil.rmtree(out)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tensors", action="store_true")
    args = parser.parse_args()
    data = loader(args.samples, args.size, args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        recorded(data, Path(tmp), args.tensors)  # warm-up: imports, first allocations
        base, rec = [], []
        for _ in range(args.rounds):
            base.append(plain(data))
            rec.append(recorded(data, Path(tmp), args.tensors))
    mb, mr = statistics.median(base), statistics.median(rec)
    print(f"{args.samples} samples (3x{args.size}x{args.size} float32 + label + 32 tokens), batches of {args.batch}, "
          f"tensors={args.tensors}, {args.rounds} rounds")
    print(f"plain loop over the loader: median {mb:.3f} s (best {min(base):.3f} s)")
    print(f"aligner.record_data:        median {mr:.3f} s (best {min(rec):.3f} s), "
          f"{args.samples / mr:,.0f} samples/s")
    print(f"ratio record_data / plain loop: {mr / mb:.2f}x (extra {mr - mb:.3f} s per {args.samples} samples)")


if __name__ == "__main__":
    main()
