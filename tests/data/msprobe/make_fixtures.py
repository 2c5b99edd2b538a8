"""Generate the msprobe dumps under tests/data/msprobe/ ONCE, with the real msprobe (mindstudio-probe), in a scratch
venv that also sees this project's torch 2.13 and MindSpore 2.10 (msprobe is not a dependency of aligner):

    python -m venv /tmp/msprobe-venv
    echo /work/main/.venv/lib/python3.11/site-packages > /tmp/msprobe-venv/lib/python3.11/site-packages/main.pth
    /tmp/msprobe-venv/bin/pip install mindstudio-probe==26.2.0 'numpy==1.26.4' 'pandas<2.3'
    cd /tmp && /tmp/msprobe-venv/bin/python /work/main/tests/data/msprobe/make_fixtures.py

Generated with msprobe 26.2.0 (mindstudio-probe on PyPI), torch 2.13.0+cpu, MindSpore 2.10.0 CPU. The models are the
twins of tests/support/twin_models.py (seed 0, training mode, dropout 0) on their `example_input`, one forward and
backward of `out.square().mean()`, as tests/dumping/read/test_foreign.py dumps the other side with aligner: `block` for
the L0 dumps, `cnn` for the mix-level one (fewer API calls: the block's mix dump is 100 KB of JSON).

What is changed from what msprobe wrote, and why:
* `stack.json` is left out (call stacks, 10x the size of the rest; aligner does not read it);
* the `proc<PID>` directory is renamed `rank0` (what msprobe names it in a distributed run), so the path is fixed;
* MindSpore only: msprobe computes each tensor's Norm statistic with `mint.norm`, which has no CPU kernel in
  MindSpore 2.10 ("The kernel LinalgVectorNorm unregistered"), so this script computes it as sqrt(sum(x*x)) with
  MindSpore ops instead (same quantity, float32); every other number and file is msprobe's own.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the checkout, for tests.support.twin_models

from tests.support.twin_models import example_input, make_twins  # noqa: E402

# (name, framework, model, level, task, msprobe "list" filter: only these names save tensors)
FIXTURES = [
    ("ms_L0_tensor", "mindspore", "block", "L0", "tensor", []),
    ("ms_cnn_mix_statistics", "mindspore", "cnn", "mix", "statistics", []),
    ("pt_L0_statistics", "pytorch", "block", "L0", "statistics", []),
    ("pt_L0_tensor_fc2", "pytorch", "block", "L0", "tensor", ["Module.mlp.fc2.Linear.forward"]),
]


def _config(path: Path, dump: Path, level: str, task: str, names: list[str]) -> Path:
    config = {"task": task, "dump_path": str(dump), "rank": [], "step": [], "level": level,
              "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
              "tensor": {"scope": [], "list": names, "data_mode": ["all"]}}
    path.write_text(json.dumps(config))
    return path


def _run_torch(config: Path, kind: str) -> None:
    import torch
    from msprobe.pytorch import PrecisionDebugger

    tnet, _ = make_twins(kind)
    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start(model=tnet)
    tnet(torch.from_numpy(example_input(kind))).square().mean().backward()
    debugger.stop()
    debugger.step()


def _run_mindspore(config: Path, kind: str) -> None:
    import mindspore as ms
    import msprobe.core.dump.data_dump.data_processor.mindspore_processor as processor
    from msprobe.mindspore import PrecisionDebugger

    class _Mint:
        """mindspore.mint with a CPU norm (see the module docstring)."""

        def __getattr__(self, name: str) -> object:
            return getattr(ms.mint, name)

        @staticmethod
        def norm(x: ms.Tensor) -> ms.Tensor:
            return ms.ops.sqrt((x * x).sum())

    processor.mint = _Mint()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    _, mnet = make_twins(kind)
    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start(model=mnet)
    ms.value_and_grad(lambda t: mnet(t).square().mean(), None, mnet.trainable_params())(ms.Tensor(
        example_input(kind)))
    debugger.stop()
    debugger.step()


def main() -> None:
    if len(sys.argv) < 2:  # one process per fixture: msprobe's debugger is a per-process singleton
        import subprocess

        for fixture in FIXTURES:
            subprocess.run([sys.executable, __file__, fixture[0]], check=True)
        return
    name, framework, kind, level, task, names = next(f for f in FIXTURES if f[0] == sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "dump"
        config = _config(Path(tmp) / "config.json", dump, level, task, names)
        (_run_torch if framework == "pytorch" else _run_mindspore)(config, kind)
        [written] = (dump / "step0").iterdir()
        (written / "stack.json").unlink()
        out = HERE / name
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(written, out / "step0" / "rank0")


if __name__ == "__main__":
    main()
