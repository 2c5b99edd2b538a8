"""The `align` command line. Subcommands live in aligner.cli.* and are imported only when used."""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

import click

from aligner.core.atomic import remove_temp_files
from aligner.core.errors import EXIT_USAGE, AlignerError
from aligner.core.text import one_line

# name -> (module, one-line help). The help text is here so `align --help` imports no subcommand module.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("aligner.cli.inspect", "List the tensors of a checkpoint: name, shape, dtype, statistics."),
    "convert": ("aligner.cli.convert", "Convert a checkpoint between PyTorch, MindSpore and safetensors."),
    "compare": ("aligner.cli.compare", "Compare two dump directories and find the first divergent layer."),
    "losses": ("aligner.cli.losses", "Compare two loss curves and diagnose where training parts ways."),
    "diff": ("aligner.cli.diff", "Compare two checkpoints across frameworks, parameter by parameter."),
    "audit": ("aligner.cli.audit", "Find settings whose defaults differ between a torch model and its MindSpore port."),
    "repro": ("aligner.cli.repro", "Write a standalone script reproducing one module of two dumps in both frameworks."),
    "replay": ("aligner.cli.replay", "Replay each module on the reference's inputs: its own error vs inherited."),
    "check": ("aligner.cli.check", "Check one dump for NaN origins, vanishing gradients, frozen weights and more."),
    "doctor": ("aligner.cli.doctor", "Run the whole migration check on two model factories: one verdict, one page."),
    "report": ("aligner.cli.report", "Show a saved result (compare --json) again: table, paragraph, --html page."),
    "data": ("aligner.cli.data", "Compare two input pipelines' recorded samples, or check one (align data check)."),
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
    Every step below at once, from the two model constructors:
      align doctor make_pt.py:build make_ms.py:build --input-shape 1,3,224,224 -o doctor/

    \b
    Typical workflow (README's workflow table, step by step):
      0. audit: defaults that differ between the two models
         align audit make_pt.py:build make_ms.py:build --input-shape 1,3,224,224
      1. check parameters: counts, shapes
         align inspect model.pth; align diff ms.ckpt pt.pth
      2. same starting weights
         align convert model.pth -o model.ckpt
      3. pin randomness (in both training scripts)
         aligner.fix_random(0); aligner.disable_dropout(model)
      3a. same data: aligner.save("batch", x) before the forward, both sides
         aligner.record_data(loader, "data_pt/")   (and "data_ms/")
         align data data_pt/ data_ms/; align data check data_ms/
      4. compare losses: step 1 differs: forward; step 2: backward/optimizer
         align losses train_ms.log train_pt.log
      4a. forward differs: dump both sides, find the first divergent layer
         with aligner.dump(model, "dumps_pt/"): ...   (and "dumps_ms/")
         align compare dumps_ms/ dumps_pt/
      4b. update differs: the weights after one optimizer step
         align diff step1_ms.ckpt step1_pt.pth --init init.pth
      4c. training health (one side)
         align check dumps_pt/
      5. confirm, hand off: the layer's own error; a standalone script
         align replay dumps_pt/ dumps_ms/ --factory port.py:build_ms
         align repro dumps_ms/ dumps_pt/ --module PATH -o repro/
    """


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived; this process's temp files are already gone. Unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _StderrNotes(logging.Handler):
    """aligner's log records (e.g. "removed stale temp file ...") as `align: MESSAGE` lines on the current stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"align: {one_line(record.getMessage())}", err=True)


_received: list[int] = []  # the signals that arrived during this main()


def _on_signal(signum: int, _frame: object) -> None:
    """Remove the temp files at once (the unwinding may be slow, or a writer library may swallow it), then unwind."""
    _received.append(signum)
    remove_temp_files()
    raise Interrupted(signum)


def _interrupted(signum: int) -> NoReturn:
    """One line, and the shell's code for death by that signal (128 + its number: 130 for Ctrl-C, 143 for SIGTERM)."""
    click.echo(f"align: interrupted by {signal.Signals(signum).name} (temp files removed)", err=True)
    sys.exit(128 + signum)


def _run(argv: list[str] | None) -> NoReturn:
    """Run the command and exit: its code, or one line on stderr and the code for the error."""
    try:
        code = cli.main(args=argv, prog_name="align", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        click.echo(f"align: error: {one_line(exc.format_message())}{hint}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort as exc:  # click's form of Ctrl-C (after a blank line closing the ^C echo)
        if isinstance(exc.__cause__, KeyboardInterrupt):
            _interrupted(exc.__cause__.signum if isinstance(exc.__cause__, Interrupted) else signal.SIGINT)
        click.echo("align: aborted", err=True)
        sys.exit(EXIT_USAGE)
    except Exception as exc:
        if _received:  # the signal surfaced wrapped in another exception (e.g. raised inside torch.save's writes)
            _interrupted(_received[0])
        if isinstance(exc, AlignerError):
            click.echo(f"align: error: {one_line(str(exc))}", err=True)
            sys.exit(exc.exit_code)
        if os.environ.get("ALIGN_DEBUG"):  # a bug of ours: still one line, with a way to get the traceback
            raise
        click.echo(f"align: internal error: {type(exc).__name__}: {one_line(str(exc))} "
                   "(set ALIGN_DEBUG=1 for the traceback)", err=True)
        sys.exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Commands return their exit code; user errors become one line on stderr. SIGINT, SIGTERM
    and SIGHUP remove the temp files of outputs being written before exiting (a signal the caller set to be ignored,
    as nohup does, stays ignored); the previous handlers are restored on the way out."""
    _received.clear()
    notes = _StderrNotes(logging.INFO)
    logging.getLogger("aligner").addHandler(notes)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                previous[sig] = signal.signal(sig, _on_signal)
    try:
        _run(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logging.getLogger("aligner").removeHandler(notes)


if __name__ == "__main__":
    main()
