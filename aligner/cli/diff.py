"""`align diff A B`: compare two checkpoints across frameworks, parameter by parameter, and say which ones differ."""
from __future__ import annotations

import click

from aligner.cli.options import (
    check_outputs,
    json_option,
    strict_option,
    tolerance_options,
    tolerance_spec,
    trust_pickle_option,
)
from aligner.pipelines.diff import diff_checkpoints
from aligner.render.console import make_console
from aligner.render.diff import print_diff, write_diff_json

_HELP_EPILOG = """\b
Hints under the table name known patterns: BatchNorm running statistics moving 9x (or 1/9) as far (momentum written
in the other framework's convention: MindSpore momentum = 1 - torch momentum), every update a constant multiple of
the other side's (--init: the learning rate differs), a parameter updated on one side only (--init: frozen, or left
out of one optimizer).
\b
Exit codes: 0 every compared parameter agrees within tolerance; 1 a parameter differs, has another shape, cannot be
paired unambiguously, or (with --init) was updated on one side only; keys present on one side only also fail with
--strict (they are always reported); 2 bad input (missing or corrupted file, different models, bad --map or option)."""


@click.command("diff", epilog=_HELP_EPILOG)
@click.argument("ckpt_a", metavar="A")
@click.argument("ckpt_b", metavar="B")
@click.option("--map", "map_file", metavar="FILE", help="Mapping YAML renaming A's parameters to B's (as in convert).")
@click.option("--init", "init", metavar="FILE", help="The initial checkpoint (either framework): report which "
              "parameters each side changed from it, naming ones updated on one side only.")
@tolerance_options
@strict_option
@json_option
@click.option("--force", is_flag=True, help="Overwrite an existing --json file.")
@trust_pickle_option
@click.option("-v", "--verbose", is_flag=True, help="Show every parameter, not only the differing ones.")
def command(ckpt_a: str, ckpt_b: str, map_file: str | None, init: str | None, rtol: tuple[str, ...],
            atol: tuple[str, ...], strict: bool, json_out: str | None, force: bool, trust_pickle: bool,
            trust_pickle_alias: bool, verbose: bool) -> int:
    """Compare checkpoint A against the reference B (e.g. weights after one step in MindSpore and in PyTorch).

    \b
    Examples:
      align diff step1_ms.ckpt step1_pt.pth
      align diff step1_ms.ckpt step1_pt.pth --init init_pt.pth -v
      align diff step1_ms.ckpt step1_pt.pth --map names.yaml --json diff.json
      align diff step1_ms.ckpt step1_pt.pth --rtol 1e-4 --atol 1e-6 --rtol 'fc.*:1e-3' --atol 'fc.*:1e-5'
    """
    tolerance = tolerance_spec(rtol, atol)
    check_outputs(force, json=json_out)
    result = diff_checkpoints(ckpt_a, ckpt_b, map_path=map_file, init_path=init, tolerance=tolerance, strict=strict,
                              trust_pickle=trust_pickle or trust_pickle_alias)
    if json_out != "-":
        print_diff(result, make_console(), verbose)
    if json_out:
        write_diff_json(result, json_out)
    return int(result.exit_code)
