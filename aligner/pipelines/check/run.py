"""`align check DUMP` / `aligner.check`: read one dump directory and evaluate the health rules on its records (the
rules: rules.py; thresholds: config.py and mappings/check_rules.yaml; the report: report.py)."""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from aligner.core.errors import AlignerError
from aligner.dumping.manifest import Record
from aligner.dumping.read.source import Item, Source, load_tensor, read_source
from aligner.pipelines.check.config import RuleConfig
from aligner.pipelines.check.report import CheckReport
from aligner.pipelines.check.rules import evaluate


def check(directory: str | os.PathLike, rules: Mapping[str, Any] | None = None) -> CheckReport:
    """Check one dump directory with the rules of check_rules.yaml (`rules` overrides thresholds: {"rule.key": value}
    or {"rule": {"key": value}}); AlignerError when the directory cannot be read or no rule could be evaluated."""
    config = RuleConfig.load(rules)
    return check_source(read_source(os.fspath(directory)), config, str(directory))


def check_source(source: Source, config: RuleConfig, directory: str) -> CheckReport:
    """`check` of a dump already read, named `directory` in the report (a multi-rank check reads each rank once,
    for its own rules and the cross-rank ones)."""
    if source.mode == "npy":
        raise AlignerError(f"{directory}: a directory of plain .npy files; align check reads aligner dumps "
                           "(aligner.dump writes manifest.jsonl)")
    items: list[Item] = list(source.items) + list(source.params.values())
    by_record = {id(item.record): item for item in items}
    records = sorted((item.record for item in items), key=lambda r: (r.step, r.seq))

    def arrays(rec: Record) -> np.ndarray | None:
        item = by_record.get(id(rec))
        if item is None or item.path is None or item.error:
            return None
        return load_tensor(item)

    evaluation = evaluate(records, config, framework=source.framework,
                          arrays=arrays if source.mode == "full" else None)
    if not evaluation.checked:
        reasons = "; ".join(f"{rule}: {why}" for rule, why in evaluation.skipped.items())
        raise AlignerError(f"{directory}: every rule was skipped, nothing was checked ({reasons})")
    return CheckReport(directory, source.framework, source.mode, len(records), evaluation,
                       {k: dict(v) for k, v in config.rules.items()}, source.problems)
