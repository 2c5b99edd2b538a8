"""Present a replay: per module call its inherited, local and total errors, then the verdict in one paragraph."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from aligner.core.text import short_number
from aligner.metrics.measure import Metrics
from aligner.pipelines.replay.result import ReplayResult, ReplayStatus, ReplayVerdict
from aligner.render.jsonout import write_json
from aligner.render.words import say

_STYLE = {ReplayStatus.LOCAL: "bold red", ReplayStatus.INHERITED: "yellow", ReplayStatus.SKIPPED: "dim",
          ReplayStatus.ERROR: "red", ReplayStatus.OK: "green"}
_CONTEXT = 2  # OK rows shown before a non-OK one without --all


def _err(m: Metrics | None) -> str:
    return short_number(None if m is None else m.max_abs_err)


def _shown(result: ReplayResult, full: bool) -> list[int]:
    if full:
        return list(range(len(result.rows)))
    keep: set[int] = set()
    for i, row in enumerate(result.rows):
        if row.status is not ReplayStatus.OK:
            keep.update(range(max(0, i - _CONTEXT), i + 1))
    return sorted(keep)


def print_table(result: ReplayResult, console: Console, full: bool = False) -> None:
    """The rows around every non-agreeing call (all rows with `full`)."""
    table = Table(title=f"replay: {result.replayed} on the inputs of {result.reference}", title_justify="left")
    for column in ("#", "module", "type", "phase", "inherited", "local", "total", "allowed", "status"):
        table.add_column(column, justify="right" if column in ("#", "inherited", "local", "total") else "left")
    shown = _shown(result, full)
    for i in shown:
        row = result.rows[i]
        module = row.module if row.module == row.module_b else f"{row.module} ({row.module_b})"
        types = row.type if row.type == row.type_b else f"{row.type} / {row.type_b}"
        status = row.status.value + (" <- culprit" if i == result.culprit or i == result.parent_code else "")
        table.add_row(str(i), module, types, row.phase, _err(row.inherited), _err(row.local), _err(row.total),
                      str(row.tolerance) if row.tolerance else "-", status, style=_STYLE[row.status])
    if shown:
        console.print(table)
    if len(shown) < len(result.rows):
        console.print(f"({len(result.rows) - len(shown)} agreeing calls not shown; --all shows every row)",
                      style="dim", markup=False)


def summary(result: ReplayResult) -> str:
    """The verdict in words: which module makes its own error, or that the error accumulates."""
    counts = {s: sum(1 for r in result.rows if r.status is s) for s in ReplayStatus}
    tally = (f"{len(result.rows)} calls replayed: {counts[ReplayStatus.OK]} agree, {counts[ReplayStatus.LOCAL]} own "
             f"error, {counts[ReplayStatus.INHERITED]} inherited, {counts[ReplayStatus.SKIPPED]} skipped"
             + (f", {counts[ReplayStatus.ERROR]} not replayable (damaged dump)" if counts[ReplayStatus.ERROR] else ""))
    if len(result.steps) > 1:
        tally += (f" (step {result.step} of the dumped steps {', '.join(map(str, result.steps))}: --step picks one; "
                  "the model must hold the weights that step started from)")
    skipped = [result.rows[i] for i in result.skipped]
    notes = "".join(f"\n  {r.status.value} {r.module} ({r.phase}): {r.reason if r.reason is None else say(r.reason)}"
                    for r in skipped[:5])
    if len(skipped) > 5:
        notes += f"\n  ... and {len(skipped) - 5} more skipped"
    verdict = result.verdict
    if verdict is ReplayVerdict.LAYER and result.culprit is not None:
        row = result.rows[result.culprit]
        local = row.local
        assert local is not None
        where = f"{row.module}" + (f" ({row.module_b})" if row.module_b != row.module else "")
        inherited = f"; the error carried in at its inputs was {_err(row.inherited)}" if row.inherited else ""
        index = f" at index {local.max_abs_index}" if local.max_abs_index is not None else ""
        text = (f"FOUND: {where} ({row.type}, {row.phase}) makes its own error: on the reference's inputs it is off "
                f"by {_err(local)}{index}, {local.mismatched} of {local.numel} elements outside {row.tolerance}"
                f"{inherited}. Next: `align repro` writes a standalone script for this layer.")
    elif verdict is ReplayVerdict.PARENT_CODE and result.parent_code is not None:
        row = result.rows[result.parent_code]
        scope = result.blame if result.blame is not None else row.parent
        owner = _owner(scope)
        text = (f"FOUND: the input of {row.module} differs by {_err(row.inherited)} though no earlier module's output "
                f"does: {owner} computes it between module calls (glue code: a functional op, a residual, a "
                f"scale, a mask or routing computed once and passed on). Next: aligner.dump(model, dir, ops=True, "
                f"scope={scope or ''!r}) on both sides names the op.")
    elif verdict is ReplayVerdict.ACCUMULATED and result.first_total is not None:
        row = result.rows[result.first_total]
        worst = result.largest_local
        largest = f" (largest local error {_err(result.rows[worst].local)} in {result.rows[worst].module})" \
            if worst is not None else ""
        text = (f"ACCUMULATED: no module exceeds its tolerance on the reference's inputs{largest}, yet the runs part "
                f"at {row.module} ({_err(row.total)}): the error grows a little at every layer, float rounding rather "
                "than one wrong layer; calibrate the tolerance on float64 noise (align compare --calibrate)")
    elif result.errors or result.problems:
        text = f"INCOMPLETE: {incomplete(result)}"
    else:
        text = "PASSED: every replayed module agrees with the reference within its tolerance"
    return f"{tally}\n{text}{notes}"


def incomplete(result: ReplayResult) -> str:
    """What a replay with damaged rows left unchecked, in one line (the paragraph's verdict and, for exit code 2, the
    error line on stderr)."""
    what = [f"{len(result.errors)} call(s) could not be replayed"] if result.errors else []
    what += [f"{len(result.problems)} manifest line(s) did not parse ({result.problems[0]})"] \
        if result.problems else []
    return f"the replayed modules agree, but {' and '.join(what)}: not checked, so not passed"


def _owner(parent: str | None) -> str:
    if parent is None:
        return "the caller (the model's own inputs differ)"
    return "the model's own forward" if parent == "" else f"the forward of {parent}"


def write_replay_json(result: ReplayResult, path: str) -> None:
    write_json(result.to_dict(), path)
