"""Benchmark: convert a synthetic ~1.2 GB float32 PyTorch checkpoint to MindSpore .ckpt.

Measures wall time and peak RSS of `align convert` and of the naive way (torch.load + renames +
mindspore.save_checkpoint), each in its own process, in the same run, and checks both outputs hold the same bytes.
The page cache is warm for both (the file was just written). Usage: python scripts/bench_convert.py [--gb 1.2]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

BUILD = """
import sys, torch
torch.manual_seed(0)
target = float(sys.argv[2]) * 1e9
sd, total, i = {}, 0, 0
while total < target:
    sd[f"block{i}.conv.weight"] = torch.randn(256, 256, 3, 3); sd[f"block{i}.conv.bias"] = torch.randn(256)
    for k, v in {"weight": torch.rand(256), "bias": torch.randn(256), "running_mean": torch.randn(256),
                 "running_var": torch.rand(256) + 0.5, "num_batches_tracked": torch.tensor(10)}.items():
        sd[f"block{i}.bn.{k}"] = v
    sd[f"block{i}.fc.weight"] = torch.randn(4096, 4096); sd[f"block{i}.fc.bias"] = torch.randn(4096)
    total = sum(t.numel() * t.element_size() for t in sd.values()); i += 1
torch.save(sd, sys.argv[1])
print(f"{len(sd)} tensors, {total / 1e9:.2f} GB")
"""

NAIVE = """
import sys, torch, mindspore as ms
RENAME = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
sd = torch.load(sys.argv[1], weights_only=True)
out = []
for name, t in sd.items():
    prefix, leaf = name.rsplit(".", 1)
    if ".bn" in name:
        if leaf == "num_batches_tracked":
            continue
        name = f"{prefix}.{RENAME[leaf]}"
    out.append({"name": name, "data": ms.Tensor(t.numpy())})
ms.save_checkpoint(out, sys.argv[2])
"""

MEASURE = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
if rc.returncode:
    sys.exit("failed: " + rc.stderr[-2000:])
print(wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a command run in a fresh process tree."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr)
    wall, rss = out.stdout.split()
    return float(wall), float(rss)


def same_tensors(a: str, b: str) -> bool:
    sys.path.insert(0, ROOT)
    import numpy as np

    from aligner.io import open_checkpoint

    with open_checkpoint(a) as x, open_checkpoint(b) as y:
        if x.names != y.names:
            return False
        for name in x.names:
            u, v = x.get(name), y.get(name)
            if u.shape != v.shape or not np.array_equal(u.view(np.uint8), v.view(np.uint8)):
                return False
            x.release(u)
            y.release(v)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=1.2, help="checkpoint size in GB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        src = os.path.join(tmp, "big.pth")
        print("building:", subprocess.run([sys.executable, "-c", BUILD, src, str(args.gb)], check=True,
                                          capture_output=True, text=True).stdout.strip())
        naive_out, ours_out = os.path.join(tmp, "naive.ckpt"), os.path.join(tmp, "ours.ckpt")
        naive = measure([sys.executable, "-c", NAIVE, src, naive_out])
        ours = measure([sys.executable, "-m", "aligner.cli", "convert", src, "-o", ours_out])
        same = same_tensors(naive_out, ours_out)
    print(f"{'':28}{'wall s':>10}{'peak RSS MiB':>15}")
    print(f"{'naive (torch.load+ms.save)':28}{naive[0]:10.2f}{naive[1]:15.0f}")
    print(f"{'align convert':28}{ours[0]:10.2f}{ours[1]:15.0f}")
    print(f"ratios (aligner / naive): wall {ours[0] / naive[0]:.2f}x, peak RSS {ours[1] / naive[1]:.2f}x")
    print(f"targets: peak RSS <= 600 MiB: {'met' if ours[1] <= 600 else 'MISSED'}; "
          f"wall no worse than naive: {'met' if ours[0] <= naive[0] else 'MISSED'}; outputs identical: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
