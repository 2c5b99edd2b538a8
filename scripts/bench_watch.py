"""Time one training step of a twin model (torch and MindSpore) without `aligner.watch`, with it (all rules) and with
the weight-gradient rules only.

    .venv/bin/python scripts/bench_watch.py [--steps 40] [--batch 32] [--model cnn|block] [--every 1] [--sync]
    python scripts/bench_watch.py --device cuda --model resnet18 --batch 8   # torch on a GPU: statistics queued there

Each mode trains its own copy of the same model (identical weights, the same input) so the three loops can run
interleaved step by step: machine load hits every mode alike. A watched step is the user's step plus `w.step()` (the
rules evaluated at its end). "grad rules" enables only the rules that read parameter gradients (vanishing, exploding,
float16 underflow, gradient trend): no module hook is installed, only parameter gradient hooks; "grads handed over"
is the same with `aligner.watch(..., grads="step")`: no hook at all, the step's gradients passed to `w.step(grads)`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for tests.support

import bench_dump
from bench_dump import make_model, ms_step, torch_step

from aligner.pipelines.check import RuleConfig
from aligner.pipelines.check.watch import watch

GRAD_RULES = ("vanishing-gradients", "exploding-gradients", "fp16-underflow", "gradient-trend")
MODES = ("none", "all", "grads", "given")


def rules_for(mode: str) -> dict[str, Any] | None:
    """The rules override of a mode: None (defaults: every rule) or only the weight-gradient rules enabled."""
    if mode not in ("grads", "given"):
        return None
    return {f"{name}.enabled": name in GRAD_RULES for name in RuleConfig.load().names}


def timed(framework: str, kind: str, x: np.ndarray, steps: int, every: int,
          sync: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per step for each mode, interleaved step by step (two warm-up rounds dropped), and the median
    seconds of the `w.step()` call alone (aligner's own work at the step's end, timed directly: no run-to-run
    spread of the framework's step in it); `sync`: each timed step ends by waiting for MindSpore's queued ops (its
    own work, not the previous mode's, lands in its time)."""
    make = torch_step if framework == "torch" else ms_step
    loops: dict[str, tuple[Callable[[], None], Any]] = {}
    waits: dict[str, Callable[[], Any] | None] = {}
    for mode in MODES:
        model = make_model(framework, kind)
        watcher = None if mode == "none" else watch(model, rules=rules_for(mode), every=every,
                                                    grads="step" if mode == "given" else "hooks").__enter__()
        loops[mode] = (make(model, x), watcher)
        waits[mode] = _synchronizer(model) if sync and framework == "mindspore" else None
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    own: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for _ in range(steps + 2):
            for mode, (step, watcher) in loops.items():
                start = time.perf_counter()
                grads = step()
                wait = waits[mode]
                if wait is not None:
                    wait()  # the framework's step is done before w.step() is timed alone
                checked = time.perf_counter()
                if watcher is not None:
                    watcher.step(grads if mode == "given" else None)
                own[mode].append(time.perf_counter() - checked)
                times[mode].append(time.perf_counter() - start)
    finally:
        for _, watcher in loops.values():
            if watcher is not None:
                watcher.close()
    return ({mode: statistics.median(t[2:]) for mode, t in times.items()},
            {mode: statistics.median(t[2:]) for mode, t in own.items()})


def _synchronizer(model: Any) -> Callable[[], Any]:
    """What waits for a MindSpore model's queued step (PyNative runs ops asynchronously): reading a parameter the
    optimizer updated, its last op (mindspore.runtime.synchronize refuses the CPU target)."""
    param = model.trainable_params()[0]
    return param.asnumpy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--every", type=int, default=1, help="watch every Nth step")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--model", choices=("cnn", "block", "resnet18"), default="cnn",
                        help="twin CNN or transformer block, or resnet18 (timm / mindcv; use --batch 8)")
    parser.add_argument("--frameworks", default="torch,mindspore")
    parser.add_argument("--sync", action="store_true", help="end every timed step (all modes) by waiting for "
                        "MindSpore's queued ops: otherwise an unwatched step's pending work is timed in the next mode")
    parser.add_argument("--device", default="cpu", help="where the torch side runs (cuda: torch only; its statistics "
                        "are queued by the GPU kernel where Triton runs, see bench_dump.py)")
    parser.add_argument("--stats-kernel", choices=("on", "off"), default="on",
                        help="off: a GPU tensor's statistics by torch's reductions, the baseline for the kernel")
    args = parser.parse_args()
    bench_dump.use_stats_kernel("all" if args.stats_kernel == "on" else "off")
    if args.device != "cpu":
        bench_dump.DEVICE, args.frameworks = args.device, "torch"
    import logging

    import torch

    logging.getLogger("aligner").setLevel(logging.CRITICAL)  # the benchmark times the check, not the log lines
    torch.set_num_threads(args.threads)
    if "mindspore" in args.frameworks:  # a GPU machine may have torch alone
        import mindspore as ms

        ms.set_context(mode=ms.PYNATIVE_MODE)
    shape = {"cnn": (3, 16, 16), "block": (4, 16), "resnet18": (3, 224, 224)}[args.model]
    x = np.random.default_rng(0).standard_normal((args.batch, *shape)).astype(np.float32)
    print(f"{args.model}, batch {args.batch}, every {args.every}, median of {args.steps} interleaved steps, "
          f"torch threads {args.threads}{', synchronised' if args.sync else ''}, torch on {args.device}")
    print(f"{'framework':<10} {'no watch':>10} {'all rules':>20} {'grad rules':>20} {'grads handed over':>20}")
    shares = []
    for name in args.frameworks.split(","):
        step_times, own = timed(name, args.model, x, args.steps, args.every, args.sync)
        base, every_rule, grads, given = step_times.values()
        print(f"{name:<10} {base * 1e3:>8.2f}ms {every_rule * 1e3:>9.2f}ms ({every_rule / base:5.3f}x) "
              f"{grads * 1e3:>9.2f}ms ({grads / base:5.3f}x) {given * 1e3:>9.2f}ms ({given / base:5.3f}x)")
        shares.append(f"{name:<10} " + "  ".join(f"{mode} {own[mode] * 1e3:.2f}ms ({1 + own[mode] / base:5.3f}x)"
                                                 for mode in MODES if mode != "none"))
    # with grads handed over no hook runs inside the framework's step: w.step() is all aligner adds to it
    print("w.step() alone, median (1 + its share of the unwatched step):")
    print("\n".join(shares))
    if args.device != "cpu":
        print(f"statistics on the device: {bench_dump.kernel_state()}")


if __name__ == "__main__":
    main()
