"""Render a conversion: the status table, then a summary like the one Hugging Face prints when loading weights
(missing / unexpected / mismatched-shape keys, what was dropped, created or transformed on purpose, guessed layers)."""
from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table
from rich.text import Text

from aligner.mapping import FAILING, Plan
from aligner.mapping.fused import FusedSplit
from aligner.mapping.plan import Entry, EntryStatus
from aligner.pipelines.convert import TrainingConvertResult
from aligner.pipelines.convert.checkpoint import ConvertResult
from aligner.render.console import make_console
from aligner.render.jsonout import write_json

STYLE = {EntryStatus.UNCHANGED: "dim", EntryStatus.RENAMED: "cyan", EntryStatus.TRANSFORMED: "magenta",
         EntryStatus.CREATED: "green", EntryStatus.STRUCTURAL: "yellow", EntryStatus.DROPPED: "dim yellow",
         EntryStatus.UNEXPECTED: "yellow", EntryStatus.MISSING: "bold red", EntryStatus.SHAPE_MISMATCH: "bold red",
         EntryStatus.AMBIGUOUS: "bold red"}
ABBREVIATE = 5   # names shown per summary line unless verbose

# summary line per status: (label, what it means); failures first
_LINES = [
    (EntryStatus.MISSING, "missing", "target keys no source fills"),
    (EntryStatus.SHAPE_MISMATCH, "mismatched shapes", "source and target shapes disagree"),
    (EntryStatus.AMBIGUOUS, "ambiguous", "several sources fit equally; add a --map rename"),
    (EntryStatus.UNEXPECTED, "unexpected", "source keys with no place in the target, not written"),
    (EntryStatus.DROPPED, "dropped on purpose", "no twin in the target framework, tied, or a user drop"),
    (EntryStatus.CREATED, "created", "buffers the target framework needs, recreated"),
    (EntryStatus.TRANSFORMED, "split / reshaped / transformed", ""),
    (EntryStatus.STRUCTURAL, "matched by structure", "paired with a --like key by module layout"),
]


def _names(entries: list[Entry], verbose: bool) -> str:
    names = [e.target or e.sources[0] for e in entries]
    shown = names if verbose else names[:ABBREVIATE]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more (-v: all)" if more else "")


def plan_table(plan: Plan, verbose: bool = False) -> Table | None:
    """Rows for every parameter that is not simply copied (all rows with `verbose`); None when there are none."""
    rows = [e for e in plan.entries if verbose or e.status != EntryStatus.UNCHANGED or e.guessed]
    if not rows:
        return None
    table = Table(title=f"{plan.src_framework} -> {plan.dst_framework}", title_justify="left")
    for col in ("status", "source", "target", "shape", "why"):
        table.add_column(col, overflow="fold")
    for e in rows:
        why = e.reason + ("; layer type guessed (see the warning below)" if e.guessed else "")
        table.add_row(Text(e.status.value, style=STYLE.get(e.status, "")), ", ".join(e.sources) or "-", e.target or "-",
                      "x".join(map(str, e.info.shape)) if e.info else "", why)
    return table


def split_line(split: FusedSplit) -> str:
    """`split SOURCE -> FIRST, ...REST (axis N)`: later targets shortened to what follows the first's common part."""
    first, rest = split.targets[0], split.targets[1:]
    common = os.path.commonprefix(list(split.targets))
    keep = common[:common.rfind(".") + 1] if "." in common else ""
    shown = [first] + [f"...{t[len(keep):]}" if keep else t for t in rest]
    return f"split {split.source} -> {', '.join(shown)} (axis {split.axis})"


def summary_lines(result: ConvertResult, verbose: bool = False) -> list[str]:
    """Counts and abbreviated names per outcome, fused tensors split, guessed layer types, and the verdict line."""
    plan = result.plan
    lines = []
    for status, label, meaning in _LINES:
        entries = result.with_status(status)
        if entries:
            lines.append(f"{label} ({len(entries)}{': ' + meaning if meaning else ''}): {_names(entries, verbose)}")
    shown = plan.splits if verbose else plan.splits[:ABBREVIATE]
    lines += [split_line(s) for s in shown]
    if len(shown) < len(plan.splits):
        lines.append(f"split: {len(plan.splits) - len(shown)} more fused tensor(s) likewise (-v: all)")
    for g in plan.guesses:
        lines.append(f"warning: {g.module}: layer type guessed from names and shapes ({g.why}): read as {g.chosen}; "
                     f"could also be {' or '.join(g.alternatives)}. To be sure, pass --like with a checkpoint saved "
                     "from the target model (or --map)")
    lines += [f"note: {note}" for note in plan.notes]
    counts = plan.counts()
    lines.append(f"{len(plan.outputs)} tensors to write: " + ", ".join(
        f"{n} {status.value}" for status, n in sorted(counts.items(), key=lambda kv: kv[0] in FAILING)))
    return lines


def print_convert(result: ConvertResult, console: Console, err_console: Console, verbose: bool = False) -> None:
    """The table, the summary, then what was written (or, on stderr, why nothing was)."""
    table = plan_table(result.plan, verbose)
    if table is not None:
        console.print(table)
    for line in summary_lines(result, verbose):
        console.print(line, markup=False, highlight=False)
    plan = result.plan
    if result.written:
        console.print(f"wrote {result.output} ({len(plan.outputs)} tensors, {plan.src_framework} -> "
                      f"{plan.dst_framework} names)", markup=False, highlight=False)
    else:
        err_console.print(f"align: {len(plan.failures)} target key(s) unfilled or mismatched: nothing written "
                          "(fix with --map, or pass --allow-incomplete)", markup=False, highlight=False)


def print_plan(plan: Plan, verbose: bool = False, console: Console | None = None) -> None:
    """Just the table and counts of a plan (for scripts that plan without converting)."""
    console = console or make_console()
    table = plan_table(plan, verbose)
    if table is not None:
        console.print(table)
    for note in plan.notes:
        console.print(f"note: {note}", markup=False)


def optimizer_lines(result: TrainingConvertResult, verbose: bool = False) -> list[str]:
    """The optimizer part: which classes, exact or legacy, the step, keys written, --like keys unfilled, notes."""
    conv = result.optimizer
    lines = [f"optimizer: {conv.source_kind} -> {conv.target_kind} ({conv.exactness}), step {conv.step}, "
             f"{len(conv.params)} parameters' state, {len(conv.keys)} keys"]
    if conv.missing:
        shown = conv.missing if verbose else conv.missing[:ABBREVIATE]
        lines.append(f"missing optimizer keys ({len(conv.missing)}: --like keys nothing fills): {', '.join(shown)}"
                     + (f" and {len(conv.missing) - len(shown)} more (-v: all)" if len(shown) < len(conv.missing)
                        else ""))
    if conv.unexpected:
        lines.append(f"unexpected optimizer keys ({len(conv.unexpected)}: not in the --like target, not written): "
                     f"{', '.join(conv.unexpected[:ABBREVIATE])}")
    lines += [f"note: {note}" for note in conv.notes]
    return lines


def print_training_convert(result: TrainingConvertResult, console: Console, err_console: Console,
                           verbose: bool = False) -> None:
    """The model's table and summary, the optimizer's lines, then what was written (or, on stderr, why not)."""
    table = plan_table(result.model.plan, verbose)
    if table is not None:
        console.print(table)
    for line in summary_lines(result.model, verbose)[:-1] + optimizer_lines(result, verbose):
        console.print(line, markup=False, highlight=False)
    plan = result.model.plan
    if result.written:
        console.print(f"wrote {result.output} ({len(plan.outputs)} model tensors and {len(result.optimizer.keys)} "
                      f"optimizer entries, {plan.src_framework} -> {plan.dst_framework})", markup=False,
                      highlight=False)
    else:
        err_console.print(f"align: {len(result.failures)} target key(s) unfilled or mismatched: nothing written "
                          "(fix with --map, or pass --allow-incomplete)", markup=False, highlight=False)


def write_convert_json(result: ConvertResult | TrainingConvertResult, path: str) -> None:
    """The conversion summary and every plan entry as strict JSON to `path` ('-': stdout)."""
    write_json(result.to_dict(), path)
