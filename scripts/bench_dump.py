"""Time one training step of a twin model (torch and MindSpore) without a dump, with a full dump and stats-only.

    .venv/bin/python scripts/bench_dump.py [--steps 30] [--batch 32] [--model cnn|block|resnet18] [--floor]

Each variant runs the same forward/backward/SGD step; the dump variants open a fresh `aligner.dump` context per step
(leaf modules, forward + backward + parameter gradients, background writer flushed at every context exit), so the
time includes everything a user's step waits for. Ratios are against the no-dump baseline of the same run. The
"inputs" column is the cost of the default input records (links, and data for inputs computed between calls): the
full dump against the same dump with inputs=False, in the same run (target: at most 1.10x). The "vs host" column is
stats-only with statistics computed where each tensor lives at emit time (`aligner.dumping.fstats`, no tensor copied
to the host) against stats-only the way it was before (every tensor copied to the host, statistics computed by the
writer thread), in the same run.

--floor adds the floor a dump's own work is measured against: the same hooks (every module's forward pre-hook and
hook, a hook on each parameter; torch: a hook on each leaf's output tensor; MindSpore: the dump's own hook code,
`aligner.dumping.mindspore_hooks`, on a session that records nothing: `ms_floor`) doing nothing, interleaved with
the other modes; the stats-only dump with MindSpore's statistics taken at once (`session.DEFER` off: each hook waits
for its op), as it was before; and the cost of writing a full dump's bytes per step to the same disk the way the
dump writes them (`DirectWriter.write`: O_DIRECT for files of `DIRECT_MIN_BYTES` or more, the page cache below). It
prints stats-only / floor, at once / floor, and full / (floor + disk), then the goals' ratios (medians and means)
with 95% intervals over resampled steps (`interval`: a MindSpore step here swings 30-150 ms); then, in blocks of
OVERLAP_BLOCK steps of one mode, each block timed until its last file is written, the floor, the full dump and the
full dump with `wait=False` (a step's files written while the next step runs). For MindSpore it also times
`mirror` (the floor before: the dump's tensor hooks re-written here) and `cell_hooks` (the floor before that: a cell
backward hook on each leaf), against the floor and against no dump; with
--variants, also each other way around its hook machinery tried (MS_VARIANTS: forward hooks only, tensor hooks on a
view alias of each input, its TensorDump op). It also prints the CPU seconds of the stepping thread a step:
MindSpore's Python thread spins while it waits for its backend, so this counts the waits (a cell backward hook makes
it wait; on 2 cores the spin takes a core from the kernels). --memory then runs none, floor, mirror, cell_hooks, stats
each in a process of its own and prints how much its resident memory rises over two steps (the copies the tensor hooks
keep for backward; MindSpore's CPU memory pool stays at its high-water mark, so one process shows one mode's peak).
A MindSpore CPU step of resnet18 at batch 8, 224x224 lasts half a minute to three minutes here: `--warmup 1 --same-loop
--progress` keeps such a run to (steps + 1) rounds of one loop and shows each step as it ends; `--skip` leaves
modes out (stats_now; full, which also skips the disk).

--summary times the full dump writer's one call per tensor (statistics and digest, `writer.stats_and_name`) on float32
arrays of 40 KB, 2 MB and 64 MB, in GB/s and as a ratio to reading the array once (`np.max`, one pass's floor) timed
in the same run, best of the rounds.

--copies ROUNDS (MindSpore) times the copy a deferred record of a Parameter holds (BatchNorm's moving statistics):
a full and a stats-only dump each with the copy as it is (`fstats._ms_copy`: `Tensor.copy_` into `mint.empty_like`),
with the copy before (`ops.deepcopy`), and holding the Parameter with no copy (wrong values where it changes before
the flush; timed only), a step of each in turn, the order reversed every round; it prints each against
`ops.deepcopy` as the mean and the median of the paired differences with 95% intervals over resampled rounds (a
step swings by ~18 ms here, so a few milliseconds need hundreds of rounds).

--dir writes the dumps under another directory than the temporary one: /dev/shm keeps the disk out (here file
creation stalls for minutes after a few GB are deleted: ext4 with `discard`).

--device cuda (torch only) runs the torch side on a GPU. There a stats-only dump queues each record's statistics on
the device and reads them back at the flush (`session.QUEUE_DEVICES`); "at once" reads each as its hook runs
(`session.DEFER` off: one device wait per record). --check dumps one step both ways and says whether the records
agree (files and links exactly, statistics to float64 rounding): the proof that queued reads see each tensor as its
hook saw it, in-place ops after it included.
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for tests.support

import aligner
from aligner.dumping import fstats
from aligner.dumping import session as dump_session
from aligner.dumping.writer import DirectWriter
from aligner.metrics import triton_stats
from tests.support.twin_models import make_twins, torch_model

MODES = ("none", "full", "stats", "no_inputs", "stats_host")
OVERLAP_BLOCK = 5  # steps a block of --floor's wait=False full dumps holds (each block waits for its writing)
FLOOR_MODES = ("none", "floor", "stats", "stats_now")
DEVICE = "cpu"  # --device: where the torch side runs


def torch_step(model, x) -> Callable[[], Any]:
    """One SGD training step; it returns the parameters' gradients (what `aligner.watch(grads="step")` is handed)."""
    import torch

    model.to(DEVICE)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    inp = torch.from_numpy(x).to(DEVICE)

    def step() -> Any:
        opt.zero_grad()
        model(inp).square().mean().backward()
        opt.step()
        if DEVICE != "cpu":
            torch.accelerator.synchronize()  # the step's time is the device's, not the launch queue's
        return [p.grad for p in params]
    return step


def ms_step(model, x) -> Callable[[], Any]:
    """One SGD training step; it returns the gradients value_and_grad gave (in the trainable parameters' order)."""
    import mindspore as ms

    opt = ms.nn.SGD(model.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(lambda v: model(v).square().mean(), None, opt.parameters)
    inp = ms.Tensor(x)

    last = opt.parameters[-1]

    def step() -> Any:
        _, grads = grad_fn(inp)
        opt(grads)
        last.asnumpy()  # waits for the optimizer's last op: the step's time is the backend's, not the queue's
        return grads
    return step


def example_batch(args: argparse.Namespace) -> np.ndarray:
    """The seeded input batch every mode steps on: `--batch` samples of the model's input shape (resnet18's height
    and width from `--size`)."""
    shape = {"cnn": (3, 16, 16), "block": (4, 16), "resnet18": (3, args.size, args.size)}[args.model]
    return np.random.default_rng(0).standard_normal((args.batch, *shape)).astype(np.float32)


def make_model(framework: str, kind: str) -> Any:
    """A fresh model: a twin of tests/support/twin_models.py or resnet18 (timm for torch, mindcv for MindSpore; random
    init): the issue's realistic workload, batch 8 at 224x224."""
    if kind != "resnet18":
        return torch_model(kind) if framework == "torch" else make_twins(kind)[1]
    if framework == "torch":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        importlib.import_module("tests.zoo.torch_compat")  # torchvision's op schemas, before timm imports it
        timm = importlib.import_module("timm")
        return timm.create_model("resnet18", pretrained=False, num_classes=10).train()
    import mindcv

    net = mindcv.create_model("resnet18", pretrained=False, num_classes=10)
    net.set_train(True)
    return net


def noop_hooks(model: Any) -> list[Any]:
    """The hooks a default dump registers, each doing nothing (their handles): every module's forward pre-hook and
    hook, a backward hook on each leaf (MindSpore: the cell's; torch: a hook on each output tensor), a hook on each
    parameter."""
    import torch

    handles: list[Any] = []
    if isinstance(model, torch.nn.Module):
        def post(module: Any, args: Any, output: Any) -> None:
            if next(module.children(), None) is None and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: None)

        for module in model.modules():
            handles.append(module.register_forward_pre_hook(lambda module, args: None))
            handles.append(module.register_forward_hook(post))
        params = [p for p in model.parameters() if p.requires_grad]
    else:
        return ms_floor(model)
    handles.extend(p.register_hook(lambda grad: None) for p in params)
    return handles


class _NoSink(dump_session.Sink):
    """A sink that is handed nothing (the floor's session records nothing)."""

    host_arrays = False

    def put(self, record: Any, array: Any) -> None:
        """Never called: a closed session emits no record."""

    def close(self) -> None:
        """Nothing to flush."""


def ms_floor(model: Any) -> list[Any]:
    """The MindSpore floor (their handles): the dump's own hooks (`aligner.dumping.mindspore_hooks.install`, the code
    a default dump runs) on a session that records nothing. Options(forward=False) leaves out the forward records and
    their bookkeeping; the session is closed (`open` False), so no gradient is recorded and no copy is told to it.
    Everything else runs as in a dump: each cell's forward pre-hook and hook (the call stack), on each leaf the queued
    copy of each differentiable input with its tensor hook, the tensor hooks on its outputs (on copies when a call
    returns several), and a hook on each parameter."""
    from aligner.dumping import mindspore_hooks
    from aligner.dumping.options import Options
    from aligner.dumping.session import Session

    session = Session(_NoSink(), 0, mindspore=True)
    session.open = False
    handles: list[Any] = []
    mindspore_hooks.install(model, session, Options(forward=False), handles)
    return handles


MS_VARIANTS = {
    "floor": "the dump's hooks doing nothing (ms_floor: aligner.dumping.mindspore_hooks on a session that records "
             "nothing)",
    "mirror": "the floor before: the dump's hooks mirrored here (on each leaf, a tensor hook on its outputs and on a "
              "queued ops.deepcopy of each positional input; every pre-hook returns new arguments, every leaf's "
              "forward hook its output)",
    "cell_hooks": "the floor before: every cell's forward hooks, a cell backward hook on each leaf, each parameter's "
                  "hook",
    "fwd_hooks": "forward pre-hook and hook of every cell only (no backward or parameter hooks)",
    "tensor_hooks": "backward by tensor hooks (each leaf's output, a view alias of its input) instead of cell hooks",
    "tensordump": "MindSpore's TensorDump op on each leaf's forward outputs (its own files, no manifest)",
}


def ms_hooks(model: Any, variant: str, root: Path | None = None) -> list[Any]:
    """Hooks on a MindSpore model (their handles), doing nothing but what `variant` names (MS_VARIANTS but "floor",
    which is `ms_floor`, by way of `noop_hooks`). `mirror` copies what the dump's hooks copy
    (`mindspore_hooks.differentiable`: a floating input flagged as requiring grad; every output of a call with more
    than one) and hooks the same tensors."""
    import mindspore as ms

    from aligner.dumping.mindspore_hooks import differentiable

    handles: list[Any] = []
    dump = ms.ops.TensorDump() if variant == "tensordump" else None

    def alias(cell: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if variant == "tensor_hooks":  # a view waits for the op that writes its input (the storage is read at once)
            new = tuple(a.view(a.shape) if isinstance(a, ms.Tensor) else a for a in args)
        else:  # a copy is queued
            new = tuple(ms.ops.deepcopy(a) if isinstance(a, ms.Tensor) and differentiable(a) else a for a in args)
        for a in new:
            if isinstance(a, ms.Tensor) and differentiable(a):
                a.register_hook(lambda grad: None)
        return new, kwargs

    def post(cell: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        outs = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, ms.Tensor)]
        if variant in ("mirror", "tensor_hooks"):
            if variant == "mirror" and sum(map(differentiable, outs)) > 1:
                out = tuple(ms.ops.deepcopy(t) if isinstance(t, ms.Tensor) and differentiable(t) else t for t in out)
                outs = [t for t in out if isinstance(t, ms.Tensor)]
            for t in outs:
                if differentiable(t):
                    t.register_hook(lambda grad: None)
            return out
        if dump is not None and root is not None:
            for i, t in enumerate(outs):
                dump(str(root / f"{id(cell)}_{i}"), t)
        return None

    for _, cell in model.cells_and_names():
        leaf = next(iter(cell.cells()), None) is None
        tensor_leaf = leaf and variant in ("mirror", "tensor_hooks")
        handles.append(cell.register_forward_pre_hook(alias if tensor_leaf else lambda cell, args, kwargs: None,
                                                      with_kwargs=True))
        handles.append(cell.register_forward_hook(post if leaf else lambda cell, args, kwargs, out: None,
                                                  with_kwargs=True, always_call=True))
        if leaf and variant == "cell_hooks":
            handles.append(cell.register_backward_hook(lambda cell, grad_in, grad_out: None))
    if variant in ("mirror", "cell_hooks", "tensor_hooks"):
        handles.extend(p.register_hook(lambda grad: None) for p in model.get_parameters() if p.requires_grad)
    return handles


def disk_cost(root: Path, arrays: list[np.ndarray], steps: int) -> float:
    """Median seconds to write `arrays` (a full dump's tensor files of one step) to `root` the way the dump's writer
    does (`DirectWriter.write`: O_DIRECT for large files, the page cache for the rest), over `steps` rounds."""
    writer = DirectWriter()
    root.mkdir(parents=True, exist_ok=True)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        for j, array in enumerate(arrays):
            writer.write(root / f"{i}_{j}.npy", array)
        times.append(time.perf_counter() - start)
        for path in root.glob(f"{i}_*.npy"):
            path.unlink()
    return statistics.median(times)


def timed(step: Callable[[], None], model, steps: int, root: Path, modes: tuple[str, ...] = MODES) -> dict[str, float]:
    """Median seconds per step for each mode (see MODES), interleaved step by step so machine load
    hits every mode alike (two warm-up rounds are dropped)."""
    return {mode: statistics.median(t) for mode, t in samples(step, model, steps, root, modes).items()}


def samples(step: Callable[[], None], model, steps: int, root: Path, modes: tuple[str, ...],
            warmup: int = 2, progress: bool = False, cpu: dict[str, list[float]] | None = None
            ) -> dict[str, list[float]]:
    """Seconds of each of `steps` steps for each mode, interleaved step by step (`warmup` rounds dropped); with
    `progress`, each step's time on stderr as it ends (a MindSpore CPU step at 224x224 lasts minutes). `cpu` gets
    the CPU seconds of the calling thread in each kept step: MindSpore's Python thread spins while it waits for
    the backend, so this counts its waits, and moves less than wall time on a loaded machine."""
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for i in range(steps + warmup):
        for mode in modes:
            start = time.thread_time()
            times[mode].append(one_step(step, model, root, mode, i))
            used = time.thread_time() - start
            if cpu is not None and i >= warmup:
                cpu.setdefault(mode, []).append(used)
            if progress:
                print(f"  round {i}{' (warm-up)' if i < warmup else ''} {mode}: {times[mode][-1]:.2f} s, "
                      f"this thread's CPU {used:.2f} s (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    return {mode: t[warmup:] for mode, t in times.items()}


def overlapped(step: Callable[[], None], model, steps: int, root: Path, warmup: int, block: int = OVERLAP_BLOCK
               ) -> dict[str, list[float]]:
    """Seconds a step of the floor ("block_floor"), of full dumps ("block_full") and of full dumps with wait=False
    ("overlap"), in blocks of `block` steps of each, interleaved, `warmup` rounds dropped. A dump block is timed
    until its last file is written (`aligner.wait_dumps`), so its writing never spills into the next block's time."""
    times: dict[str, list[float]] = {"block_floor": [], "block_full": [], "overlap": []}
    for r in range(warmup + max(1, steps // block)):
        for key in times:
            start = time.perf_counter()
            for i in range(block):
                one_step(step, model, root, key.removeprefix("block_"), r * block + i)
            aligner.wait_dumps()
            if r >= warmup:
                times[key].append((time.perf_counter() - start) / block)
    return times


def one_step(step: Callable[[], None], model, root: Path, mode: str, i: int) -> float:
    """Seconds of one step in `mode` (MODES, FLOOR_MODES, MS_VARIANTS, "full_now", "overlap": a full dump with
    wait=False), dumped as step `i` under root."""
    start = time.perf_counter()
    if mode == "none":
        step()
    elif mode == "floor" or mode in MS_VARIANTS:
        handles = noop_hooks(model) if mode == "floor" else ms_hooks(model, mode, root / "tensordump")
        step()
        for handle in handles:
            handle.remove()
    elif mode == "overlap":
        with aligner.dump(model, root / mode, step=i, wait=False):
            step()
    elif mode in ("stats_now", "full_now"):
        dump_session.DEFER = False
        try:
            with aligner.dump(model, root / mode, step=i, stats_only=mode == "stats_now"):
                step()
        finally:
            dump_session.DEFER = True
    else:
        inputs = False if mode == "no_inputs" else None
        dump_session.FRAMEWORK_STATS = mode != "stats_host"
        try:
            with aligner.dump(model, root / mode, step=i, stats_only=mode.startswith("stats"), inputs=inputs):
                step()
        finally:
            dump_session.FRAMEWORK_STATS = True
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the writer needs a core)")
    parser.add_argument("--model", choices=("cnn", "block", "resnet18"), default="cnn",
                        help="twin CNN or transformer block, or resnet18 (timm / mindcv; use --batch 8)")
    parser.add_argument("--frameworks", default="torch,mindspore")
    parser.add_argument("--quick", action="store_true", help="time only no dump, full and stats-only (the goals)")
    parser.add_argument("--floor", action="store_true", help="against the floor: the same hooks doing nothing")
    parser.add_argument("--size", type=int, default=224, help="resnet18's input height and width")
    parser.add_argument("--variants", action="store_true",
                        help="with --floor: also MindSpore's ways around its hook machinery (MS_VARIANTS)")
    parser.add_argument("--warmup", type=int, default=2, help="with --floor: rounds run first and dropped")
    parser.add_argument("--same-loop", action="store_true",
                        help="with --floor: full dumps interleaved with the other modes, not in a loop of their own "
                             "(for steps of seconds or more: MindSpore's resnet18 at 224x224)")
    parser.add_argument("--skip", default="", help="with --floor: modes left out (stats_now; full; variants)")
    parser.add_argument("--progress", action="store_true", help="each step's time on stderr as it ends")
    parser.add_argument("--dir", help="where the dumps are written (default: the temporary directory); /dev/shm "
                                      "leaves the disk out (here a journal commit after many deletes, with the "
                                      "`discard` mount option, stalls file creation for seconds)")
    parser.add_argument("--memory", action="store_true",
                        help="with --floor: then the peak resident memory of a process running each mode alone")
    parser.add_argument("--peak-of", help=argparse.SUPPRESS)  # the process --memory runs for one mode
    parser.add_argument("--device", default="cpu", help="where the torch side runs (cuda: torch only, see above)")
    parser.add_argument("--stats-kernel", choices=("all", "large", "off"), default="all",
                        help="on a GPU, which tensors' statistics the Triton kernel reduces: all, those above "
                             "fstats.STAGE_MAX (the others copied and reduced together), or none (torch's reductions)")
    parser.add_argument("--copies", type=int, metavar="ROUNDS",
                        help="MindSpore: the Parameter copies of deferred records against ops.deepcopy (see above)")
    parser.add_argument("--summary", action="store_true",
                        help="the writer's statistics and digest of one tensor against one read of it (see above)")
    parser.add_argument("--check", action="store_true",
                        help="dump one step queued and at once, and compare the records")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    use_stats_kernel(args.stats_kernel)
    if DEVICE != "cpu":
        args.frameworks = "torch"
    if args.check:
        check(args)
        return
    if args.peak_of:
        peak(args)
        return
    if args.floor:
        floor(args)
        return
    if args.copies:
        copies(args)
        return
    if args.summary:
        summary()
        return
    modes = ("none", "full", "stats") if args.quick else MODES
    set_up(args)
    x = example_batch(args)
    print(f"{args.model}, batch {args.batch}, input {x.shape[1:]}, median of {args.steps} interleaved steps, "
          f"torch threads {args.threads}")
    print(f"{'framework':<10} {'no dump':>10} {'full dump':>18} {'stats only':>18} {'MB/step (full)':>15} "
          f"{'inputs':>8} {'stats (host)':>18} {'vs host':>8}")
    for name in args.frameworks.split(","):
        model = make_model(name, args.model)
        step = (torch_step if name == "torch" else ms_step)(model, x)
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            root = Path(tmp)
            # the full dump apart: the kernel writes its ~0.6 GB per step back to disk after the step, and would
            # slow whichever step ran next (a stats-only one: 1.62x instead of 1.24x); against its own baseline it
            # shares that write-back with the unhooked steps, as a training run does
            writing = ("full", "no_inputs")
            times = timed(step, model, args.steps, root, tuple(m for m in modes if m not in writing))
            full_times = timed(step, model, args.steps, root, tuple(m for m in modes if m in ("none", *writing)))
            base, stats, host = times["none"], times["stats"], times.get("stats_host", math.nan)
            full, no_inputs = (full_times.get(m, math.nan) / full_times["none"] * base for m in writing)
            mb = sum(f.stat().st_size for f in (root / "full").rglob("*.npy")) / 1e6 / (args.steps + 2)
        print(f"{name:<10} {base * 1e3:>8.2f}ms {full * 1e3:>8.2f}ms ({full / base:4.2f}x) "
              f"{stats * 1e3:>8.2f}ms ({stats / base:4.2f}x) {mb:>15.2f} {full / no_inputs:>7.2f}x "
              f"{host * 1e3:>8.2f}ms ({host / base:4.2f}x) {stats / host:>7.2f}x")


def floor(args: argparse.Namespace) -> None:
    """Stats-only and full dumps against the floor (see the module docstring), each framework in turn."""
    set_up(args)
    x = example_batch(args)
    print(f"{args.model}, batch {args.batch}, input {x.shape[1:]}, {args.steps} interleaved steps, torch threads "
          f"{args.threads}, torch on {DEVICE}; median (best) ms; floor: the same hooks doing nothing; disk: writing a "
          "full step's tensor files")
    print(f"{'framework':<10} {'no dump':>13} {'floor':>13} {'stats':>13} {'stats/floor':>13} {'at once/floor':>14} "
          f"{'full':>13} {'disk':>6} {'full/(floor+disk)':>18}")
    for name in args.frameworks.split(","):
        model = make_model(name, args.model)
        step = (torch_step if name == "torch" else ms_step)(model, x)
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            root = Path(tmp)
            (root / "tensordump").mkdir()
            # MindSpore: the floor before (cell backward hooks) always, the other ways around its hooks on request
            variants = ((tuple(MS_VARIANTS)[1:] if args.variants else ("mirror", "cell_hooks"))
                        if name == "mindspore" else ())
            skip = args.skip.split(",")
            modes = tuple(m for m in FLOOR_MODES + variants if m not in skip)
            cpu: dict[str, list[float]] = {}
            disk = math.nan
            if "full" in skip:  # no full dump and no disk: the other modes alone
                t = samples(step, model, args.steps, root, modes, args.warmup, args.progress, cpu)
                f: dict[str, list[float]] = {}
            elif args.same_loop:  # steps of seconds or more: one step's write-back ends long before the next step does
                t = samples(step, model, args.steps, root, modes + ("full",), args.warmup, args.progress, cpu)
                f = {"full_floor": t["floor"], "full": t.pop("full")}
            else:  # full dumps apart (their write-back would slow the next step: see main), against their own floor
                t = samples(step, model, args.steps, root, modes, args.warmup, args.progress, cpu)
                f = samples(step, model, args.steps, root, ("floor", "full"), args.warmup, args.progress)
                f["full_floor"] = f.pop("floor")
                f |= overlapped(step, model, args.steps, root, args.warmup)
            if f:
                files = sorted((root / "full").rglob("*.npy"))
                per_step = len(files) // (args.steps + args.warmup) or 1
                disk = disk_cost(root / "disk", [np.load(p) for p in files[:per_step]], max(3, args.steps // 3))
        both = t | f
        med, best = {m: statistics.median(v) for m, v in both.items()}, {m: min(v) for m, v in both.items()}
        print(floor_row(name, med, best, disk))
        print(f"{'':10} the goals' ratios with 95% intervals (steps resampled; medians, then means): "
              + "; ".join(f"{label} {interval(both, a, b, extra)}" for label, a, b, extra in (
                  ("stats/floor", "stats", "floor", 0.0), ("full/(floor+disk)", "full", "full_floor", disk),
                  ("blocks full/(floor+disk)", "block_full", "block_floor", disk)) if a in both and b in both))
        if DEVICE != "cpu":
            print(f"{'':10} statistics queued by the {kernel_state()}")
        if "overlap" in med:
            print(f"{'':10} in blocks of {OVERLAP_BLOCK} steps of a mode, each timed to its last file: floor "
                  f"{cell_of(med, best, 'block_floor')} ms; full {cell_of(med, best, 'block_full')} ms, "
                  f"{ratio_of(med, best, 'block_full', 'block_floor', disk)} (floor + disk); full with wait=False "
                  f"(files written while the next step runs) {cell_of(med, best, 'overlap')} ms, "
                  f"{ratio_of(med, best, 'overlap', 'block_floor', disk)}")
        print(f"{'':10} CPU seconds of the stepping thread a step, median: "
              + ", ".join(f"{m} {statistics.median(v):.2f}" for m, v in cpu.items()))
        if args.memory:
            peaks = {m: peak_of(args, name, m) for m in ("none", "floor", "mirror", "cell_hooks", "stats")
                     if m in med}
            print(f"{'':10} resident memory a fresh process gains over two steps of one mode (load "
                  f"{os.getloadavg()[0]:.1f}): " + ", ".join(f"{m} {b / 2**20:.0f} MiB ({b / peaks['none']:.2f}x)"
                                                             for m, b in peaks.items()))
        for variant in (v for v in variants if v in med):
            vs_floor = f"{med[variant] / med['floor']:.2f}x ({best[variant] / best['floor']:.2f}x)"
            vs_none = f"{med[variant] / med['none']:.2f}x ({best[variant] / best['none']:.2f}x)"
            print(f"{'':10} {MS_VARIANTS[variant]}: {vs_floor} the floor, {vs_none} no dump")


def summary() -> None:
    """The writer's statistics and digest of one float32 tensor against one read of it, best of the rounds."""
    from aligner.dumping.writer import stats_and_name

    print("the full dump writer's statistics and digest of a float32 tensor (writer.stats_and_name), against one read "
          "of it (np.max); best of the rounds")
    for numel in (10_000, 500_000, 16_000_000):
        array = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
        best = {"read": math.inf, "stats and digest": math.inf}
        for _ in range(max(5, int(3e8 / array.nbytes))):
            for name, run in (("read", np.max), ("stats and digest", stats_and_name)):
                start = time.perf_counter()
                run(array)
                best[name] = min(best[name], time.perf_counter() - start)
        gbs = {name: array.nbytes / t / 1e9 for name, t in best.items()}
        print(f"  {array.nbytes / 1e6:8.2f} MB: stats and digest {best['stats and digest'] * 1e3:8.3f} ms "
              f"({gbs['stats and digest']:.2f} GB/s), {best['stats and digest'] / best['read']:.2f}x one read "
              f"({gbs['read']:.2f} GB/s)")


COPIES = ("deepcopy", "copy_", "no copy")  # --copies: the baseline first


def copies(args: argparse.Namespace) -> None:
    """The Parameter copies of deferred MindSpore records, paired round by round (see the module docstring)."""
    import mindspore as ms

    set_up(argparse.Namespace(**{**vars(args), "frameworks": "mindspore"}))
    original = fstats._ms_copy
    current = original()
    made = {"deepcopy": ms.ops.deepcopy, "copy_": current, "no copy": lambda tensor: tensor}
    model = make_model("mindspore", args.model)
    step = ms_step(model, example_batch(args))
    keys = [(copy, mode) for mode in ("full", "stats") for copy in COPIES]
    times: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
    print(f"{args.model}, batch {args.batch}, {args.copies} rounds of a step of each, the order reversed every round; "
          "ms a step, median (mean); paired differences to ops.deepcopy with 95% intervals")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        try:
            for r in range(args.warmup + args.copies):
                for copy, mode in keys if r % 2 else keys[::-1]:
                    fstats._ms_copy = lambda copy=copy: made[copy]  # type: ignore[assignment]
                    spent = one_step(step, model, Path(tmp), mode, r)
                    if r >= args.warmup:
                        times[(copy, mode)].append(spent)
                if r % 50 == 49:  # a round's files are not read again
                    for old in Path(tmp).iterdir():
                        shutil.rmtree(old)
        finally:
            fstats._ms_copy = original  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    for copy, mode in keys:
        t = np.asarray(times[(copy, mode)])
        d = t - np.asarray(times[("deepcopy", mode)])
        idx = rng.integers(0, len(d), (2000, len(d)))
        cells = [f"{name} {stat(d) * 1e3:+.2f} ms [{lo * 1e3:+.2f}, {hi * 1e3:+.2f}]"
                 for name, stat in (("mean", np.mean), ("median", np.median))
                 for lo, hi in [np.percentile(stat(d[idx], axis=1), [2.5, 97.5])]]
        print(f"{mode:<6} {copy:<9} {np.median(t) * 1e3:6.1f} ({t.mean() * 1e3:.1f})" +
              ("" if copy == "deepcopy" else "; " + ", ".join(cells)))


def peak_of(args: argparse.Namespace, framework: str, mode: str) -> int:
    """Bytes a fresh process's resident memory rises by while it runs two steps in `mode`, over its level once the
    model is built (MindSpore keeps its CPU memory pool at its high-water mark, so only a process of its own shows
    one mode's peak)."""
    command = [sys.executable, __file__, "--peak-of", mode, "--frameworks", framework, "--model", args.model,
               "--batch", str(args.batch), "--size", str(args.size), "--threads", str(args.threads)] + (
                   ["--dir", args.dir] if args.dir else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, check=True)
    return int(done.stdout.split()[-1])


def peak(args: argparse.Namespace) -> None:
    """Two steps of one mode (--peak-of), their resident memory sampled every 2 ms; the rise on stdout."""
    set_up(args)
    x = example_batch(args)
    model = make_model(args.frameworks, args.model)
    step = (torch_step if args.frameworks == "torch" else ms_step)(model, x)
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * page

    base, high, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            high[0] = max(high[0], rss())
            time.sleep(0.002)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for i in range(2):
            one_step(step, model, Path(tmp), args.peak_of, i)
    done.set()
    sampler.join()
    print(max(high[0], rss()) - base)


def set_up(args: argparse.Namespace) -> None:
    """Threads, MindSpore's PyNative mode where MindSpore runs, and what runs where."""
    import torch

    torch.set_num_threads(args.threads)
    if "mindspore" in args.frameworks.split(","):
        import mindspore as ms

        ms.set_context(mode=ms.PYNATIVE_MODE)
    if DEVICE != "cpu":
        print(f"torch {torch.__version__} on {torch.accelerator.current_accelerator()}: "
              f"{torch.cuda.get_device_name() if torch.cuda.is_available() else DEVICE}; statistics kernel: "
              f"{args.stats_kernel}")


def use_stats_kernel(which: str) -> None:
    """Which GPU tensors' statistics the Triton kernel reduces in this process: "all" (as a dump does), "large" (those
    above fstats.STAGE_MAX; the others copied and reduced together) or "off" (torch's reductions): the baselines."""
    if which == "off":
        triton_stats.DEVICES = frozenset()
    elif which == "large":
        fstats.KERNEL_ABOVE = fstats.STAGE_MAX


def kernel_state() -> str:
    """Whether the Triton statistics kernel ran (after a dump), or why not."""
    why = triton_stats.why_not()
    return "Triton kernel" if why is None and triton_stats.DEVICES else f"torch reductions ({why or 'turned off'})"


def check(args: argparse.Namespace) -> None:
    """One training step dumped queued (the default) and at once (`session.DEFER` off), stats-only and full, from
    the same weights: the records must agree (files and links exactly, statistics to float64 rounding)."""
    import copy

    import msgspec

    from aligner.dumping.manifest import Record, iter_manifest

    set_up(args)
    x = example_batch(args)
    base = make_model("torch", args.model)
    bad = 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for stats_only in (True, False):
            dumps = []
            for defer in (True, False):
                model = copy.deepcopy(base)
                step = torch_step(model, x)
                root = Path(tmp) / f"{stats_only}-{defer}"
                dump_session.DEFER = defer
                try:
                    with aligner.dump(model, root, stats_only=stats_only, params=True):
                        step()
                finally:
                    dump_session.DEFER = True
                items = [item for _, item in iter_manifest(root)][1:]
                dumps.append([msgspec.structs.asdict(r) for r in items if isinstance(r, Record)])
            queued, now = dumps
            worst = 0.0
            for a, b in zip(queued, now):
                sa, sb = a.pop("stats"), b.pop("stats")
                da, db = (sa.to_dict() if sa else {}), (sb.to_dict() if sb else {})
                for k in set(da) | set(db):
                    va, vb = da.get(k), db.get(k)
                    if k in ("mean", "l2") and isinstance(va, float) and isinstance(vb, float):
                        worst = max(worst, abs(va - vb) / max(abs(vb), 1e-300))
                    elif va != vb:
                        bad += 1
                        print(f"  differs: {a['module']} {a['kind']} {k}: queued {va!r}, at once {vb!r}")
                if a != b:
                    bad += 1
                    print(f"  differs: {a['module']} {a['kind']}: {a} / {b}")
            print(f"check {'stats-only' if stats_only else 'full'}: {len(queued)} records queued, {len(now)} at "
                  f"once; worst relative difference of mean/L2 {worst:.2e}")
            bad += len(queued) != len(now)
    print(f"check: queued statistics by the {kernel_state()}")
    print("check: records agree" if not bad else f"check: {bad} differences")
    sys.exit(1 if bad else 0)


def cell_of(med: dict[str, float], best: dict[str, float], m: str) -> str:
    """Mode `m`'s milliseconds a step, "median (best)"; "-" for a mode left out."""
    return f"{med[m] * 1e3:.1f} ({best[m] * 1e3:.1f})" if m in med else "-"


def interval(times: dict[str, list[float]], a: str, b: str, extra: float, rounds: int = 2000) -> str:
    """Mode `a`'s steps against mode `b`'s (plus `extra` seconds): the ratio of medians and the ratio of means, each
    with the 2.5th-97.5th percentile of the same ratio over `rounds` resamples of each mode's steps. A MindSpore step
    here swings 30-150 ms from one step to the next (its threads spin on 2 cores), so a ratio of two medians of 100
    steps moves by several percent between runs; the interval says how far. The mean is what a training run's wall
    time adds up to."""
    rng = np.random.default_rng(0)
    xa, xb = np.asarray(times[a]), np.asarray(times[b])
    ia = rng.integers(0, len(xa), (rounds, len(xa)))
    ib = rng.integers(0, len(xb), (rounds, len(xb)))
    out = []
    for stat in (np.median, np.mean):
        resampled = stat(xa[ia], axis=1) / (stat(xb[ib], axis=1) + extra)
        lo, hi = np.percentile(resampled, [2.5, 97.5])
        out.append(f"{stat(xa) / (stat(xb) + extra):.2f}x [{lo:.2f}-{hi:.2f}]")
    return ", ".join(out)


def ratio_of(med: dict[str, float], best: dict[str, float], a: str, b: str, extra: float = 0.0) -> str:
    """Mode `a` against mode `b` (plus `extra` seconds): "median (best)" ratios, "-" for a mode left out."""
    if a not in med:
        return "-"
    return f"{med[a] / (med[b] + extra):.2f}x ({best[a] / (best[b] + extra):.2f}x)"


def floor_row(name: str, med: dict[str, float], best: dict[str, float], disk: float) -> str:
    """One framework's line of the --floor table: milliseconds and ratios, median (best)."""
    def cell(m: str) -> str:
        return cell_of(med, best, m)

    def ratio(a: str, b: str, extra: float = 0.0) -> str:
        return ratio_of(med, best, a, b, extra)

    return (f"{name:<10} {cell('none'):>13} {cell('floor'):>13} {cell('stats'):>13} {ratio('stats', 'floor'):>13} "
            f"{ratio('stats_now', 'floor'):>14} {cell('full'):>13} {disk * 1e3:>6.1f} "
            f"{ratio('full', 'full_floor', disk):>18}")


if __name__ == "__main__":
    main()
