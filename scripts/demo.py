"""`make demo`: a PyTorch -> MindSpore migration walk-through with aligner, on CPU, then the same run with a bug.

Steps: build the model in PyTorch, convert its weights with `align convert`, pin randomness, train two steps on fixed
data in both frameworks (loss logs, layer dumps, checkpoints after step 1), then `align losses`, `align compare` and
`align diff`. The second run leaves MindSpore's LayerNorm epsilon at its default (1e-7 instead of torch's 1e-5) and
checks that the tools name step 1, the layer `ln1` and the cause; `align replay` then shows the error is ln1's own
(not inherited) and `align repro` packs ln1 into a standalone script that exits 1. Reports stay in demo_out/ (or
`--out DIR`, which must not exist yet). Exit 1 if they do not.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ logging: warnings only

import demo_models

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "demo_out"
LR, STEPS, SEED = 0.1, 2, 0
BUG_LAYER = "ln1"


def header(text: str) -> None:
    """A section header for one workflow step."""
    print(f"\n{'=' * 100}\n== {text}\n{'=' * 100}", flush=True)


def shown(path: object) -> str:
    """A path as the user would type it from the checkout: relative when inside it."""
    return str(path).replace(str(ROOT) + "/", "")


def align(*args: object) -> int:
    """Run `align ARGS` as a user would, echoing the command and its output."""
    print(f"$ align {' '.join(map(shown, args))}", flush=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="120")
    proc = subprocess.run([sys.executable, "-m", "aligner.cli", *map(str, args)], cwd=ROOT, env=env, text=True,
                          capture_output=True)
    print(proc.stdout + proc.stderr + f"[exit {proc.returncode}]", flush=True)
    return proc.returncode


def train_torch(run: Path, init: Path) -> None:
    """Two SGD steps of the PyTorch model: `step S | loss X` log, dumps, checkpoint after step 1."""
    import torch

    import aligner

    aligner.fix_random(SEED)
    net = torch_net = demo_models.torch_model(SEED)
    net.load_state_dict(torch.load(init))
    aligner.disable_dropout(net)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    with open(run / "train_pt.log", "w") as log:
        for step, (x, y) in enumerate(demo_models.batches(STEPS, SEED), 1):
            with aligner.dump(torch_net, run / "dumps_pt", step=step, params=True):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y).long())
                loss.backward()
            opt.step()
            line = f"step {step} | loss {loss.item()!r} | lr {LR}"
            print(f"  [pytorch]   {line}")
            log.write(line + "\n")
            if step == 1:
                torch.save(net.state_dict(), run / "step1_pt.pth")


def train_mindspore(run: Path, init: Path, ln_epsilon: float | None) -> None:
    """Two SGD steps of the MindSpore model: LossMonitor-style log, dumps, checkpoint after step 1."""
    import mindspore as ms
    from mindspore import nn

    import aligner

    aligner.fix_random(SEED)
    net = demo_models.mindspore_model(ln_epsilon)
    not_loaded, _ = ms.load_param_into_net(net, ms.load_checkpoint(str(init)), strict_load=True)
    if not_loaded:
        raise SystemExit(f"demo: parameters not loaded from {init}: {not_loaded}")
    aligner.disable_dropout(net)
    net.set_train(True)
    opt = nn.Momentum(net.trainable_params(), learning_rate=LR, momentum=0.9)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    with open(run / "train_ms.log", "w") as log:
        for step, (x, y) in enumerate(demo_models.batches(STEPS, SEED), 1):
            with aligner.dump(net, run / "dumps_ms", step=step, params=True):
                loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
            opt(grads)
            line = f"epoch: 1 step: {step}, loss is {float(loss.asnumpy())!r}"
            print(f"  [mindspore] {line}")
            log.write(line + "\n")
            if step == 1:
                ms.save_checkpoint(net, str(run / "step1_ms.ckpt"))


def workflow(run: Path, init_pt: Path, init_ms: Path, ln_epsilon: float | None) -> dict[str, int]:
    """Train both sides, then run the three diagnosis commands; returns their exit codes."""
    run.mkdir(parents=True)
    header(f"{run.name}: two training steps on fixed data in each framework (dumps in {run.name}/dumps_*)")
    train_torch(run, init_pt)
    train_mindspore(run, init_ms, ln_epsilon)
    header(f"{run.name}: do the loss curves agree?")
    logs = (run / "train_ms.log", run / "train_pt.log")
    codes = {"losses": align("losses", *logs, "--plot", run / "losses.png", "--json", run / "losses.json")}
    header(f"{run.name}: which layer diverges first?")
    codes["compare"] = align("compare", run / "dumps_ms", run / "dumps_pt", "--json", run / "compare.json",
                             "--html", run / "compare.html")
    header(f"{run.name}: are the weights after step 1 the same?")
    codes["diff"] = align("diff", run / "step1_ms.ckpt", run / "step1_pt.pth", "--init", init_pt, "--json",
                          run / "diff.json")
    return codes


def confirm(run: Path, init_ms: Path) -> dict[str, int]:
    """Is the named layer's error its own? Replay step 1 on the reference's inputs, then pack the layer alone."""
    header(f"{run.name}: is {BUG_LAYER}'s error its own, or inherited? (replay step 1 on the PyTorch inputs)")
    factory = f"{shown(Path(__file__).resolve().parent / 'demo_models.py')}:mindspore_model_default_eps"
    codes = {"replay": align("replay", run / "dumps_pt", run / "dumps_ms", "--factory", factory, "--weights", init_ms,
                             "--step", 1, "--json", run / "replay.json")}
    header(f"{run.name}: a standalone script for {BUG_LAYER} alone, to hand to anyone")
    codes["repro"] = align("repro", run / "dumps_pt", run / "dumps_ms", "--module", BUG_LAYER, "-o",
                           run / f"repro_{BUG_LAYER}")
    script = run / f"repro_{BUG_LAYER}" / "repro.py"
    print(f"$ python {shown(script)}", flush=True)
    proc = subprocess.run([sys.executable, str(script)], text=True, capture_output=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    print(proc.stdout + f"[exit {proc.returncode}]", flush=True)
    codes["repro.py"] = proc.returncode
    return codes


def check_bug_found(run: Path) -> list[str]:
    """What the tools said about the injected bug; problems if they missed the step, the layer or the cause."""
    problems = []
    compare = json.loads((run / "compare.json").read_text())
    forward = [f for f in compare["findings"] if f["phase"] == "forward"]
    origin = forward[0]["origin_module"] if forward else None
    if origin != BUG_LAYER:
        problems.append(f"align compare named {origin!r} as the origin, not {BUG_LAYER!r}")
    if "introduced here" not in compare["summary"]:
        problems.append("align compare did not say the divergence starts inside the layer (input matched)")
    losses = json.loads((run / "losses.json").read_text())
    first = losses["first_part"]
    if first != 1:
        problems.append(f"align losses put the first differing step at {first!r}, not step 1")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the clean migration, then the buggy one; exit 1 unless the tools pin the bug."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="a new directory for the run (default: demo_out/, replaced)")
    out_arg = parser.parse_args(argv).out
    start = time.time()
    if out_arg is not None and out_arg.exists():
        parser.error(f"--out {out_arg} already exists")
    out = DEFAULT_OUT if out_arg is None else out_arg.resolve()
    if out_arg is None:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    import torch

    import aligner

    header("1. Pin randomness and save the PyTorch model's initial weights")
    print(f"  aligner.fix_random({SEED}) -> {sorted(aligner.fix_random(SEED))}")
    init_pt, init_ms = out / "init_pt.pth", out / "init_ms.ckpt"
    torch.save(demo_models.torch_model(SEED).state_dict(), init_pt)
    print(f"  saved {shown(init_pt)}")
    header("2. Convert the PyTorch weights to MindSpore")
    if align("convert", init_pt, "-o", init_ms, "-v") != 0:
        return 1
    clean = workflow(out / "clean", init_pt, init_ms, demo_models.TORCH_LN_EPS)
    if any(clean.values()):
        print(f"\ndemo: FAILED: the correct migration was reported as different: {clean}")
        return 1
    header("3. The same run with a migration bug: MindSpore LayerNorm epsilon left at its default (1e-7 vs 1e-5)")
    workflow(out / "bug", init_pt, init_ms, None)
    problems = check_bug_found(out / "bug")
    confirmed = confirm(out / "bug", init_ms)
    replay = json.loads((out / "bug" / "replay.json").read_text())
    if replay["blame"] != BUG_LAYER or replay["verdict"] != "layer":
        problems.append(f"align replay blamed {replay['blame']!r} ({replay['verdict']}), not {BUG_LAYER!r}'s own error")
    if confirmed["repro.py"] != 1:
        problems.append(f"the repro of {BUG_LAYER} exited {confirmed['repro.py']}, not 1 (the layers differ)")
    header("Verdict")
    if problems:
        print("demo: FAILED: " + "; ".join(problems))
        return 1
    print(f"align losses: the losses part at step 1, so the forward pass differs.\n"
          f"align compare: the first divergent layer is {BUG_LAYER} (a LayerNorm): its input matched and its output "
          f"did not, so the cause is inside that layer: its epsilon (MindSpore default 1e-7, torch 1e-5).\n"
          f"align replay: re-run on the PyTorch inputs, {BUG_LAYER} alone still differs (its own error), every later "
          f"layer only inherits; align repro packed it into bug/repro_{BUG_LAYER}/ (python repro.py exits 1).\n"
          f"Reports: {shown(out)}/{{clean,bug}}/ (losses.json, compare.json, compare.html, diff.json). "
          f"Demo ran in {time.time() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
