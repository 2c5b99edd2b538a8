"""`align inspect`: what a checkpoint holds. Imports torch only for .pth files."""
from __future__ import annotations

import click

from aligner.cli.options import check_outputs, json_option, trust_pickle_option
from aligner.pipelines.inspect import inspect_checkpoint
from aligner.render.console import make_console
from aligner.render.inspect import print_inspect, write_inspect_json


@click.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--stats", is_flag=True, help="Also show min/max/mean and NaN/Inf counts (reads every tensor).")
@click.option("--filter", "pattern", help="Only names matching this regex.")
@json_option
@click.option("--force", is_flag=True, help="Overwrite an existing --json file.")
@trust_pickle_option
def command(path: str, stats: bool, pattern: str | None, json_out: str | None, force: bool, trust_pickle: bool,
            trust_pickle_alias: bool) -> int:
    """List the tensors in PATH (.pth/.pt/.bin, .ckpt, .safetensors, .npy/.npz): name, shape, dtype, parameter or
    buffer; totals. Trainable/frozen counts are unknown from a file (aligner.inspect_model(model) gives them).

    \b
    Examples:
      align inspect model.pth
      align inspect model.ckpt --stats --filter 'bn'
      align inspect model.safetensors --json -        # JSON on stdout
    Exit code: 0 read, 2 bad input.
    """
    check_outputs(force, json=json_out)
    result = inspect_checkpoint(path, pattern=pattern, stats=stats, trust_pickle=trust_pickle or trust_pickle_alias)
    if json_out != "-":
        print_inspect(result, make_console())
    if json_out:
        write_inspect_json(result, json_out)
    return int(result.exit_code)
