"""Render a conversion plan as a status table, like Hugging Face's missing/unexpected/mismatched report."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from aligner.mapping import FAILING, Plan

STYLE = {"unchanged": "dim", "renamed": "cyan", "transformed": "magenta", "created": "green", "structural": "yellow",
         "dropped": "dim yellow", "unexpected": "yellow", "missing": "bold red", "shape mismatch": "bold red",
         "ambiguous": "bold red"}


def print_plan(plan: Plan, verbose: bool = False, console: Console | None = None) -> None:
    """Rows for every parameter that is not simply copied (all rows with `verbose`), then the counts."""
    console = console or Console(highlight=False)
    rows = [e for e in plan.entries if verbose or e.status != "unchanged"]
    if rows:
        table = Table(title=f"{plan.src_framework} -> {plan.dst_framework}", title_justify="left")
        for col in ("status", "source", "target", "shape", "why"):
            table.add_column(col, overflow="fold")
        for e in rows:
            table.add_row(f"[{STYLE.get(e.status, '')}]{e.status}[/]", ", ".join(e.sources) or "-", e.target or "-",
                          "x".join(map(str, e.info.shape)) if e.info else "", e.reason)
        console.print(table)
    for note in plan.notes:
        console.print(f"note: {note}")
    counts = plan.counts()
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: kv[0] in FAILING))
    console.print(f"{len(plan.outputs)} tensors to write: {summary}")
