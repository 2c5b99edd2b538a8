"""`align convert`: checkpoint conversion between PyTorch, MindSpore and safetensors."""
from __future__ import annotations

import click

from aligner.cli.options import check_outputs, json_option, trust_pickle_option
from aligner.pipelines.convert import convert
from aligner.render.console import make_console
from aligner.render.convert import print_convert, write_convert_json
from aligner.render.progress import terminal_progress

FRAMEWORK = click.Choice(["pytorch", "mindspore"])


@click.command("convert")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Output file; its extension picks the format (.ckpt, .pth/.pt/.bin, .safetensors).")
@click.option("--like", "like", type=click.Path(dir_okay=False),
              help="A checkpoint saved from the target model: every one of its keys must be filled, with its shape "
                   "(also settles layer types that names alone leave open, e.g. Linear vs Embedding, and splits "
                   "fused qkv/gate_up tensors the target keeps as separate ones).")
@click.option("--map", "map_path", type=click.Path(dir_okay=False),
              help="User mapping YAML (overrides built-in rules).")
@click.option("--save-map", type=click.Path(dir_okay=False),
              help="Write the fully resolved mapping (reusable with --map).")
@click.option("--from", "src", type=FRAMEWORK, help="Naming convention of SOURCE (default: from its format or names).")
@click.option("--to", "to", type=FRAMEWORK,
              help="Naming convention to write (default: from the output format / --like).")
@json_option
@click.option("--force", is_flag=True, help="Overwrite existing output, --save-map and --json files.")
@click.option("--allow-incomplete", is_flag=True, help="Write even if target keys stay unfilled or shapes disagree.")
@trust_pickle_option
@click.option("-v", "--verbose", is_flag=True, help="Show every parameter and every name, not only those that changed.")
def command(source: str, output: str, like: str | None, map_path: str | None, save_map: str | None, src: str | None,
            to: str | None, json_out: str | None, force: bool, allow_incomplete: bool, trust_pickle: bool,
            trust_pickle_alias: bool, verbose: bool) -> int:
    """Convert SOURCE to OUTPUT, renaming parameters for the target framework.

    \b
    Examples:
      align convert model.pth -o model.ckpt
      align convert model.ckpt -o model.pth
      align convert model.pth -o model.ckpt --like target_init.ckpt --save-map resolved.yaml --json plan.json
    Without --like, a layer type that names and shapes leave open (a lone 2-D weight: Linear or Embedding) is
    guessed, with a warning naming the module.
    Exit code: 0 written, 1 target keys unfilled or shapes disagree (nothing written), 2 bad input.
    """
    check_outputs(force, output=output, save_map=save_map, json=json_out)
    result = convert(source, output, like_path=like, map_path=map_path, to=to, src=src, force=force,
                     allow_incomplete=allow_incomplete, trust_pickle=trust_pickle or trust_pickle_alias,
                     save_map=save_map, progress=terminal_progress())
    if json_out != "-":
        print_convert(result, make_console(), make_console(stderr=True), verbose)
    if json_out:
        write_convert_json(result, json_out)
    return int(result.exit_code)
