"""`align compare A B`: compare two dump directories and name the record where the numbers part ways."""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import IO, Callable

import click

from aligner import render  # --html and the rank table: loaded on first use (render/__init__.py)
from aligner.cli.options import (
    check_outputs,
    json_option,
    positive_int,
    strict_option,
    tolerance_options,
    tolerance_spec,
    trust_pickle_option,
)
from aligner.core.atomic import atomic_files
from aligner.core.collect import gc_paused
from aligner.core.errors import AlignerError, ExitCode
from aligner.core.frameworks import Reference
from aligner.core.tolerance import CALIBRATION_K, ToleranceSpec, parse_nonnegative
from aligner.dumping.read.ranks import holds_ranks
from aligner.pipelines import compare as pipeline  # multi-rank dumps: loaded on first use (compare/__init__.py)
from aligner.pipelines.compare.engine import ENGINES, Engine, open_engine
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.run import compare
from aligner.pipelines.compare.stream import compare_streamed
from aligner.render.compare import (
    ReportSpool,
    incomplete,
    print_table,
    summary,
    write_compare_json,
    write_csv,
    zoom,
)
from aligner.render.console import make_console
from aligner.render.jsonout import write_json as write_output
from aligner.render.progress import terminal_progress

_HELP_EPILOG = """\b
Exit codes: 0 every matched record agrees (records on one side only are listed, and fail only with --strict);
1 a numeric divergence; 2 usage or input errors, including tensor files that could not be read.
\b
Multi-rank dumps (DUMPS_A/rank0/, rank1/, ... as aligner.dump writes under torch.distributed or
mindspore.communication) are compared rank by rank, in parallel: a table of the ranks, which diverge first (by step,
then execution order), and exit 1 also when a rank's folder is missing on one side; mixed world sizes exit 2."""


@click.command("compare", epilog=_HELP_EPILOG)
@click.argument("dumps_a", metavar="DUMPS_A")
@click.argument("dumps_b", metavar="DUMPS_B")
@click.option("--ref", "ref", metavar="SIDE", help="Reference side: first, second, pytorch or mindspore "
              "(default: the PyTorch side when a manifest says so, else DUMPS_B). Relative errors divide by it.")
@click.option("--map", "map_file", metavar="FILE",
              help="Mapping YAML (e.g. from `align convert --save-map`): renames between the two sides' module paths "
                   "and parameter names, applied in whichever direction they fit.")
@tolerance_options
@click.option("--calibrate", "calibrate", metavar="DUMP_F64",
              help="A float64 dump of the reference model on the same input (aligner.noise_floor): each reference "
                   "record's tolerance becomes K times its own error against float64 where that exceeds the default, "
                   "and each verdict says how far above that noise it is.")
@click.option("--calibrate-k", "calibrate_k", metavar="K", help=f"With --calibrate: the multiple of the measured "
              f"noise a record may differ by (default {CALIBRATION_K:g}, as the torch minifier).")
@click.option("--bisect", is_flag=True, help="Binary search over execution order reading O(log n) tensor pairs; "
              "assumes divergence persists once it starts.")
@json_option
@click.option("--csv", "csv_out", metavar="PATH", help="Write one CSV row per record pair ('-' for stdout).")
@click.option("--html", "html_out", metavar="PATH", help="Write an HTML report with an interactive error-per-layer "
              "chart (self-contained, works offline); past 50,000 records its chart is downsampled and its table "
              "shows the records around each finding (--csv holds every one).")
@strict_option
@click.option("--all", "full", is_flag=True, help="Print every row, not just the context of each finding.")
@click.option("--workers", metavar="N", help="At most N tensor pairs compared in parallel (default: one per CPU; "
              "short runs and small tensors use one).")
@click.option("--engine", "engine_name", metavar="|".join(ENGINES), help="Where the tensor pairs are compared: "
              "local (default, no cluster needed) or ray (tasks on an existing Ray cluster; both dumps must be on "
              "storage its workers mount at the same paths).")
@click.option("--address", metavar="ADDR", help="With --engine ray: the head node, host:port (default: $RAY_ADDRESS, "
              "else the cluster `ray start --head` started on this machine); 'local' starts a throwaway one here.")
@trust_pickle_option
@click.option("--force", is_flag=True, help="Overwrite existing report files.")
@gc_paused()  # the reports walk every row too: a collection pass over 100,000 rows' objects costs ~0.7 s
def command(dumps_a: str, dumps_b: str, ref: str | None, map_file: str | None, rtol: tuple[str, ...],
            atol: tuple[str, ...], calibrate: str | None, calibrate_k: str | None, bisect: bool,
            json_out: str | None, csv_out: str | None, html_out: str | None,
            strict: bool, full: bool, workers: str | None, engine_name: str | None, address: str | None,
            trust_pickle: bool, trust_pickle_alias: bool, force: bool) -> int:
    """Compare two dump directories (aligner dumps or plain .npy directories) and find the first divergent record.

    \b
    Examples:
      align compare dumps_ms/ dumps_pt/
      align compare dumps_ms/ dumps_pt/ --html report.html --json result.json
      align compare dumps_ms/ dumps_pt/ --rtol 1e-4 --atol 1e-6 --rtol 'head.*:1e-3' --atol 'head.*:1e-5'
      align compare big_ms/ big_pt/ --bisect
      align compare dumps_ms/ dumps_pt/ --calibrate dumps_pt_f64/
      align compare /shared/dumps_ms/ /shared/dumps_pt/ --engine ray --address head-node:6379
    """
    Reference.parse(ref)  # a bad choice is refused before anything is read
    if html_out == "-":
        raise AlignerError("--html needs a file name")
    spec, n_workers = tolerance_spec(rtol, atol), positive_int("--workers", workers)
    if calibrate_k is not None and calibrate is None:
        raise AlignerError("--calibrate-k needs --calibrate DUMP_F64 (the float64 dump it scales the noise of)")
    k = CALIBRATION_K if calibrate_k is None else parse_nonnegative("--calibrate-k", calibrate_k)
    if k <= 0:
        raise AlignerError(f"--calibrate-k must be a number > 0, got {calibrate_k!r}")
    check_outputs(force, json=json_out, csv=csv_out, html=html_out)
    engine = open_engine(engine_name, address, n_workers)  # an unknown engine or an unreachable cluster: exit 2 here
    if holds_ranks(dumps_a) or holds_ranks(dumps_b):  # multi-rank dumps (rank{N}/ folders): rank by rank
        try:
            return _compare_ranks(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=spec, bisect=bisect,
                                  workers=n_workers, strict=strict, full=full, json_out=json_out, engine=engine,
                                  per_rank_only={"--calibrate": calibrate, "--csv": csv_out, "--html": html_out})
        finally:
            engine.close()
    # streamed (compare/stream.py: rows into the reports' spools and the HTML chart's profile as they are made, a
    # bounded window kept) unless the table of --all needs every row
    spool = ReportSpool(json_rows=bool(json_out), csv_rows=bool(csv_out)) if json_out or csv_out else None
    profile = render.ErrorProfile(spec) if html_out else None
    sink = render.Tee(spool, profile) if spool is not None and profile is not None else spool or profile
    run = compare if full else functools.partial(compare_streamed, sink=sink)
    try:
        result = run(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=spec, bisect=bisect,
                     workers=n_workers, strict=strict, calibrate=calibrate, calibrate_k=k,
                     progress=terminal_progress(), engine=engine, trust_pickle=trust_pickle or trust_pickle_alias)
    except BaseException:
        if spool is not None:
            spool.close()
        raise
    finally:
        engine.close()
    spooled = spool if result.tally is not None else None  # the rows are in the spools, not in the result
    reports: list[tuple[str, Callable[[CompareResult, IO[str]], None]]] = [
        (path, functools.partial(writer, spool=spooled))
        for path, writer in ((json_out, write_compare_json), (csv_out, write_csv)) if path]
    if html_out:
        words = _csv_command(dumps_a, dumps_b, ref, rtol, atol, strict, trust_pickle or trust_pickle_alias, html_out)
        full_table = render.FullTable(_relative(csv_out, html_out) if csv_out and csv_out != "-" else None, words)
        reports.append((html_out, functools.partial(render.write_html, profile=profile, full_table=full_table)))
    files = [(path, writer) for path, writer in reports if path != "-"]
    with atomic_files([path for path, _ in files], "w") as handles:  # the set appears whole, or not at all
        for (_, writer), fh in zip(files, handles):
            writer(result, fh)
    for path, writer in reports:
        if path == "-":
            write_output(result, path, writer)
    if "-" not in (json_out, csv_out):
        console = make_console()
        print_table(result, console, full)
        console.print(summary(result), markup=False)
        code = zoom(result)
        if code is not None:
            console.print(code, markup=False, highlight=False)
    if result.exit_code is ExitCode.USAGE:  # the reports are out; exit 2 still says why on stderr, in one line
        raise AlignerError(f"compare incomplete: {incomplete(result)}")
    return int(result.exit_code)


def _csv_command(dumps_a: str, dumps_b: str, ref: str | None, rtol: tuple[str, ...], atol: tuple[str, ...],
                 strict: bool, trust_pickle: bool, html_out: str) -> tuple[str, ...]:
    """The words of the command that writes this comparison's every row as CSV, beside the HTML page (what a long
    report's page suggests when no --csv was given)."""
    words = ["align", "compare", dumps_a, dumps_b, *(["--ref", ref] if ref else [])]
    words += [w for r in rtol for w in ("--rtol", r)] + [w for a in atol for w in ("--atol", a)]
    words += ["--strict"] * strict + ["--trust-pickle"] * trust_pickle
    page = Path(html_out)
    rows = page.with_suffix(".csv") if page.suffix != ".csv" else page.with_name(page.name + ".csv")
    return (*words, "--csv", str(rows))


def _relative(path: str, page: str) -> str:
    """`path` as the page at `page` links to it: relative to the page's folder."""
    return os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(page)))


def _compare_ranks(dumps_a: str, dumps_b: str, *, ref: str | None, map_file: str | None,
                   tolerance: ToleranceSpec, bisect: bool, workers: int | None, strict: bool, full: bool,
                   json_out: str | None, engine: Engine, per_rank_only: dict[str, str | None]) -> int:
    """`align compare A B` where A or B holds rank folders, the ranks on `engine` (the caller closes it): the rank
    table and paragraph (and --json); the options in `per_rank_only` (--calibrate, --csv, --html) are refused: they
    describe one rank's comparison."""
    given = [opt for opt, value in per_rank_only.items() if value]
    if given:
        raise AlignerError(f"{', '.join(given)}: not for multi-rank dumps; give one rank's folders, e.g. "
                           f"align compare {dumps_a}/rank0 {dumps_b}/rank0 {given[0]} ...")
    result = pipeline.compare_ranks(dumps_a, dumps_b, ref=ref, map_file=map_file, tolerance=tolerance,
                                    bisect=bisect, workers=workers, strict=strict, engine=engine,
                                    progress=terminal_progress())
    if json_out:
        write_output(result, json_out, render.write_ranks_json)
    if json_out != "-":
        console = make_console()
        render.print_ranks(result, console, full)
        console.print(render.ranks_summary(result), markup=False)
    return int(result.exit_code)
