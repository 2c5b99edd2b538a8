"""The multi-rank modes of `align compare` and `align check`: taken when a DUMP argument holds rank{N}/ folders."""
from __future__ import annotations

from aligner.core.errors import AlignerError
from aligner.core.tolerance import ToleranceSpec
from aligner.pipelines.check.ranks import check_ranks
from aligner.pipelines.compare.engine import Engine
from aligner.pipelines.compare.ranks import compare_ranks
from aligner.render.check_ranks import print_check_ranks, write_check_ranks_json
from aligner.render.console import make_console
from aligner.render.jsonout import write_json as write_output
from aligner.render.progress import terminal_progress
from aligner.render.ranks import print_ranks, summary, write_json


def compare_command(dumps_a: str, dumps_b: str, *, ref: str | None, map_file: str | None,
                    tolerance: ToleranceSpec, bisect: bool, workers: int | None, strict: bool, full: bool,
                    json_out: str | None, engine: Engine, per_rank_only: dict[str, str | None]) -> int:
    """`align compare A B` where A or B holds rank folders, the ranks on `engine` (the caller closes it): the rank
    table and paragraph (and --json); the options in `per_rank_only` (--calibrate, --csv, --html) are refused: they
    describe one rank's comparison."""
    given = [opt for opt, value in per_rank_only.items() if value]
    if given:
        raise AlignerError(f"{', '.join(given)}: not for multi-rank dumps; give one rank's folders, e.g. "
                           f"align compare {dumps_a}/rank0 {dumps_b}/rank0 {given[0]} ...")
    result = compare_ranks(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=tolerance, bisect=bisect,
                           workers=workers, strict=strict, engine=engine, progress=terminal_progress())
    if json_out:
        write_output(result, json_out, write_json)
    if json_out != "-":
        console = make_console()
        print_ranks(result, console, full)
        console.print(summary(result), markup=False)
    return int(result.exit_code)


def check_command(dump: str, overrides: dict[str, str], json_out: str | None, html_out: str | None) -> int:
    """`align check DUMP` where DUMP holds rank folders: each rank's health check and the cross-rank rules."""
    if html_out:
        raise AlignerError(f"--html: not for multi-rank dumps; give one rank's folder, e.g. align check {dump}/rank0 "
                           "--html PATH")
    report = check_ranks(dump, overrides)
    if json_out:
        write_output(report, json_out, write_check_ranks_json)
    if json_out != "-":
        print_check_ranks(report, make_console())
    return int(report.exit_code)
