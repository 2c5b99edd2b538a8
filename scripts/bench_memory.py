"""Peak memory of a full dump and of `align compare` as the dump grows: it must not grow with the dump's size.

    .venv/bin/python scripts/bench_memory.py [--steps 2,12] [--width 2048]

Each measurement runs in its own process (peak RSS from `os.wait4`, the kernel's figure for that process alone):

* dump: a torch MLP (8 Linear layers of `width`, batch 256) trained for N steps under `aligner.dump` (full: every
  forward output, backward gradient and parameter gradient written), against the same loop without aligner;
* compare: `align compare` of two such dumps (the same model, the second with a perturbed weight), for the small and
  the large N.

The dump writer's queue holds at most `MAX_QUEUED_BYTES` of host copies, and compare streams tensors in chunks, so
both peaks should stay flat from N=2 to N=12 (a dump of over 2 GB).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from aligner.dumping.writer import MAX_QUEUED_BYTES

_TRAIN = textwrap.dedent("""
    import sys, torch
    import aligner
    torch.manual_seed(0)
    torch.set_num_threads(2)
    width, steps, out, perturb = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    with torch.no_grad():
        model[0].weight[0, 0] += perturb
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, width, generator=torch.Generator().manual_seed(1))
    for step in range(steps):
        def run():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        if out == "-":
            run()
        else:
            with aligner.dump(model, out, step=step, inputs=False):
                run()
""")


def peak_rss(argv: list[str]) -> float:
    """Peak resident memory (MiB) of one child process running `argv` to completion (exit 0 or 1 accepted)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        err = proc.stderr.read().decode()[-800:] if proc.stderr else ""
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {err}")
    return usage.ru_maxrss / 1024  # Linux reports KiB


def size_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="2,12", help="the small and the large number of dumped steps")
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args()
    small, large = (int(s) for s in args.steps.split(","))
    root = Path(tempfile.mkdtemp(prefix="bench_memory_"))
    train = [sys.executable, "-c", _TRAIN, str(args.width)]
    try:
        print(f"MLP 8 x Linear({args.width}), batch 256; writer queue cap {MAX_QUEUED_BYTES >> 20} MiB")
        print(f"{'steps':>6} {'dump GB':>8} {'train MiB':>10} {'dump MiB':>9} {'dump - train':>13} "
              f"{'compare MiB':>12}")
        for steps in (small, large):
            base = peak_rss([*train, str(steps), "-", "0"])
            dumped = [peak_rss([*train, str(steps), str(root / f"{side}{steps}"), perturb])
                      for side, perturb in (("a", "0.5"), ("b", "0"))][0]
            cmp = peak_rss([sys.executable, "-m", "aligner.cli", "compare", str(root / f"a{steps}"),
                            str(root / f"b{steps}"), "--json", str(root / f"r{steps}.json")])
            print(f"{steps:>6} {size_gb(root / f'a{steps}'):>8.2f} {base:>10.0f} {dumped:>9.0f} "
                  f"{dumped - base:>13.0f} {cmp:>12.0f}")
            shutil.rmtree(root / f"a{steps}")
            shutil.rmtree(root / f"b{steps}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
