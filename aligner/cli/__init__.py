"""The `align` command line. Subcommands live in aligner.cli.* and are imported only when used."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from aligner.core.errors import EXIT_USAGE, AlignerError

# name -> (module, one-line help). The help text is here so `align --help` imports no subcommand module.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("aligner.cli.inspect", "List the tensors of a checkpoint: name, shape, dtype, statistics."),
    "convert": ("aligner.cli.convert", "Convert a checkpoint between PyTorch, MindSpore and safetensors."),
    "compare": ("aligner.cli.compare", "Compare two dump directories and find the first divergent layer."),
    "losses": ("aligner.cli.losses", "Compare two loss curves and diagnose where training parts ways."),
    "diff": ("aligner.cli.diff", "Compare two checkpoints across frameworks, parameter by parameter."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use, keeping `align --help` fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if importlib.util.find_spec(module) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, _ = COMMANDS[name]
        return importlib.import_module(module).command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="aligner")
def cli() -> None:
    """aligner: prove a PyTorch <-> MindSpore migration computes the same numbers, and find where it doesn't.

    \b
    Typical workflow:
      align inspect model.pth                     # parameters, shapes, dtypes
      align convert model.pth -o model.ckpt       # same weights on both sides
      align losses train_ms.log train_pt.log      # step 1 / step 2 diagnosis
      align compare dumps_ms/ dumps_pt/           # first divergent layer
      align diff after_step_ms.ckpt after_step_pt.pth
    """


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Commands return their exit code; user errors become one line on stderr."""
    try:
        code = cli.main(args=argv, prog_name="align", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        click.echo(f"align: error: {exc.format_message()}{hint}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo("align: aborted", err=True)
        sys.exit(EXIT_USAGE)
    except AlignerError as exc:
        click.echo(f"align: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("align: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug of ours: still one line, with a way to get the traceback
        if os.environ.get("ALIGN_DEBUG"):
            raise
        click.echo(f"align: internal error: {type(exc).__name__}: {exc} (set ALIGN_DEBUG=1 for the traceback)",
                   err=True)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
