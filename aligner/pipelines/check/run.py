"""`align check DUMP` / `aligner.check`: read one dump directory and evaluate the health rules on its records (the
rules: rules.py; thresholds: config.py and mappings/check_rules.yaml; the report: report.py).

A dump is read as a stream (`aligner.dumping.read.stream`): each record goes through the view the rules read
(`view.DumpView`) and is let go, so memory is bounded by the stream's records in flight plus what the view keeps (the
model's parameters per step, its module names, one record per finding), never by the number of records."""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import numpy as np

from aligner.core.collect import gc_paused
from aligner.core.errors import AlignerError
from aligner.dumping.manifest import Record
from aligner.dumping.read.source import Item, Source, load_tensor, read_source
from aligner.dumping.read.stream import Stream, UnorderedError, open_stream
from aligner.pipelines.check.config import RuleConfig
from aligner.pipelines.check.report import CheckReport
from aligner.pipelines.check.rules import evaluate_view
from aligner.pipelines.check.view import PARAM, DumpView


@gc_paused()  # millions of short-lived items pass: a collector pass over those in flight at every 700 costs 40%
def check(directory: str | os.PathLike, rules: Mapping[str, Any] | None = None) -> CheckReport:
    """Check one dump directory with the rules of check_rules.yaml (`rules` overrides thresholds: {"rule.key": value}
    or {"rule": {"key": value}}); AlignerError when the directory cannot be read or no rule could be evaluated."""
    config = RuleConfig.load(rules)
    try:
        with open_stream(os.fspath(directory)) as stream:
            return check_stream(stream, config, str(directory))
    except UnorderedError:  # records out of execution order (a manifest edited by hand): read whole, then sorted
        return check_source(read_source(os.fspath(directory)), config, str(directory))


def check_source(source: Source, config: RuleConfig, directory: str,
                 each: Callable[[Item], None] | None = None) -> CheckReport:
    """`check` of a dump already read whole, named `directory` in the report (a link read_source could not resolve,
    to a record after it in a manifest out of order, takes the statistics of the record with its seq); `each` sees
    every item in execution order."""
    _refuse_plain(source.mode, directory)
    items: list[Item] = sorted([*source.items, *source.params.values()], key=lambda it: (it.record.step, it.record.seq))
    by_record = {id(item.record): item for item in items}

    def arrays(rec: Record) -> np.ndarray | None:
        item = by_record.get(id(rec))
        if item is None or item.path is None or item.error:
            return None
        return load_tensor(item)

    if each is not None:
        for item in items:
            each(item)
    view = DumpView.of([item.record for item in items], config, arrays if source.mode == "full" else None)
    return _report(view, config, source.framework, source.mode, directory, len(items), source.problems)


def check_stream(stream: Stream, config: RuleConfig, directory: str,
                 each: Callable[[Item], None] | None = None) -> CheckReport:
    """`check` of a dump as its items come, named `directory` in the report; `each` sees every item as it passes (a
    multi-rank check gathers what its cross-rank rules read in the same pass)."""
    _refuse_plain(stream.mode, directory)
    params: dict[tuple[int, str], Item] = {}  # the last value read of each parameter at each step
    view = DumpView(config, _loader(params) if stream.mode == "full" else None)
    listed = 0
    for item in stream:
        rec = item.record
        if rec.kind == PARAM:
            params[(rec.step, rec.module)] = item
        else:
            listed += 1
        view.add(rec)
        if each is not None:
            each(item)
    return _report(view, config, stream.framework, stream.mode, directory, listed + len(params), stream.problems)


def _refuse_plain(mode: str, directory: str) -> None:
    if mode == "npy":
        raise AlignerError(f"{directory}: a directory of plain .npy files; align check reads aligner dumps "
                           "(aligner.dump writes manifest.jsonl)")


def _report(view: DumpView, config: RuleConfig, framework: str, mode: str, directory: str, records: int,
            problems: list[str]) -> CheckReport:
    """The rules on a view of every record; AlignerError when each rule was skipped."""
    evaluation = evaluate_view(view, config, framework=framework)
    if not evaluation.checked:
        reasons = "; ".join(f"{rule}: {why}" for rule, why in evaluation.skipped.items())
        raise AlignerError(f"{directory}: every rule was skipped, nothing was checked ({reasons})")
    return CheckReport(directory, framework, mode, records, evaluation, {k: dict(v) for k, v in config.rules.items()},
                       problems)


def _loader(params: dict[tuple[int, str], Item]) -> Callable[[Record], np.ndarray | None]:
    """A full dump's tensors as the rules load them: only parameter values are (update ratios), by their record."""
    def arrays(rec: Record) -> np.ndarray | None:
        item = params.get((rec.step, rec.module))
        if item is None or item.record is not rec or item.path is None or item.error:
            return None
        return load_tensor(item)
    return arrays
