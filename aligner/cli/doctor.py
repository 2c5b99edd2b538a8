"""`align doctor MAKE_TORCH MAKE_MS`: the whole migration check in one command, one verdict, one page of evidence."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from aligner.cli.options import check_outputs, json_option
from aligner.cli.options import input_shape as parse_shape
from aligner.core.errors import AlignerError, ExitCode
from aligner.io.factory import load_example_inputs
from aligner.pipelines.audit import example_from_shape
from aligner.pipelines.doctor import InputSpec, doctor, parse_stages
from aligner.render.console import make_console
from aligner.render.doctor import print_doctor, to_json, write_reports
from aligner.render.jsonout import write_json
from aligner.render.progress import terminal_progress

_HELP_EPILOG = """\b
Each factory is MODULE:CALLABLE or FILE.py:CALLABLE (as align audit takes them), called once with no arguments,
returning a torch.nn.Module or mindspore.nn.Cell, or (model, optimizer[, scheduler][, loss_fn]); one of each
framework. loss_fn(output) -> scalar (default: the mean square of the outputs).
\b
Stages, in order (each the library call of that step, its files kept in DIR/<stage>/):
  audit        align audit: layer settings, init laws, optimizer and schedule
  weights      the torch weights (or --weights) converted with --like the MindSpore model's own, and loaded
  determinism  seeds pinned before the factories ran, dropout off, each side run twice: bitwise identical?
  forward      both dumped and compared; if they part: op-level zoom-in at the blamed scope, and replay
  train        with optimizers: --steps N steps on both (default 3), losses, gradients, the update rule
  repro        a standalone script of the blamed module (DIR/repro/repro.py)
DIR/doctor.html: the verdict first, then each stage, its report and the exact command to rerun it.
\b
Exit codes: 0 every stage that ran agrees; 1 a stage found a difference (or nothing was checked); 2 bad input (a
factory that raises or returns the wrong thing, parameter counts that differ, inputs a model rejects): one line
naming the stage and the cause; the stages already finished are kept in DIR."""


@click.command("doctor", epilog=_HELP_EPILOG)
@click.argument("make_torch", metavar="MAKE_TORCH")
@click.argument("make_ms", metavar="MAKE_MS")
@click.option("--input-shape", "input_shape", metavar="1,3,224,224",
              help="Run both models on one float32 standard-normal input of this shape.")
@click.option("--input", "input_file", metavar="FILE.npy|FILE.npz",
              help="Run both models on these arrays (stored dtypes kept; an .npz gives named keyword inputs).")
@click.option("--weights", metavar="CKPT", help="Torch weights to start both sides from (default: the torch "
              "model's own, as its factory built it).")
@click.option("--map", "map_path", metavar="FILE", help="Name mapping for convert and compare (align convert "
              "--save-map format), where --like cannot pair every name.")
@click.option("--steps", type=click.IntRange(min=0), default=None, metavar="N",
              help="Training steps when both factories return an optimizer (default 3; 0: no training).")
@click.option("--only", metavar="STAGES", help="Run only these stages (comma-separated), e.g. audit,forward.")
@click.option("--skip", metavar="STAGES", help="Skip these stages (comma-separated), e.g. train.")
@click.option("--seed", type=int, default=0, show_default=True, help="aligner.fix_random's seed.")
@click.option("-o", "--out", "out", metavar="DIR", default="doctor", show_default=True,
              help="Folder for every stage's files and reports (new or empty).")
@json_option
def command(make_torch: str, make_ms: str, input_shape: str | None, input_file: str | None, weights: str | None,
            map_path: str | None, steps: int | None, only: str | None, skip: str | None, seed: int, out: str,
            json_out: str | None) -> int:
    """Run the whole migration check: audit, weights, determinism, forward (with zoom-in and replay), training
    steps, repro; print the verdict and write one HTML page of evidence.

    \b
    Examples:
      align doctor models.py:make_torch models.py:make_ms --input-shape 1,3,224,224 -o doctor/
      align doctor pkg.models:torch_train pkg.models:ms_train --input batch.npz --steps 3
      align doctor models.py:make_torch models.py:make_ms --input-shape 2,16 --only audit,forward --json -
    """
    if input_shape and input_file:
        raise AlignerError("give --input-shape or --input, not both")
    parse_stages(only, "--only"), parse_stages(skip, "--skip")  # bad names fail before anything runs
    for path, option in ((weights, "--weights"), (map_path, "--map"), (input_file, "--input")):
        if path is not None and not Path(path).is_file():
            raise AlignerError(f"{option} {path}: no such file")
    if json_out is not None and json_out != "-":
        check_outputs(False, json=json_out)
    inputs: Any = None
    spec = InputSpec()
    if input_shape:
        shape = parse_shape(input_shape)
        inputs, spec = example_from_shape(shape), InputSpec(shape=shape)
    elif input_file:
        inputs, spec = load_example_inputs(input_file), InputSpec(path=input_file)
    result = doctor(make_torch, make_ms, inputs, out=out, weights=weights, map_path=map_path, steps=steps, only=only,
                    skip=skip, seed=seed, progress=terminal_progress(), input_spec=spec)
    reports = write_reports(result)
    if json_out != "-":
        print_doctor(result, make_console())
    if json_out:
        write_json(to_json(result, reports), json_out)
    if result.error is not None:
        raise AlignerError(f"doctor: stage {result.error.stage}: {result.error.error} (finished stages kept in "
                           f"{result.out})", exit_code=ExitCode.USAGE)
    return int(result.exit_code)
