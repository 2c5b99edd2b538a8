"""`align compare A B`: compare two dump directories and name the record where the numbers part ways."""
from __future__ import annotations

import click

_HELP_EPILOG = """\b
Exit codes: 0 everything matches; 1 a divergence (or a record present on one side only) was found;
2 usage or input errors, including tensor files that could not be read while the rest matched."""


def _workers(text: str | None) -> int | None:
    from aligner.core.errors import AlignerError

    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise AlignerError(f"--workers must be a whole number >= 1, got {text!r}")
    return int(text)


def _reference(text: str | None) -> str | None:
    from aligner.core.errors import AlignerError

    choices = ("first", "second", "pytorch", "mindspore")
    if text is not None and text not in choices:
        raise AlignerError(f"--ref must be one of {', '.join(choices)}, got {text!r}")
    return text


def _outputs(json_out: str | None, csv_out: str | None, html_out: str | None, force: bool) -> None:
    """Refuse bad output paths before any work (stdout '-' is allowed once, for --json or --csv)."""
    from aligner.core.atomic import check_output
    from aligner.core.errors import AlignerError

    if json_out == "-" and csv_out == "-":
        raise AlignerError("--json - and --csv - cannot both write to stdout")
    if html_out == "-":
        raise AlignerError("--html needs a file name")
    paths = [p for p in (json_out, csv_out, html_out) if p and p != "-"]
    if len(set(paths)) != len(paths):
        raise AlignerError("--json, --csv and --html must name different files")
    for p in paths:
        check_output(p, force)


@click.command("compare", epilog=_HELP_EPILOG)
@click.argument("dumps_a", metavar="DUMPS_A")
@click.argument("dumps_b", metavar="DUMPS_B")
@click.option("--ref", "ref", metavar="SIDE", help="Reference side: first, second, pytorch or mindspore "
              "(default: the PyTorch side when a manifest says so, else DUMPS_B). Relative errors divide by it.")
@click.option("--map", "map_file", metavar="FILE", help="Mapping YAML renaming DUMPS_A's module paths to DUMPS_B's.")
@click.option("--rtol", metavar="X", help="Relative tolerance for every record (default: per dtype, as torch.testing).")
@click.option("--atol", metavar="X", help="Absolute tolerance for every record (default: per dtype).")
@click.option("--bisect", is_flag=True, help="Binary search over execution order reading O(log n) tensor pairs; "
              "assumes divergence persists once it starts.")
@click.option("--json", "json_out", metavar="FILE", help="Write the full result as JSON ('-' for stdout).")
@click.option("--csv", "csv_out", metavar="FILE", help="Write one CSV row per record pair ('-' for stdout).")
@click.option("--html", "html_out", metavar="FILE", help="Write an HTML report with an error-per-layer plot.")
@click.option("--all", "full", is_flag=True, help="Print every row, not just the context of each finding.")
@click.option("--workers", metavar="N", help="At most N tensor pairs compared in parallel (default: one per CPU; "
              "short runs and small tensors use one).")
@click.option("--force", is_flag=True, help="Overwrite existing report files.")
def command(dumps_a: str, dumps_b: str, ref: str | None, map_file: str | None, rtol: str | None, atol: str | None,
            bisect: bool, json_out: str | None, csv_out: str | None, html_out: str | None, full: bool,
            workers: str | None, force: bool) -> int:
    """Compare two dump directories (aligner dumps or plain .npy directories) and find the first divergent record.

    \b
    Examples:
      align compare dumps_ms/ dumps_pt/
      align compare dumps_ms/ dumps_pt/ --html report.html --json result.json
      align compare big_ms/ big_pt/ --bisect
    """
    from aligner.cli.options import parse_tolerance
    from aligner.pipelines.compare.run import run_compare

    rtol_v, atol_v, workers_v = parse_tolerance("--rtol", rtol), parse_tolerance("--atol", atol), _workers(workers)
    _outputs(json_out, csv_out, html_out, force)
    return run_compare(dumps_a, dumps_b, ref=_reference(ref), map_file=map_file, rtol=rtol_v, atol=atol_v,
                       bisect=bisect, json_out=json_out, csv_out=csv_out, html_out=html_out, full=full,
                       workers=workers_v)
