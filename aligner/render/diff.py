"""Present a checkpoint diff: the table of differing (or, verbose, all) parameters, hints, then a plain summary."""
from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table

from aligner.core.findings import Finding
from aligner.core.text import short_number as _fmt
from aligner.pipelines.diff.checkpoints import DiffResult, DiffStatus, ParamDiff, SideCounts
from aligner.render.jsonout import write_json
from aligner.render.words import say

_NUMERIC = ("max |A-B|", "rel L2", "cosine")


def _updated(flag: bool | None) -> str:
    return {None: "-", True: "yes", False: "NO"}[flag]


def _names(rows: list[ParamDiff], limit: int = 8) -> str:
    names = [r.name for r in rows]
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def diff_table(result: DiffResult, verbose: bool = False) -> Table:
    """The table: rows that differ or exist on one side only, or every row with `verbose`."""
    table = Table(title=f"A = {result.a.path}  vs  B = {result.b.path} (reference)", title_justify="left")
    for col in ("parameter (B)", "from A", "status", "shape", *_NUMERIC):
        table.add_column(col, justify="right" if col in _NUMERIC else "left")
    if result.init:
        table.add_column("updated A")
        table.add_column("updated B")
        table.add_column("update A/B", justify="right")
    for row in result.params:
        if not verbose and not row.differs:
            continue
        m = row.metrics
        numbers = [m.max_abs_err, m.rel_l2_err, m.cosine] if m else [None, None, None]
        cells = [row.name, ", ".join(s for s in row.sources if s != row.name), row.status.value,
                 "x".join(map(str, m.shape_b)) if m else "", *map(_fmt, numbers)]
        if result.init:
            cells += [_updated(row.updated_a), _updated(row.updated_b), _fmt(row.update_ratio)]
        style = "red" if row.status in (DiffStatus.DIFFERENT, DiffStatus.SHAPE_MISMATCH, DiffStatus.AMBIGUOUS,
                                        DiffStatus.UPDATE_DIFFERS) else "yellow" if row.differs else None
        table.add_row(*cells, style=style)
    return table


def _count(side: SideCounts) -> str:
    c = side.counts
    trainable = "trainable unknown (a checkpoint file does not record requires_grad)" if c.trainable is None \
        else f"{c.trainable} trainable, {c.frozen} frozen"
    return (f"{c.tensors} tensors, {c.elements:,} elements: {c.parameters} parameters "
            f"({c.parameter_elements:,} elements), {c.buffers} buffers; {trainable}")


def hint_lines(hints: Sequence[Finding]) -> list[str]:
    """One line per hint, with its fix."""
    return [f"hint: {say(h.message)}." + (f" Fix: {say(h.fix)}." if h.fix else "") for h in hints]


_NOT_COMPARED = {DiffStatus.MISSING: "only in B", DiffStatus.UNEXPECTED: "only in A",
                 DiffStatus.CREATED: "buffers A's framework does not have",
                 DiffStatus.DROPPED: "buffers B's framework does not have"}


def _agree_line(result: DiffResult) -> str:
    """The verdict when no compared parameter differs, with what was not compared counted in the same line."""
    compared, total = len(result.compared), len(result.params)
    if compared == total:
        return f"All {total} compared tensors agree within tolerance ({result.tolerance.describe()})."
    counts = {status: sum(1 for p in result.params if p.status is status) for status in _NOT_COMPARED}
    left = "; ".join(f"{n} {_NOT_COMPARED[status]}" for status, n in counts.items() if n)
    strict = ("" if not result.one_side else " (a failure with --strict)" if result.strict
              else " (--strict fails on keys on one side only)")
    return (f"{compared} of {total} tensors compared, all agree within tolerance "
            f"({result.tolerance.describe()}); not compared: {left}{strict}, listed below.")


def summary_lines(result: DiffResult) -> list[str]:
    """The plain-words paragraph under the table."""
    lines = [f"A: {_count(result.a)}.", f"B: {_count(result.b)}."]
    by_status: dict[DiffStatus, list[ParamDiff]] = {}
    for row in result.params:
        if row.differs:
            by_status.setdefault(row.status, []).append(row)
    if result.nothing_compared:
        lines.append(f"Nothing compared: none of the {len(result.params)} key(s) has a twin on the other side whose "
                     f"numbers could be compared, so this is not a pass (are both checkpoints of the same model? "
                     f"a --map file pairs names that differ).")
    elif not result.differences:
        lines.append(_agree_line(result))
    for status, rows in by_status.items():
        lines.append(f"{len(rows)} parameter(s) {status.value}: {_names(rows)}.")
    for row in by_status.get(DiffStatus.UPDATE_DIFFERS, []):
        lines.append(f"{row.name}: {row.reason} (frozen, or missing from one optimizer's parameter list).")
    if result.one_side and result.differences:  # otherwise the verdict line above counts them
        lines.append(f"{len(result.one_side)} key(s) exist on one side only: "
                     + ("a failure with --strict." if result.strict else "reported, not a failure (--strict fails "
                                                                          "on them)."))
    if result.frozen_both:
        lines.append(f"Unchanged from init on both sides (no gradient, or left out of both optimizers): "
                     f"{_names(result.frozen_both)}.")
    created = [p for p in result.params if p.status is DiffStatus.CREATED]
    if created:
        lines.append(f"Only in B, not compared (A's framework has no such buffer): {_names(created)}.")
    dropped = [p for p in result.params if p.status is DiffStatus.DROPPED]
    if dropped:
        lines.append(f"Only in A, not compared (B's framework has no such buffer): {_names(dropped)}.")
    return lines + list(result.notes)


def print_diff(result: DiffResult, console: Console, verbose: bool = False) -> None:
    """Table (when something differs, or `verbose`), hints, summary."""
    if verbose or any(p.differs for p in result.params):
        console.print(diff_table(result, verbose))
    for line in hint_lines(result.hints) + summary_lines(result):
        console.print(line, highlight=False, markup=False)


def write_diff_json(result: DiffResult, path: str) -> None:
    """The full result as strict JSON (non-finite numbers as strings) to `path`, or stdout for '-'."""
    write_json(result.to_dict(), path)
