"""`align check DUMP`: read one dump directory and report what looks unhealthy, with the next thing to try."""
from __future__ import annotations

import click

from aligner.cli.options import check_outputs, json_option
from aligner.core.atomic import atomic_files
from aligner.core.errors import AlignerError
from aligner.dumping.read.ranks import holds_ranks
from aligner.pipelines.check import RuleConfig, check
from aligner.pipelines.check.ranks import check_ranks
from aligner.render.check import print_check, write_check_html, write_check_json
from aligner.render.check_ranks import print_check_ranks, write_check_ranks_json
from aligner.render.console import make_console
from aligner.render.jsonout import write_json as write_output

_HELP_EPILOG = """\b
Rules and their thresholds: mappings/check_rules.yaml (docs/check.md). A rule the dump cannot feed (one step:
no trends or updates; an old stats-only dump lacking a statistic; no probes) is listed as skipped with its reason.
Probes read (aligner.save inside the dump): loss, loss_scale, grad_norm, grad_norm_clipped.
\b
Multi-rank dumps (DUMP/rank0/, rank1/, ...): each rank is checked, then the ranks of each data-parallel group against
each other: rank-weights (the same weights at every dumped step: seed consistency), rank-grads (the same gradients
after the all-reduce), rank-nonfinite (the first NaN/Inf over all ranks, with its rank and step).
\b
Exit codes: 0 no error-severity finding; 1 an error-severity finding (or a rank folder missing); 2 bad input, a bad
--rule, or every rule skipped (nothing could be checked)."""


@click.command("check", epilog=_HELP_EPILOG)
@click.argument("dump", metavar="DUMP")
@json_option
@click.option("--html", "html_out", metavar="PATH", help="Write an HTML report with per-layer gradient-norm and "
              "update-ratio charts over steps (self-contained, works offline).")
@click.option("--rule", "rules", metavar="NAME.KEY=VALUE", multiple=True,
              help="Override a threshold of mappings/check_rules.yaml, e.g. update-ratio.high=0.05 or "
                   "dead-relu.enabled=false (repeatable).")
@click.option("--force", is_flag=True, help="Overwrite existing report files.")
def command(dump: str, json_out: str | None, html_out: str | None, rules: tuple[str, ...], force: bool) -> int:
    """Check one dump directory (aligner.dump, one framework, any number of steps) for NaN/Inf origins, float16
    range, vanishing/exploding gradients, frozen weights, update ratios, dead or saturated activations, loss-scale
    mistakes and trend breaks.

    \b
    Examples:
      align check dumps_pt/
      align check dumps_ms/ --html health.html --json health.json
      align check dumps_pt/ --rule update-ratio.high=0.05 --rule dead-relu.zeros=0.95
    """
    if html_out == "-":
        raise AlignerError("--html needs a file name")
    overrides = RuleConfig.parse(rules)
    RuleConfig.load(overrides)  # a bad --rule fails before the dump is read
    check_outputs(force, json=json_out, html=html_out)
    if holds_ranks(dump):  # a multi-rank dump (rank{N}/ folders): each rank, and the ranks against each other
        return _check_ranks(dump, overrides, json_out, html_out)
    report = check(dump, overrides)
    files = [(p, w) for p, w in ((json_out, write_check_json), (html_out, write_check_html)) if p and p != "-"]
    with atomic_files([p for p, _ in files], "w") as handles:
        for (_, writer), fh in zip(files, handles):
            writer(report, fh)
    if json_out == "-":
        write_output(report, "-", write_check_json)
    else:
        print_check(report, make_console())
    return int(report.exit_code)


def _check_ranks(dump: str, overrides: dict[str, str], json_out: str | None, html_out: str | None) -> int:
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
