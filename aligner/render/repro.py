"""Render what `align repro` wrote: the directory, its layers, its size, and the command that runs it."""
from __future__ import annotations

import shlex

from rich.console import Console

from aligner.pipelines.repro import Build, ReproResult


def size_text(n: int) -> str:
    """Bytes in words: 812 bytes, 13.4 KiB, 2.1 MiB."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def print_repro(result: ReproResult, console: Console) -> None:
    """Where, which layers and how each is built (a stand-in: what was measured), the tolerance, what running it
    needs, and how to run it."""
    ref, other = result.reference, result.reference.other
    console.print(f"wrote {result.directory}/ ({len(result.files)} files, {size_text(result.size_bytes)})",
                  markup=False)
    for fw in (ref, other):
        role = "reference" if fw is ref else "other"
        console.print(f"  {fw:<9} {result.modules[fw]!r} ({result.classes[fw]}), built from its "
                      f"{'recorded attributes' if result.built[fw] is Build.ATTRIBUTES else 'factory'} [{role}]",
                      markup=False, highlight=False)
        if fw in result.stand_ins:
            stand_in = result.stand_ins[fw]
            left = f", leaving out its recorded {', '.join(stand_in.left_out)}" if stand_in.left_out else ""
            console.print(f"            as {stand_in.spelling} ({stand_in.layout}{left}): reproduces its own recorded "
                          f"output, max abs error {stand_in.max_abs_err:.3g}", markup=False, highlight=False)
    state = "diverged in the dumps" if result.diverged else "agreed in the dumps"
    console.print(f"  step {result.step}, {state}; tolerance {result.tolerance}", markup=False, highlight=False)
    factories = [f"{fw}'s factory" + (f" ({', '.join(pkgs)})" if pkgs else "") for fw, pkgs in result.needs.items()]
    console.print(f"  repro.py needs numpy, torch and mindspore{' and ' + ' and '.join(factories) if factories else ''}"
                  f"{'' if factories else ' only'}", markup=False, highlight=False)
    console.print(f"run: python {shlex.quote(str(result.directory / 'repro.py'))}   (exit 0 agree, 1 differ, 2 failed "
                  "to run)",
                  markup=False, highlight=False)

