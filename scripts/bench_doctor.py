"""Wall time of `aligner.doctor` on a ResNet-50-size pair (timm vs mindcv resnet50, 1x3x224x224), per stage, against
the hand-run workflow it replaces, measured in the same run.

    .venv/bin/python scripts/bench_doctor.py [--size 224] [--bug cnn-conv-pad-same] [--no-clean] [--steps 3]

The baseline is the minimum a user runs by hand to reach the same verdict on a clean pair: `aligner.audit`, the torch
weights saved and `convert --like` the MindSpore model's own, loaded, both sides dumped (`params=True`, as the doctor
dumps, so repro has what it needs) and `compare`d. The doctor also proves determinism (two runs per side), and on a
divergence zooms in (op-level dumps of the blamed scope), replays every MindSpore module on torch's inputs and writes
the repro. With --steps N both sides get an optimizer (torch SGD(momentum) / MindSpore nn.Momentum) and train N steps.
Goal: under 3 minutes for the whole doctor on the 2-core machine. Needs the zoo (scripts/install_zoo.sh).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

importlib.import_module("tests.zoo.torch_compat")  # torchvision's op schemas, before timm imports it

import aligner  # noqa: E402
from aligner.core.progress import SILENT  # noqa: E402
from aligner.pipelines.convert.checkpoint import convert  # noqa: E402
from aligner.pipelines.doctor import doctor  # noqa: E402
from aligner.render.doctor import verdict_lines, write_reports  # noqa: E402


def hand_run(pair: Any, work: Path) -> dict[str, float]:
    """The clean-pair workflow by hand, timed per step."""
    import mindspore as ms
    import torch

    work.mkdir(parents=True)
    times: dict[str, float] = {}
    t = time.perf_counter()
    aligner.audit(pair.torch_model, pair.ms_model, example_inputs=pair.torch_inputs)
    times["audit"] = time.perf_counter() - t
    t = time.perf_counter()
    torch.save(pair.torch_model.state_dict(), work / "pt.pth")
    ms.save_checkpoint(pair.ms_model, str(work / "ms_init.ckpt"))
    convert(str(work / "pt.pth"), str(work / "converted.ckpt"), like_path=str(work / "ms_init.ckpt"))
    ms.load_param_into_net(pair.ms_model, ms.load_checkpoint(str(work / "converted.ckpt")), strict_load=True)
    times["weights"] = time.perf_counter() - t
    t = time.perf_counter()
    with aligner.dump(pair.torch_model, work / "pt", params=True, progress=SILENT), torch.no_grad():
        pair.torch_model(**pair.torch_tensors())
    with aligner.dump(pair.ms_model, work / "ms", params=True, progress=SILENT):
        pair.ms_model(**pair.ms_tensors())
    result = aligner.compare(work / "ms", work / "pt", progress=SILENT)
    times["forward"] = time.perf_counter() - t
    if not result.passed:  # said, not asserted: the timing stands either way
        print(f"note: the clean pair diverged by hand (exit {int(result.exit_code)}) in {work}")
    return times


def with_optimizers(pair: Any) -> tuple[Any, Any]:
    import torch
    from mindspore import nn

    pt = (pair.torch_model, torch.optim.SGD(pair.torch_model.parameters(), lr=0.01, momentum=0.9))
    ms = (pair.ms_model, nn.Momentum(pair.ms_model.trainable_params(), learning_rate=0.01, momentum=0.9))
    return pt, ms


def run_doctor(pair: Any, work: Path, steps: int) -> tuple[Any, float]:
    pt: Any = pair.torch_model
    ms: Any = pair.ms_model
    if steps:
        pt, ms = with_optimizers(pair)
    t = time.perf_counter()
    result = doctor(lambda: pt, lambda: ms, pair.torch_inputs, out=work, steps=steps or None)
    write_reports(result)
    return result, time.perf_counter() - t


def show(label: str, result: Any, total: float, hand: dict[str, float] | None) -> None:
    print(f"\n{label}: {total:.1f} s, exit {int(result.exit_code)}: {verdict_lines(result)[0]}")
    print(f"  {'stage':<12} {'status':<8} {'doctor s':>9} {'by hand s':>10}")
    for run in result.stages:
        by_hand = f"{hand[run.stage.value]:10.1f}" if hand and run.stage.value in hand else f"{'-':>10}"
        print(f"  {run.stage.value:<12} {run.status.value:<8} {run.seconds:9.1f} {by_hand}")
    accounted = sum(r.seconds for r in result.stages)
    print(f"  {'reports':<12} {'':<8} {total - accounted:9.1f}")
    if hand:
        print(f"  whole: doctor {total:.1f} s vs by hand {sum(hand.values()):.1f} s: {total / sum(hand.values()):.2f}x"
              " (the doctor also proves determinism: two runs per side)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--bug", default="cnn-conv-pad-same", help="a cnn bug of tests/zoo/localization.py ('' none)")
    ap.add_argument("--no-clean", action="store_true")
    ap.add_argument("--steps", type=int, default=0, help="train N steps (clean pair, with optimizers)")
    args = ap.parse_args()
    from tests.zoo import cnn
    from tests.zoo import localization as loc

    work = Path(tempfile.mkdtemp(prefix="bench_doctor_"))
    t = time.perf_counter()
    pair = cnn.build(seed=0, size=args.size)
    print(f"resnet50 pair, input 1x3x{args.size}x{args.size}, built in {time.perf_counter() - t:.1f} s; "
          f"work in {work}")
    if not args.no_clean:
        hand = hand_run(pair, work / "hand")
        result, total = run_doctor(pair, work / "clean", args.steps)
        show("doctor, clean pair", result, total, hand)
    if args.bug:
        bug = next(b for b in loc.CATALOGUE if b.id == args.bug)
        restore = bug.inject(pair)
        try:
            result, total = run_doctor(pair, work / "bug", 0)
        finally:
            restore()
        show(f"doctor, {bug.id} (expected {bug.expected!r})", result, total, None)
        print(f"  named {result.blame.torch_path if result.blame else None!r}")


if __name__ == "__main__":
    main()
