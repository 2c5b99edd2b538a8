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
from aligner.core.errors import AlignerError
from aligner.pipelines.diff import explain_updates
from aligner.pipelines.diff.checkpoints import diff_checkpoints
from aligner.render.console import make_console
from aligner.render.diff import print_diff, write_diff_json
from aligner.render.update_rule import print_update_report, write_update_json

_HELP_EPILOG = """\b
Hints under the table name known patterns: BatchNorm running statistics moving 9x (or 1/9) as far (momentum written
in the other framework's convention: MindSpore momentum = 1 - torch momentum), every update a constant multiple of
the other side's (--init: the learning rate differs), a parameter updated on one side only (--init: frozen, or left
out of one optimizer).
\b
The update step explained (--grads DUMP_A DUMP_B, after k >= 3 steps): from the weights before step 1 (--init for A,
--init-b for B; --init alone when both sides started from the same converted weights, or neither when the dumps hold
per-step values from aligner.dump(..., params=True)) and both sides' gradient dumps (aligner.dump around each
step's backward), fit per parameter the rule each side applied (SGD with momentum/dampening/nesterov/L2, Adam,
AdamW, MindSpore nn.Adam, nn.AdamWeightDecay; global-norm clipping; a loss scale), group parameters by rule, and name
the terms that differ (learning rate, weight decay on which parameters, eps, betas, clipping, loss scale not removed,
bias correction). Fewer than 3 steps is refused; parameters no rule fits are reported, never guessed.
\b
Exit codes: 0 every compared parameter agrees within tolerance; 1 a parameter differs, has another shape, cannot be
paired unambiguously, or (with --init) was updated on one side only; keys present on one side only also fail with
--strict (they are always reported); 2 bad input (missing or corrupted file, different models, bad --map or option)."""


@click.command("diff", epilog=_HELP_EPILOG)
@click.argument("ckpt_a", metavar="A")
@click.argument("ckpt_b", metavar="B")
@click.option("--map", "map_file", metavar="FILE", help="Mapping YAML renaming A's parameters to B's (as in convert).")
@click.option("--init", "init", metavar="FILE", help="The initial checkpoint (either framework): report which "
              "parameters each side changed from it, naming ones updated on one side only. With --grads: A's "
              "weights before step 1 (B's too unless --init-b is given).")
@click.option("--init-b", "init_b", metavar="FILE", help="With --grads: B's weights before step 1.")
@click.option("--grads", "grads", metavar="DUMP_A DUMP_B", nargs=2, default=None,
              help="Gradient dumps of A and B over the same k >= 3 steps (aligner.dump directories): fit and compare "
                   "each side's update rule.")
@tolerance_options
@strict_option
@json_option
@click.option("--force", is_flag=True, help="Overwrite an existing --json file.")
@trust_pickle_option
@click.option("-v", "--verbose", is_flag=True, help="Show every parameter, not only the differing ones.")
def command(ckpt_a: str, ckpt_b: str, map_file: str | None, init: str | None, init_b: str | None,
            grads: tuple[str, str] | None, rtol: tuple[str, ...],
            atol: tuple[str, ...], strict: bool, json_out: str | None, force: bool, trust_pickle: bool,
            trust_pickle_alias: bool, verbose: bool) -> int:
    """Compare checkpoint A against the reference B (e.g. weights after one step in MindSpore and in PyTorch).

    \b
    Examples:
      align diff step1_ms.ckpt step1_pt.pth
      align diff step1_ms.ckpt step1_pt.pth --init init_pt.pth -v
      align diff step1_ms.ckpt step1_pt.pth --map names.yaml --json diff.json
      align diff step1_ms.ckpt step1_pt.pth --rtol 1e-4 --atol 1e-6 --rtol 'fc.*:1e-3' --atol 'fc.*:1e-5'
      align diff step3_ms.ckpt step3_pt.pth --init init_ms.ckpt --init-b init_pt.pth --grads dump_ms dump_pt
    """
    tolerance = tolerance_spec(rtol, atol)
    check_outputs(force, json=json_out)
    if init_b and not grads:
        raise AlignerError("--init-b needs --grads (it is B's starting point for fitting the update rule)")
    trust = trust_pickle or trust_pickle_alias
    result = diff_checkpoints(ckpt_a, ckpt_b, map_path=map_file, init_path=init, tolerance=tolerance, strict=strict,
                              trust_pickle=trust)
    report = explain_updates(ckpt_a, ckpt_b, grads[0], grads[1], init_a=init, init_b=init_b, map_path=map_file,
                             trust_pickle=trust) if grads else None
    if json_out != "-":
        console = make_console()
        print_diff(result, console, verbose)
        if report is not None:
            print_update_report(report, console)
    if json_out:
        if report is None:
            write_diff_json(result, json_out)
        else:
            write_update_json(result, report, json_out)
    return max(int(result.exit_code), int(report.exit_code) if report is not None else 0)
