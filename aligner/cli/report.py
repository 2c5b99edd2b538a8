"""`align report RESULT.json`: show a saved result again (terminal, --html) without running its pipeline."""
from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Any, Callable

import click

from aligner import render  # the HTML page and the rank table: loaded on first use (render/__init__.py)
from aligner.cli.losses import SHOW as SHOW_LOSSES
from aligner.cli.options import check_outputs
from aligner.core.atomic import atomic_files
from aligner.core.errors import AlignerError, ExitCode
from aligner.pipelines.audit.report import AuditReport
from aligner.pipelines.audit.source import SourceAuditReport
from aligner.pipelines.check.ranks import RankedCheckReport
from aligner.pipelines.check.report import CheckReport
from aligner.pipelines.compare.ranks import RankedCompareResult
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.data.result import DataCheckResult, DataCompareResult
from aligner.pipelines.diff.checkpoints import DiffResult
from aligner.pipelines.diff.grads import DiffUpdates
from aligner.pipelines.doctor.result import DoctorResult
from aligner.pipelines.inspect import InspectResult
from aligner.pipelines.losses.diagnose import LossReport
from aligner.pipelines.replay.result import ReplayResult
from aligner.pipelines.report import load_report
from aligner.render import replay
from aligner.render.audit import print_audit, print_source
from aligner.render.check import print_check, write_check_html
from aligner.render.check_ranks import print_check_ranks
from aligner.render.compare import print_table, summary, zoom
from aligner.render.console import make_console
from aligner.render.data import print_data_check, print_data_compare, write_data_html
from aligner.render.diff import print_diff
from aligner.render.doctor import print_doctor
from aligner.render.inspect import print_inspect
from aligner.render.losses import print_report as print_losses
from aligner.render.losses import print_warnings as print_loss_warnings
from aligner.render.update_rule import print_update_report

if TYPE_CHECKING:
    from rich.console import Console


@click.command("report")
@click.argument("result_json", metavar="RESULT.json", type=click.Path(dir_okay=False))
@click.option("--html", "html_out", metavar="FILE", help="Also write the HTML page (a single-process compare, "
              "align data, a one-dump align check).")
@click.option("--all", "full", is_flag=True, help="Show every row of the table, not only the context of findings "
              "(a diff: every parameter, as diff --verbose).")
@click.option("--force", is_flag=True, help="Overwrite an existing --html file.")
def command(result_json: str, html_out: str | None, full: bool, force: bool) -> int:
    """Show RESULT.json, a result `align compare --json` or `align check --json` saved (one dump, or rank by rank),
    `align audit --json` saved (models, or --source), `align inspect`, `align diff` (with --grads too), `align replay`,
    `align data --json`, `align losses --json` or `align doctor` (its doctor.json) saved, again as the command printed
    it, without the dumps, models, checkpoints or logs: for a compare the table, the paragraph, the zoom-in and with
    --html its page. What the JSON never held (the dumps' statistics, the norms of exactly equal tensors) is not shown.

    \b
    Examples:
      align compare dumps_ms/ dumps_pt/ --json result.json
      align report result.json --html report.html
    Exit code: the saved result's (0 passed, 1 diverged, 2 incomplete); 2 for a file that is no saved result.
    """
    if html_out == "-":
        raise AlignerError("--html needs a file name")
    check_outputs(force, html=html_out)
    if html_out and os.path.realpath(html_out) == os.path.realpath(result_json):
        raise AlignerError(f"--html {html_out} is RESULT.json itself: name another file")
    result = load_report(result_json)
    page = _PAGES.get(type(result))
    if html_out and page is None:
        raise AlignerError("--html: only a single-process compare result, a one-dump check and align data's have a "
                           "page (for rank by rank, save one rank's: align compare A/rank0 B/rank0 --json r.json)")
    if html_out and page is not None:
        with atomic_files([html_out], "w") as (fh,):
            page(result, fh)
    _SHOW[type(result)](result, make_console(), full)
    if isinstance(result, ReplayResult) and result.exit_code is ExitCode.USAGE:  # as align replay: after the report,
        raise AlignerError(f"replay incomplete: {replay.incomplete(result)}")   # the reason in one line on stderr
    return int(result.exit_code)


def _show_compare(result: CompareResult, console: Console, full: bool) -> None:
    print_table(result, console, full)
    console.print(summary(result), markup=False)
    code = zoom(result)
    if code is not None:
        console.print(code, markup=False, highlight=False)


def _show_ranks(result: RankedCompareResult, console: Console, full: bool) -> None:
    render.print_ranks(result, console, full)
    console.print(render.ranks_summary(result), markup=False)


def _show_replay(result: ReplayResult, console: Console, full: bool) -> None:
    replay.print_table(result, console, full)
    console.print(replay.summary(result), markup=False)


def _show_losses(result: LossReport, console: Console, full: bool) -> None:
    print_loss_warnings(make_console(stderr=True), result)  # as align losses: its warnings on stderr, first
    print_losses(console, result, len(result.steps) if full else SHOW_LOSSES)


def _show_diff_updates(result: DiffUpdates, console: Console, full: bool) -> None:
    print_diff(result.diff, console, verbose=full)
    print_update_report(result.updates, console)


# what each command printed, by the type of result it saved (full: --all)
_SHOW: dict[type, Callable[[Any, Console, bool], None]] = {
    CompareResult: _show_compare, RankedCompareResult: _show_ranks, ReplayResult: _show_replay,
    DiffUpdates: _show_diff_updates, DiffResult: lambda r, c, full: print_diff(r, c, verbose=full),
    CheckReport: lambda r, c, _: print_check(r, c), RankedCheckReport: lambda r, c, _: print_check_ranks(r, c),
    DataCompareResult: lambda r, c, _: print_data_compare(r, c),
    DataCheckResult: lambda r, c, _: print_data_check(r, c),
    AuditReport: lambda r, c, _: print_audit(r, c), SourceAuditReport: lambda r, c, _: print_source(r, c),
    InspectResult: lambda r, c, _: print_inspect(r, c), LossReport: _show_losses,
    DoctorResult: lambda r, c, _: print_doctor(r, c)}
# the results whose command writes a page with --html, and its writer
_PAGES: dict[type, Callable[[Any, IO[str]], None]] = {
    CompareResult: lambda r, fh: render.write_html(r, fh), CheckReport: write_check_html,
    DataCompareResult: write_data_html, DataCheckResult: write_data_html}
