"""`align convert`: checkpoint conversion between PyTorch, MindSpore and safetensors."""
from __future__ import annotations

import click

FRAMEWORK = click.Choice(["pytorch", "mindspore"])


@click.command("convert")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Output file; its extension picks the format (.ckpt, .pth/.pt/.bin, .safetensors).")
@click.option("--like", "like", type=click.Path(dir_okay=False),
              help="A checkpoint saved from the target model: every one of its keys must be filled, with its shape.")
@click.option("--map", "map_path", type=click.Path(dir_okay=False), help="User mapping YAML (overrides built-in rules).")
@click.option("--save-map", type=click.Path(dir_okay=False), help="Write the fully resolved mapping (reusable with --map).")
@click.option("--from", "src", type=FRAMEWORK, help="Naming convention of SOURCE (default: from its format or names).")
@click.option("--to", "to", type=FRAMEWORK, help="Naming convention to write (default: from the output format / --like).")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--allow-incomplete", is_flag=True, help="Write even if target keys stay unfilled or shapes disagree.")
@click.option("--trust-pickle", is_flag=True, help="Allow .pth files that need arbitrary code to unpickle (unsafe).")
@click.option("-v", "--verbose", is_flag=True, help="Show every parameter, not only those that changed.")
def command(source: str, output: str, like: str | None, map_path: str | None, save_map: str | None, src: str | None,
            to: str | None, force: bool, allow_incomplete: bool, trust_pickle: bool, verbose: bool) -> int:
    """Convert SOURCE to OUTPUT, renaming parameters for the target framework.

    \b
    Examples:
      align convert model.pth -o model.ckpt
      align convert model.ckpt -o model.pth
      align convert model.pth -o model.ckpt --like target_init.ckpt --save-map resolved.yaml
    Exit code: 0 written, 1 target keys unfilled or shapes disagree (nothing written), 2 bad input.
    """
    from aligner.pipelines.convert import convert
    from aligner.render.convert import print_plan

    plan = convert(source, output, like_path=like, map_path=map_path, to=to, src=src, force=force,
                   allow_incomplete=allow_incomplete, allow_pickle=trust_pickle, save_map=save_map)
    print_plan(plan, verbose=verbose)
    if plan.failures and not allow_incomplete:
        click.echo(f"align: {len(plan.failures)} target key(s) unfilled or mismatched: nothing written "
                   "(fix with --map, or pass --allow-incomplete)", err=True)
        return 1
    click.echo(f"wrote {output} ({len(plan.outputs)} tensors, {plan.src_framework} -> {plan.dst_framework} names)")
    return 0
