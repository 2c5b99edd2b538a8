"""`align convert`: checkpoint conversion between PyTorch, MindSpore and safetensors."""
from __future__ import annotations

import click

from aligner.cli.options import check_outputs, json_option, trust_pickle_option
from aligner.core.errors import AlignerError
from aligner.pipelines.convert import Hyper, OptimizerKind, convert_training_state, like_holds_optimizer
from aligner.pipelines.convert.checkpoint import convert
from aligner.render.console import make_console
from aligner.render.convert import print_convert, print_training_convert, write_convert_json
from aligner.render.progress import terminal_progress

FRAMEWORK = click.Choice(["pytorch", "mindspore"])
KINDS = ", ".join(k.value for k in OptimizerKind)


def _betas(text: str | None) -> tuple[float, float] | None:
    """--betas B1,B2 as a pair of floats in [0, 1)."""
    if text is None:
        return None
    try:
        b1, b2 = (float(p) for p in text.split(","))
    except ValueError:
        raise AlignerError(f"--betas: expected two numbers B1,B2 (e.g. 0.9,0.999), got {text!r}") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise AlignerError(f"--betas: each beta must lie in [0, 1), got {text!r}")
    return b1, b2


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
@click.option("--optimizer", "optimizer", metavar="KIND",
              help=f"Convert the optimizer state too, into this optimizer ({KINDS}); default: the --like "
                   "checkpoint's, when it holds one.")
@click.option("--from-optimizer", metavar="KIND", help="The source's optimizer when its keys leave it open "
              "(mint:Adam vs mint:AdamW; torch:Adam vs torch:AdamW without a decoupled_weight_decay record).")
@click.option("--model-key", metavar="KEY", help="Top-level key of the model state_dict in a torch checkpoint "
              "(default: state_dict, model_state_dict, model, ...).")
@click.option("--optimizer-key", metavar="KEY", help="Top-level key of the optimizer state_dict in a torch "
              "checkpoint (default: optimizer, optimizer_state_dict, ...).")
@click.option("--lr", type=float, help="Learning rate, when the source records none (mint optimizers).")
@click.option("--betas", metavar="B1,B2", help="Adam betas, when the source records none (fills beta1_power ...).")
@click.option("--momentum", type=float, help="SGD momentum, when the source records none.")
@click.option("--eps", type=float, help="Adam eps, for a torch target's param_groups.")
@click.option("--weight-decay", type=float, help="Weight decay, for a torch target's param_groups and pair checks.")
@click.option("--nesterov", is_flag=True, default=None, help="SGD nesterov, for a torch target's param_groups.")
@click.option("--step", type=click.IntRange(min=0), help="Updates taken so far, when the source records none.")
def command(source: str, output: str, like: str | None, map_path: str | None, save_map: str | None, src: str | None,
            to: str | None, json_out: str | None, force: bool, allow_incomplete: bool, trust_pickle: bool,
            trust_pickle_alias: bool, verbose: bool, optimizer: str | None, from_optimizer: str | None,
            model_key: str | None, optimizer_key: str | None, lr: float | None, betas: str | None,
            momentum: float | None, eps: float | None, weight_decay: float | None, nesterov: bool | None,
            step: int | None) -> int:
    """Convert SOURCE to OUTPUT, renaming parameters for the target framework.

    \b
    Examples:
      align convert model.pth -o model.ckpt
      align convert model.ckpt -o model.pth
      align convert model.pth -o model.ckpt --like target_init.ckpt --save-map resolved.yaml --json plan.json
    Without --like, a layer type that names and shapes leave open (a lone 2-D weight: Linear or Embedding) is
    guessed, with a warning naming the module.
    With --optimizer (or a --like checkpoint holding an optimizer), a full training checkpoint is converted:
    the model and its optimizer state (torch {"model", "optimizer", "step"} <-> a MindSpore checkpoint of the
    network and its optimizer), e.g.
      align convert train_step3.pth -o train_step3.ckpt --optimizer mint:AdamW
    Exit code: 0 written, 1 target keys unfilled or shapes disagree (nothing written), 2 bad input.
    """
    check_outputs(force, output=output, save_map=save_map, json=json_out)
    trust = trust_pickle or trust_pickle_alias
    training = [optimizer, from_optimizer, model_key, optimizer_key, lr, betas, momentum, eps, weight_decay,
                nesterov, step]
    if any(v is not None for v in training) or like_holds_optimizer(like, trust):
        if save_map or to or src:
            raise AlignerError("--save-map/--to/--from are for model-only conversion, not with --optimizer")
        hyper = Hyper(lr=lr, betas=_betas(betas), momentum=momentum, eps=eps, weight_decay=weight_decay,
                      nesterov=nesterov)
        training_result = convert_training_state(
            source, output, optimizer=optimizer, like_path=like, map_path=map_path, hyper=hyper, step=step,
            from_optimizer=from_optimizer, model_key=model_key, optimizer_key=optimizer_key, force=force,
            allow_incomplete=allow_incomplete, trust_pickle=trust)
        if json_out != "-":
            print_training_convert(training_result, make_console(), make_console(stderr=True), verbose)
        if json_out:
            write_convert_json(training_result, json_out)
        return int(training_result.exit_code)
    result = convert(source, output, like_path=like, map_path=map_path, to=to, src=src, force=force,
                     allow_incomplete=allow_incomplete, trust_pickle=trust,
                     save_map=save_map, progress=terminal_progress())
    if json_out != "-":
        print_convert(result, make_console(), make_console(stderr=True), verbose)
    if json_out:
        write_convert_json(result, json_out)
    return int(result.exit_code)
