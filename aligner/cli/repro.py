"""`align repro A B --module PATH -o DIR`: a standalone directory that rebuilds one module in both frameworks."""
from __future__ import annotations

from pathlib import Path

import click

from aligner.cli.options import tolerance_options, tolerance_spec
from aligner.core.errors import AlignerError
from aligner.core.frameworks import Reference
from aligner.pipelines.repro import repro
from aligner.render.console import make_console
from aligner.render.repro import print_repro

_HELP_EPILOG = """\b
The directory holds repro.py, the reference side's recorded inputs of the module, each side's recorded parameters
and outputs (.npy), README.md and repro.json. `python DIR/repro.py` exits 0 when the two layers agree on those
inputs, 1 when they differ beyond the tolerance, 2 when it cannot run. It needs numpy, torch and mindspore only,
unless a layer is built by its factory (README.md says which). A class of another package (timm's LayerNorm2d,
mindcv's ConvNextLayerNorm) is built as a standard layer only where that reproduces its own recorded output.
Dump both sides with aligner.dump(model, DIR, params=True) (a layer without parameters needs no params=True).
\b
Exit codes: 0 the directory was written; 2 usage or input errors (a module in neither dump, a dump without inputs
or parameters, a layer that needs --factory-a/--factory-b, -o DIR not empty without --force)."""


@click.command("repro", epilog=_HELP_EPILOG)
@click.argument("dumps_a", metavar="DUMPS_A")
@click.argument("dumps_b", metavar="DUMPS_B")
@click.option("--module", "module", metavar="PATH", required=True,
              help="The module to reproduce, as either dump names it (its twin is what compare pairs it with).")
@click.option("-o", "--output", "output", metavar="DIR", required=True, help="The repro directory to write.")
@click.option("--ref", "ref", metavar="SIDE", help="Reference side, whose inputs both layers run on: first, second, "
              "pytorch or mindspore (default: the PyTorch side, as in compare).")
@click.option("--factory-a", "factory_a", metavar="MODULE:CALLABLE",
              help="For DUMPS_A's layer when no torch.nn/mindspore.nn class built from its recorded attributes "
                   "reproduces it: MODULE:CALLABLE or FILE.py:CALLABLE returning the whole model (its live layer's "
                   "class picks the standard layer; repro.py imports the factory only when none fits).")
@click.option("--factory-b", "factory_b", metavar="MODULE:CALLABLE", help="The same for DUMPS_B's layer.")
@tolerance_options
@click.option("--force", is_flag=True, help="Replace DIR when it holds a previous repro (and nothing else).")
def command(dumps_a: str, dumps_b: str, module: str, output: str, ref: str | None, factory_a: str | None,
            factory_b: str | None, rtol: tuple[str, ...], atol: tuple[str, ...], force: bool) -> int:
    """Write a minimal, standalone reproduction of one module's divergence between two dumps.

    \b
    Examples:
      align repro dumps_ms/ dumps_pt/ --module blocks.0.mlp.act -o repro_act/
      python repro_act/repro.py
      align repro dumps_ms/ dumps_pt/ --module blocks.0.attn -o repro_attn/ \\
          --factory-a models.py:make_ms --factory-b models.py:make_torch
    """
    Reference.parse(ref)  # a bad choice is refused before anything is read
    if not module.strip():
        raise AlignerError("--module needs a module path (e.g. blocks.0.attn)")
    spec = tolerance_spec(rtol, atol)
    result = repro(dumps_a, dumps_b, module, Path(output), ref=ref, factory_a=factory_a, factory_b=factory_b,
                   tolerance=spec, force=force)
    print_repro(result, make_console())
    return 0
