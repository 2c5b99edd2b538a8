"""`align replay DUMP_A DUMP_B --factory pkg.module:make_model`: each module's own error on the reference's inputs."""
from __future__ import annotations

import click

from aligner.cli.options import (
    check_outputs,
    json_option,
    tolerance_options,
    tolerance_spec,
    trust_pickle_option,
    whole_number,
)
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.frameworks import Reference
from aligner.io.factory import build
from aligner.pipelines.replay.run import replay_dumps
from aligner.pipelines.replay.weights import load_weights
from aligner.render.console import make_console
from aligner.render.replay import incomplete, print_table, summary, write_replay_json

_HELP_EPILOG = """\b
Exit codes: 0 every replayed module agrees; 1 a module makes its own error, or the error accumulates past the
tolerance; 2 usage or input errors (dumps without inputs, a model that is not the dumped one, bad options)."""


@click.command("replay", epilog=_HELP_EPILOG)
@click.argument("dumps_a", metavar="DUMPS_A")
@click.argument("dumps_b", metavar="DUMPS_B")
@click.option("--factory", "factory", metavar="SPEC", required=True,
              help="pkg.module:make_model or file.py:make_model building the model of the side to re-run (the "
                   "non-reference side); called with no arguments.")
@click.option("--weights", "weights", metavar="CKPT", help="Load this checkpoint (the model's own names, e.g. from "
              "`align convert`) into the built model first.")
@click.option("--ref", "ref", metavar="SIDE", help="Reference side: first, second, pytorch or mindspore (default: the "
              "PyTorch side). Its recorded inputs feed the other side's modules.")
@click.option("--modules", "modules", metavar="REGEX", help="Replay only modules whose path matches (either side).")
@click.option("--step", "step", metavar="N", help="The step to replay (default: the first in the reference dump); "
              "the built model must hold the weights that step started from.")
@click.option("--backward", is_flag=True, help="Also replay each module's backward on the reference's grad_outputs.")
@click.option("--map", "map_file", metavar="FILE", help="Mapping YAML renaming module paths between the sides.")
@tolerance_options
@json_option
@click.option("--all", "full", is_flag=True, help="Print every row, not just the context of each finding.")
@click.option("--force", is_flag=True, help="Overwrite an existing --json file.")
@trust_pickle_option
def command(dumps_a: str, dumps_b: str, factory: str, weights: str | None, ref: str | None, modules: str | None,
            step: str | None, backward: bool, map_file: str | None, rtol: tuple[str, ...], atol: tuple[str, ...],
            json_out: str | None, full: bool, force: bool, trust_pickle: bool, trust_pickle_alias: bool) -> int:
    """Replay each module of the side to re-run on the reference's recorded inputs: its own error vs inherited.

    The reference dump must hold module inputs (aligner.dump records them by default). The model to re-run is
    built by --factory (and --weights), and must be the model the other dump recorded.

    \b
    Examples:
      align replay dumps_pt/ dumps_ms/ --factory mypkg.models:make_ms_model --weights model.ckpt
      align replay dumps_pt/ dumps_ms/ --factory port.py:build --backward --json replay.json
    """
    Reference.parse(ref)  # a bad choice is refused before anything is read
    spec = tolerance_spec(rtol, atol)
    step_number = whole_number("--step", step)
    check_outputs(force, json=json_out)
    model = build(factory).model
    if weights is not None:
        load_weights(model, weights, allow_pickle=trust_pickle or trust_pickle_alias)
    result = replay_dumps(dumps_a, dumps_b, model, ref=ref, modules=modules, backward=backward, map_file=map_file,
                          tolerance=spec, label=f"{factory}", step=step_number)
    if json_out:
        write_replay_json(result, json_out)
    if json_out != "-":
        console = make_console()
        print_table(result, console, full)
        console.print(summary(result), markup=False)
    if result.exit_code is ExitCode.USAGE:  # the report is out; exit 2 still says why on stderr, in one line
        raise AlignerError(f"replay incomplete: {incomplete(result)}")
    return int(result.exit_code)
