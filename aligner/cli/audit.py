"""`align audit MAKE_TORCH MAKE_MS`: find the settings whose defaults differ between a model and its port."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from aligner.cli.options import check_outputs, json_option
from aligner.cli.options import input_shape as parse_shape
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Reference
from aligner.io.factory import Built, build, load_example_inputs
from aligner.pipelines.audit import audit, example_from_shape
from aligner.pipelines.audit.optimizers import DEFAULT_STEPS
from aligner.pipelines.audit.optsides import optimizer_framework, scheduler_framework
from aligner.pipelines.audit.source import audit_source
from aligner.render.audit import print_audit, print_source, write_audit_json
from aligner.render.console import make_console
from aligner.render.jsonout import write_json

_HELP_EPILOG = """\b
Each factory is MODULE:CALLABLE or FILE.py:CALLABLE, called with no arguments (the current directory on sys.path),
returning a torch.nn.Module or mindspore.nn.Cell, a (model, optimizer) pair or a (model, optimizer, scheduler)
triple; one of each framework, in any order. When both return an optimizer, the audit also compares the update each
parameter gets (formula, lr, weight decay and which parameters get it, momentum, dampening, nesterov, betas, eps,
amsgrad, maximize, loss scale) and the learning rate of the first --steps steps. The scheduler: a torch
lr_scheduler (stepped on a copy), or a mindspore.experimental.optim.lr_scheduler one; a MindSpore dynamic lr (a
list, a Tensor or a LearningRateSchedule cell given as learning_rate) is read from the optimizer itself.
Rules: mappings/audit_layers.yaml (layer settings), mappings/audit_init.yaml (initialisation laws),
mappings/audit_optimizers.yaml (optimizers and schedules).
\b
Exit codes: 0 no error finding (warnings and info do not fail); 1 an error finding (the forward numbers, or an
optimizer's updates, differ) not in --baseline; 2 bad input (factory import failure, wrong type, two models of one
framework, an input the model rejects, an optimizer that is not one or holds another model's parameters)."""


def build_training(spec: str) -> Built:
    """Call a factory once; the optimizer and scheduler it may return are checked to be torch or MindSpore ones (one
    line when not)."""
    built = build(spec)
    optimizer, scheduler = built.optimizer, built.scheduler
    if optimizer is not None and optimizer_framework(optimizer) is None:
        raise AlignerError(f"factory {spec!r} returned a {type(optimizer).__name__} as the optimizer, not a "
                           "torch.optim.Optimizer or a MindSpore optimizer")
    if scheduler is not None and scheduler_framework(scheduler) is None:
        raise AlignerError(f"factory {spec!r} returned a {type(scheduler).__name__} as the scheduler, not a torch "
                           "lr_scheduler or a mindspore.experimental.optim.lr_scheduler one")
    return built


def run_source(path: str, json_out: str | None) -> int:
    """`--source PATH`: the source audit's findings, printed (and written as JSON with --json); its exit code."""
    report = audit_source(path)
    if json_out != "-":
        print_source(report, make_console())
    if json_out:
        write_json(report.to_dict(), json_out)
    return int(report.exit_code)


@click.command("audit", epilog=_HELP_EPILOG)
@click.argument("factory_a", metavar="MAKE_TORCH", required=False)
@click.argument("factory_b", metavar="MAKE_MS", required=False)
@click.option("--input-shape", "input_shape", metavar="1,3,224,224",
              help="Run both models on a float32 standard-normal input of this shape (padding is then computed for "
                   "the actual sizes).")
@click.option("--input", "input_file", metavar="FILE.npy|FILE.npz",
              help="Run both models on these arrays (stored dtypes kept; an .npz gives named keyword inputs).")
@click.option("--ref", "ref", metavar="SIDE", help="Reference side: first, second, pytorch or mindspore (default "
              "pytorch); fixes are for the other side.")
@click.option("--baseline", metavar="FILE", help="Accepted findings (an earlier --json report, or a list of "
              "{rule, where, attribute}): they are shown but do not fail.")
@click.option("--source", "source", metavar="PATH", help="Scan MindSpore source (a file or directory) for calls "
              "relying on a default that differs from torch, instead of auditing two models.")
@click.option("--steps", type=click.IntRange(min=1), default=DEFAULT_STEPS, show_default=True, metavar="N",
              help="Compare the learning rates of the first N steps (factories returning optimizers).")
@json_option
@click.option("--force", is_flag=True, help="Overwrite an existing --json file.")
def command(factory_a: str | None, factory_b: str | None, input_shape: str | None, input_file: str | None,
            ref: str | None, baseline: str | None, source: str | None, steps: int, json_out: str | None,
            force: bool) -> int:
    """Audit a PyTorch model against its MindSpore port for silent API differences, before any tensor is compared.

    \b
    Examples:
      align audit models.py:make_torch models.py:make_ms --input-shape 1,3,224,224
      align audit pkg.models:torch_net pkg.models:ms_net --input batch.npz --json audit.json
      align audit pkg.models:torch_net pkg.models:ms_net --baseline accepted.json
      align audit train.py:torch_training train.py:ms_training --steps 200   # (model, optimizer[, scheduler])
    """
    if source is not None:
        check_outputs(force, json=json_out)
        return run_source(source, json_out)
    if factory_a is None or factory_b is None:
        raise AlignerError("give two factories (MAKE_TORCH MAKE_MS), or --source PATH")
    if input_shape and input_file:
        raise AlignerError("give --input-shape or --input, not both")
    Reference.parse(ref)  # a bad choice is refused before anything is read
    if baseline is not None and not Path(baseline).is_file():
        raise AlignerError(f"--baseline {baseline}: no such file")
    check_outputs(force, json=json_out)
    inputs: Any = None
    if input_shape:
        inputs = example_from_shape(parse_shape(input_shape))
    elif input_file:
        inputs = load_example_inputs(input_file)
    built_a, built_b = build_training(factory_a), build_training(factory_b)
    report = audit(built_a.model, built_b.model, example_inputs=inputs, ref=ref, baseline=baseline,
                   optimizers=(built_a.optimizer, built_b.optimizer), schedulers=(built_a.scheduler, built_b.scheduler),
                   steps=steps)
    if json_out != "-":
        print_audit(report, make_console())
    if json_out:
        write_audit_json(report, json_out)
    return int(report.exit_code)
