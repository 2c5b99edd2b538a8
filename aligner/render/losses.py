"""Present a loss comparison: a rich table and diagnosis for people, a JSON document for scripts."""
from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aligner.pipelines.losses.diagnose import Comparison, Diagnosis
from aligner.pipelines.losses.parse import LossCurve


def print_report(console: Console, c: Comparison, d: Diagnosis, show: int) -> None:
    """Sources, tolerance, the first `show` steps (plus the step where the curves part) and the diagnosis."""
    for label, curve in (("A", c.a), ("B", c.b)):
        console.print(f"[bold]{label}[/]: {escape(curve.path)} ({escape(_describe(curve))})")
    console.print(f"tolerance: |A-B| <= atol + rtol*max(|A|,|B|), rtol={c.rtol:g} atol={c.atol:g}")
    if show:
        console.print(_table(c, show))
    style = "green" if d.verdict == "agree" else "red"
    console.print(f"[bold {style}]{escape(d.summary)}[/]")
    console.print(escape(d.advice), highlight=False)
    if d.next_command:
        console.print(f"  [bold]{escape(d.next_command)}[/]", highlight=False)


def to_dict(c: Comparison, d: Diagnosis) -> dict[str, Any]:
    """Everything in the report as plain JSON types; NaN and inf become the strings 'nan', 'inf', '-inf'."""
    return {
        "a": _curve_dict(c.a, c.first_nan_a),
        "b": _curve_dict(c.b, c.first_nan_b),
        "rtol": c.rtol,
        "atol": c.atol,
        "common_steps": int(c.steps.size),
        "first_part": c.first_part,
        "verdict": d.verdict,
        "summary": d.summary,
        "advice": d.advice,
        "next_command": d.next_command,
        "warnings": list(d.warnings),
        "exit_code": d.exit_code,
        "steps": [
            {"step": int(s), "a": _num(a), "b": _num(b), "abs_diff": _num(ad), "rel_diff": _num(rd), "close": bool(ok)}
            for s, a, b, ad, rd, ok in zip(c.steps, c.loss_a, c.loss_b, c.abs_diff, c.rel_diff, c.close)
        ],
    }


def _table(c: Comparison, show: int) -> Table:
    """The first `show` common steps; the first parting step is appended when it lies beyond them."""
    table = Table(box=None, header_style="bold")
    for name in ("step", "A", "B", "|A-B|", "rel", ""):
        table.add_column(name, justify="right" if name else "left")
    rows = list(range(min(show, c.steps.size)))
    part = int((c.steps == c.first_part).argmax()) if c.first_part is not None else None
    if part is not None and part >= len(rows):
        rows += [-1, part]  # -1: an ellipsis row
    for i in rows:
        if i < 0:
            table.add_row("...", "", "", "", "", "")
            continue
        mark = "[green]ok[/]" if c.close[i] else "[red]differs[/]"
        table.add_row(str(c.steps[i]), f"{c.loss_a[i]:.8g}", f"{c.loss_b[i]:.8g}", f"{c.abs_diff[i]:.2e}",
                      f"{c.rel_diff[i]:.2e}", mark)
    return table


def _describe(curve: LossCurve) -> str:
    """'text, 40 losses, MindSpore LossMonitor ...' for the header line."""
    parts = [curve.format, f"{len(curve.losses)} losses"]
    if curve.pattern_name:
        parts.append(f"pattern {curve.pattern_name}")
    return ", ".join(parts)


def _curve_dict(curve: LossCurve, first_nan: int | None) -> dict[str, Any]:
    """The source of one side."""
    return {"path": curve.path, "format": curve.format, "pattern": curve.pattern, "losses": len(curve.losses),
            "first_step": curve.steps[0], "last_step": curve.steps[-1], "resolution": _num(curve.resolution),
            "first_nan": first_nan}


def _num(x: float) -> float | str:
    """A JSON-safe float."""
    x = float(x)
    return x if math.isfinite(x) else str(x)
