"""Present a rank-by-rank comparison: one row per rank (which part first, which are missing), a paragraph, JSON."""
from __future__ import annotations

import json
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from aligner.pipelines.compare.ranks import RankedCompareResult, RankOutcome, RankStatus
from aligner.pipelines.compare.result import CompareResult
from aligner.render.compare import print_table
from aligner.render.compare import summary as compare_summary
from aligner.render.compare import to_json as compare_json
from aligner.render.jsonout import jsonable

_STYLE = {RankStatus.MATCH: "green", RankStatus.DIVERGED: "red", RankStatus.MISSING: "yellow",
          RankStatus.ERROR: "yellow"}


def _first_record(result: CompareResult) -> str:
    """Where a rank's earliest divergence is: "step 0, fc1 (Linear) forward output"."""
    rows = result.rows
    first = min(result.verdict.findings, key=lambda f: (rows[f.first].pair.ref.record.step,
                                                         rows[f.first].pair.ref.record.seq))
    rec = rows[first.first].pair.ref.record
    where = f"step {rec.step}, {rec.module or '(root)'}" + (f" ({rec.type})" if rec.type else "") + \
        f" {rec.kind} {rec.io}"
    if first.origin != first.first:
        where += f", from {rows[first.origin].pair.ref.record.module or '(root)'}"
    return where


def _detail(o: RankOutcome, result: RankedCompareResult) -> str:
    if o.status is RankStatus.MISSING:
        sides = [result.first if s == "first" else result.second for s in o.missing]
        return f"no rank{o.rank}/ in {' nor '.join(sides)}: the rank did not dump (a failed run)"
    if o.status is RankStatus.ERROR and o.result is None:
        return f"not compared: {o.error}"
    assert o.result is not None
    r = o.result
    if o.status is RankStatus.ERROR:
        return f"{len(r.errors)} record(s) unreadable, {len(r.problems)} manifest line(s) skipped"
    if o.status is RankStatus.DIVERGED:
        if r.verdict.findings:
            return _first_record(r)
        if r.strict and (r.unmatched or r.skipped):
            return f"{len(r.unmatched) + len(r.skipped)} record(s) on one side only or not comparable (--strict)"
        return "nothing compared: no record has a twin with numbers to compare"
    c = o.result.matched
    return f"{c['name'] + c['content']} records match"


def print_ranks(result: RankedCompareResult, console: Console, full: bool = False) -> None:
    """The per-rank table; with `full`, each rank's own comparison table and paragraph after it."""
    table = Table(header_style="bold")
    for col in ("rank", "verdict", "order", "first divergence / detail"):
        table.add_column(col, overflow="fold", no_wrap=col != "first divergence / detail")
    order = {rank: i + 1 for i, rank in enumerate(result.diverged)}
    for o in result.ranks:
        verdict = o.status.value.upper() if o.status is not RankStatus.MATCH else "match"
        table.add_row(str(o.rank), verdict, str(order.get(o.rank, "-")), _detail(o, result), style=_STYLE[o.status])
    console.print(table)
    if full:
        for o in result.ranks:
            if o.result is not None:
                console.print(f"rank {o.rank}", style="bold", markup=False, highlight=False)
                print_table(o.result, console, full=True)
                console.print(compare_summary(o.result), markup=False)


def summary(result: RankedCompareResult) -> str:
    """The comparison in plain words, one paragraph; the first divergent rank's own paragraph follows it."""
    counts = {s: sum(o.status is s for o in result.ranks) for s in RankStatus}
    world = f"world size {result.world_size}" + ("" if result.world_known else
                                                 ", from the rank folders: no header names it")
    engine = f"{result.engine} engine" + (f", {result.processes} processes side by side"
                                          if result.processes > 1 else "")
    parts = [f"Compared {result.first} and {result.second} rank by rank ({world}, {engine}): "
             f"{counts[RankStatus.MATCH]} rank(s) match, {counts[RankStatus.DIVERGED]} diverge, "
             f"{counts[RankStatus.MISSING]} missing, {counts[RankStatus.ERROR]} not compared."]
    for side, shown in (("first", result.first), ("second", result.second)):
        gone = result.missing(side)
        if gone:
            parts.append(f"No folder for rank(s) {', '.join(map(str, gone))} in {shown}: a rank that did not dump "
                         "is a failed run (the other ranks were compared).")
    first = result.first_divergent
    if first:
        lead = next(o for o in result.ranks if o.rank == first[0])
        assert lead.result is not None
        who = f"Rank {first[0]} diverges" if len(first) == 1 else \
            f"Ranks {', '.join(map(str, first))} diverge together"
        parts.append(f"{who} first ({_first_record(lead.result)})" + (
            f"; then rank(s) {', '.join(map(str, result.diverged[len(first):]))}, later in step and execution "
            "order" if len(result.diverged) > len(first) else "") + ".")
        parts.append(f"Rank {first[0]}: {compare_summary(lead.result)}")
    elif result.passed:
        parts.append("Every rank matches.")
    for o in result.ranks:
        if o.status is RankStatus.ERROR or o.status is RankStatus.DIVERGED and o.first is None:
            parts.append(f"Rank {o.rank}: {_detail(o, result)}.")
    return " ".join(parts)


def to_json(result: RankedCompareResult) -> dict[str, Any]:
    """The result as JSON-ready data with the summary paragraph, and each compared rank's compare JSON with its own."""
    data = result.to_dict()
    ranks = data.pop("ranks")
    for entry, o in zip(ranks, result.ranks):
        entry["compare"] = compare_json(o.result) if o.result is not None else None
    return jsonable(data | {"summary": summary(result), "ranks": ranks})


def write_ranks_json(result: RankedCompareResult, fh: IO[str]) -> None:
    """One JSON document, a key per line and a rank per line (as compare's JSON)."""
    data = to_json(result)
    ranks = data.pop("ranks")
    fh.write("{\n" + "".join(f"{json.dumps(key)}: {json.dumps(value)},\n" for key, value in data.items()))
    fh.write('"ranks": [\n' + ",\n".join(map(json.dumps, ranks)) + "\n]}\n")
