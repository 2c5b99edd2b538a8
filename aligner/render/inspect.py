"""Present what a checkpoint or model holds: one row per tensor, then parameter/buffer and trainable/frozen totals."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from aligner.metrics.stats import Stats, known
from aligner.pipelines.inspect import Counts, InspectResult, TensorRow
from aligner.render.jsonout import write_json

_STATS = ("min", "max", "mean", "nan", "inf")  # the columns of _stat_cells


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _stat_cells(stats: Stats) -> dict[str, str]:
    """The statistics columns of a row ("-": none, or not computed)."""
    return {"min": _fmt(known(stats.min)), "max": _fmt(known(stats.max)), "mean": _fmt(known(stats.mean)),
            "nan": _fmt(known(stats.nan)), "inf": _fmt(known(stats.inf))}


def _trainable(row: TensorRow) -> str:
    return {None: "?", True: "yes", False: "no"}[row.trainable]


def inspect_table(result: InspectResult) -> Table:
    """Name, shape, dtype, kind (and trainable for a model; statistics with --stats)."""
    table = Table(title=f"{result.path} ({result.format}, "
                        f"{result.framework.value if result.framework else 'names: either'})", title_justify="left")
    cols = ["name", "shape", "dtype", "kind"] + (["trainable"] if result.counts.trainable_known else []) \
        + (list(_STATS) if result.with_stats else [])
    for col in cols:
        table.add_column(col, overflow="fold", justify="left" if col in ("name", "dtype", "kind") else "right")
    for r in result.rows:
        cells = {"name": r.name, "shape": "x".join(map(str, r.shape)) or "scalar", "dtype": r.dtype,
                 "kind": r.kind.value, "trainable": _trainable(r)} | _stat_cells(r.stats or Stats())
        table.add_row(*[cells[c] for c in cols])
    return table


def counts_lines(counts: Counts) -> list[str]:
    """Totals in words; trainable/frozen said to be unknown when they are."""
    lines = [f"{counts.tensors} tensors, {counts.elements:,} elements, {counts.bytes / 2**20:,.2f} MiB",
             f"{counts.parameters} parameters ({counts.parameter_elements:,} elements), {counts.buffers} buffers "
             f"({counts.buffer_elements:,} elements: running statistics, counters)"]
    if counts.trainable_known:
        lines.append(f"{counts.trainable} trainable ({counts.trainable_elements:,} elements), {counts.frozen} frozen "
                     f"({counts.frozen_elements:,} elements)")
    else:
        lines.append("trainable/frozen: unknown (a checkpoint file does not record requires_grad; "
                     "aligner.inspect_model(model) counts them)")
    return lines


def print_inspect(result: InspectResult, console: Console) -> None:
    """The table, notes, then the totals."""
    console.print(inspect_table(result))
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    for line in counts_lines(result.counts):
        console.print(line, markup=False)


def write_inspect_json(result: InspectResult, path: str) -> None:
    """{"summary": ..., "tensors": [...]} as strict JSON to `path` ('-': stdout)."""
    write_json(result.to_dict(), path)
