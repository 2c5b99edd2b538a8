"""`align data DIR_A DIR_B` (two recorded input pipelines compared) and `align data check DIR` (one checked)."""
from __future__ import annotations

import click

from aligner.cli.options import check_outputs, json_option, positive_int
from aligner.core.atomic import atomic_files
from aligner.core.errors import AlignerError
from aligner.pipelines.data import DataCheckResult, DataCompareResult, check_data, compare_data
from aligner.render.console import make_console
from aligner.render.data import print_data_check, print_data_compare, write_data_html, write_data_json
from aligner.render.jsonout import write_json

_HELP_EPILOG = """\b
Record each side first, in its own training script:
  aligner.record_data(loader, "data_pt/", batches=20, tensors=True, epochs=2)
  aligner.record_data(dataset, "data_ms/", batches=20, tensors=True, epochs=2)
Rules, their checklist items and limits: mappings/data_rules.yaml.
\b
Exit codes: 0 no error-severity finding; 1 an error-severity finding; 2 bad input (a missing folder, not a data
dump, a model dump, different fields on the two sides)."""


@click.command("data", epilog=_HELP_EPILOG)
@click.argument("dirs", metavar="DIR_A DIR_B | check DIR", nargs=-1, required=True)
@json_option
@click.option("--html", "html_out", metavar="PATH", help="Write a static HTML report.")
@click.option("--classes", metavar="N", help="check: labels must lie in 0..N-1 (default: negative labels only are "
              "out of range; a class with no sample counts as rare).")
@click.option("--force", is_flag=True, help="Overwrite existing report files.")
def command(dirs: tuple[str, ...], json_out: str | None, html_out: str | None, classes: str | None,
            force: bool) -> int:
    """Compare the data two input pipelines fed their models (aligner.record_data folders): which samples are the
    same, the first that differs, and why (layout, value range, normalisation, channel order, interpolation,
    augmentation, labels, order and batches, padding, sharding), each with a fix. `align data check DIR` checks one
    side: missing values, class balance, duplicates, constant fields, labels out of range.

    \b
    Examples:
      align data data_pt/ data_ms/
      align data data_pt/ data_ms/ --json data.json --html data.html
      align data check data_ms/ --classes 10
    """
    if html_out == "-":
        raise AlignerError("--html needs a file name")
    checking = dirs[0] == "check" and len(dirs) == 2
    if not checking and len(dirs) != 2:
        raise AlignerError("give two data dump folders (align data DIR_A DIR_B) or one to check (align data check "
                           "DIR); a folder named check: ./check")
    if classes is not None and not checking:
        raise AlignerError("--classes is for align data check DIR")
    count = positive_int("--classes", classes)
    check_outputs(force, json=json_out, html=html_out)
    result: DataCompareResult | DataCheckResult = check_data(dirs[1], count) if checking \
        else compare_data(dirs[0], dirs[1])
    files = [(p, w) for p, w in ((json_out, write_data_json), (html_out, write_data_html)) if p and p != "-"]
    with atomic_files([p for p, _ in files], "w") as handles:
        for (_, writer), fh in zip(files, handles):
            writer(result, fh)
    if json_out == "-":
        write_json(result, "-", write_data_json)
    elif isinstance(result, DataCompareResult):
        print_data_compare(result, make_console())
    else:
        print_data_check(result, make_console())
    return int(result.exit_code)
