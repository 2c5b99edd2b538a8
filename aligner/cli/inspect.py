"""`align inspect`: what a checkpoint holds. Imports torch only for .pth files."""
from __future__ import annotations

import click


@click.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--stats", is_flag=True, help="Also show min/max/mean and NaN/Inf counts (reads every tensor).")
@click.option("--filter", "pattern", help="Only names matching this regex.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--trust-pickle", is_flag=True, help="Allow .pth files that need arbitrary code to unpickle (unsafe).")
def command(path: str, stats: bool, pattern: str | None, as_json: bool, trust_pickle: bool) -> int:
    """List the tensors in PATH (.pth/.pt/.bin, .ckpt, .safetensors, .npy/.npz): name, shape, dtype; totals."""
    import json
    import re

    from aligner.core.errors import AlignerError
    from aligner.io import open_checkpoint
    from aligner.dumping.manifest import tensor_stats

    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise AlignerError(f"bad --filter regex {pattern!r}: {exc}") from None
    rows = []
    with open_checkpoint(path, allow_pickle=trust_pickle) as source:
        for name, info in source.infos.items():
            if regex and not regex.search(name):
                continue
            row = {"name": name, "shape": list(info.shape), "dtype": info.dtype, "numel": info.numel,
                   "bytes": info.numel * _itemsize(info.dtype)}
            if stats:
                array = source.get(name)
                row.update(tensor_stats(array))
                source.release(array)
            rows.append(row)
        summary = {"path": path, "format": source.format, "framework": source.framework, "tensors": len(rows),
                   "elements": sum(r["numel"] for r in rows), "bytes": sum(r["bytes"] for r in rows),
                   "notes": source.notes}
    if as_json:
        click.echo(json.dumps({"summary": summary, "tensors": rows}, indent=1))
    else:
        _print(rows, summary, stats)
    return 0


def _itemsize(dtype: str) -> int:
    from aligner.core.dtypes import to_numpy
    return to_numpy(dtype).itemsize


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _print(rows: list[dict], summary: dict, stats: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['path']} ({summary['format']}, {summary['framework'] or 'names: either'})",
                  title_justify="left")
    cols = ["name", "shape", "dtype"] + (["min", "max", "mean", "nan", "inf"] if stats else [])
    for col in cols:
        table.add_column(col, overflow="fold", justify="left" if col in ("name", "dtype") else "right")
    for r in rows:
        table.add_row(*[_fmt(r[c]) if c != "shape" else "x".join(map(str, r["shape"])) or "scalar" for c in cols])
    console = Console(highlight=False)
    console.print(table)
    for note in summary["notes"]:
        console.print(f"note: {note}")
    console.print(f"{summary['tensors']} tensors, {summary['elements']:,} elements, "
                  f"{summary['bytes'] / 2**20:,.2f} MiB")
