"""`align diff A B`: compare two checkpoints across frameworks, parameter by parameter, and say which ones differ."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from aligner.pipelines.diff import CheckpointDiff, ParamDiff

_HELP_EPILOG = """\b
Exit codes: 0 every parameter agrees within tolerance; 1 a parameter differs, is missing on one side, or (with --init)
was updated on one side only; 2 bad input (missing or corrupted file, different models, bad --map or option)."""


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _updated(flag: bool | None) -> str:
    return {None: "-", True: "yes", False: "NO"}[flag]


def _names(rows: list["ParamDiff"], limit: int = 8) -> str:
    names = [r.name for r in rows]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _table(result: "CheckpointDiff", verbose: bool) -> "object":
    """The rich table: differing rows only unless `verbose`."""
    from rich.table import Table

    table = Table(title=f"A = {result.a.path}  vs  B = {result.b.path} (reference)", title_justify="left")
    for col in ("parameter (B)", "from A", "status", "shape", "max |A-B|", "rel L2", "cosine"):
        table.add_column(col, justify="right" if col in ("max |A-B|", "rel L2", "cosine") else "left")
    if result.init:
        table.add_column("updated A")
        table.add_column("updated B")
    for row in result.params:
        if not verbose and not row.differs:
            continue
        m = row.metrics
        style = "red" if row.differs else None
        cells = [row.name, ", ".join(s for s in row.sources if s != row.name) or "", row.status,
                 "x".join(map(str, m.shape_b)) if m else "", _fmt(m and m.max_abs_err), _fmt(m and m.rel_l2_err),
                 _fmt(m and m.cosine)]
        if result.init:
            cells += [_updated(row.updated_a), _updated(row.updated_b)]
        table.add_row(*cells, style=style)
    return table


def _count(side: "object") -> str:
    trainable = "trainable unknown (MindSpore checkpoints store buffers as Parameters)" \
        if side.trainable_tensors is None else f"{side.trainable_tensors} trainable ({side.trainable_elements:,} elements)"
    return f"{side.tensors} tensors, {side.elements:,} elements, {trainable}"


def summary(result: "CheckpointDiff") -> list[str]:
    """The plain-words paragraph under the table."""
    lines = [f"A: {_count(result.a)}.", f"B: {_count(result.b)}."]
    diffs = result.differences
    by_status: dict[str, list] = {}
    for row in diffs:
        by_status.setdefault(row.status, []).append(row)
    compared = sum(1 for p in result.params if p.metrics is not None)
    if not diffs:
        lines.append(f"All {compared} compared parameters agree within tolerance.")
    for status, rows in by_status.items():
        lines.append(f"{len(rows)} parameter(s) {status}: {_names(rows)}.")
    for row in by_status.get("update differs", []):
        lines.append(f"{row.name}: {row.reason} (frozen, or missing from one optimizer's parameter list).")
    if result.frozen_both:
        lines.append(f"Unchanged from init on both sides (no gradient, or left out of both optimizers): "
                     f"{_names(result.frozen_both)}.")
    created = [p for p in result.params if p.status == "created"]
    if created:
        lines.append(f"Only in B, not compared (A's framework has no such buffer): {_names(created)}.")
    return lines + result.notes


@click.command("diff", epilog=_HELP_EPILOG)
@click.argument("ckpt_a", metavar="A")
@click.argument("ckpt_b", metavar="B")
@click.option("--map", "map_file", metavar="FILE", help="Mapping YAML renaming A's parameters to B's (as in convert).")
@click.option("--init", "init", metavar="FILE", help="The initial checkpoint (either framework): report which "
              "parameters each side changed from it, naming ones updated on one side only.")
@click.option("--rtol", metavar="X", help="Relative tolerance (default: per dtype, as torch.testing).")
@click.option("--atol", metavar="X", help="Absolute tolerance (default: per dtype).")
@click.option("--json", "json_out", metavar="FILE", help="Write the full result as JSON ('-' for stdout).")
@click.option("--force", is_flag=True, help="Overwrite an existing --json file.")
@click.option("--allow-pickle", is_flag=True, help="Allow pickled .pth files (runs code from the file: trusted only).")
@click.option("-v", "--verbose", is_flag=True, help="Show every parameter, not only the differing ones.")
def command(ckpt_a: str, ckpt_b: str, map_file: str | None, init: str | None, rtol: str | None, atol: str | None,
            json_out: str | None, force: bool, allow_pickle: bool, verbose: bool) -> int:
    """Compare checkpoint A against the reference B (e.g. weights after one step in MindSpore and in PyTorch).

    \b
    Examples:
      align diff step1_ms.ckpt step1_pt.pth
      align diff step1_ms.ckpt step1_pt.pth --init init_pt.pth -v
      align diff step1_ms.ckpt step1_pt.pth --map names.yaml --json diff.json
    """
    from rich.console import Console

    from aligner.core.atomic import atomic_open, check_output
    from aligner.cli.options import parse_tolerance
    from aligner.pipelines.diff import diff_checkpoints

    rtol_v, atol_v = parse_tolerance("--rtol", rtol), parse_tolerance("--atol", atol)
    if json_out and json_out != "-":
        check_output(json_out, force)
    result = diff_checkpoints(ckpt_a, ckpt_b, map_path=map_file, init_path=init, rtol=rtol_v, atol=atol_v,
                              allow_pickle=allow_pickle)
    if json_out == "-":
        click.echo(json.dumps(result.to_dict(), indent=1, default=str))
        return result.exit_code
    console = Console(width=max(Console().width, 120))
    if result.differences or verbose:
        console.print(_table(result, verbose))
    for line in summary(result):
        console.print(line, highlight=False, markup=False)
    if json_out:
        with atomic_open(json_out, "w") as fh:
            json.dump(result.to_dict(), fh, indent=1, default=str)
    return result.exit_code
