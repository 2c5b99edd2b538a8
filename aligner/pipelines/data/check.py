"""`align data check DIR` / `aligner.check_data`: one recorded input pipeline checked on its own (missing values and
sentinels, class balance, duplicates, constant fields, labels out of range, and the sharding of multi-rank runs)."""
from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np

from aligner.core.errors import AlignerError
from aligner.dumping.data_format import DataDump, FieldData, FieldKind, rank_folders, read_data_dump
from aligner.pipelines.data.compare import rank_keys, sharding
from aligner.pipelines.data.result import DataCheckResult, DataFinding, FieldSummary
from aligner.pipelines.data.rules import DataRule, Section, limit

_S = Section.CHECK


def check_data(directory: str | os.PathLike, classes: int | None = None) -> DataCheckResult:
    """Check one data dump (or each rank of a multi-rank one, and the ranks' shards); `classes`: the number of
    classes labels must lie in (0..classes-1; default: negative labels only are out of range)."""
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or classes < 1):
        raise AlignerError(f"classes must be a whole number >= 1, got {classes!r}")
    ranks = rank_folders(directory)
    if not ranks:
        return _check(read_data_dump(directory), classes)
    dumps = {r: read_data_dump(p) for r, p in ranks.items()}
    results = tuple((r, _check(d, classes)) for r, d in dumps.items())
    first = results[0][1]
    return DataCheckResult(str(directory), first.framework, sum(r.samples for _, r in results), (),
                           tuple(sharding(dumps, str(directory), _S)), results)


def _finding(rule: DataRule, field: str | None, **evidence: Any) -> DataFinding:
    return DataFinding(rule, _S, field, evidence)


def _check(d: DataDump, classes: int | None) -> DataCheckResult:
    findings: list[DataFinding] = []
    summaries = []
    idx = d.epoch(0)
    for f in d.fields:
        findings += _missing(f, idx)
        findings += _constant(f, idx)
        histogram: tuple[tuple[int, int], ...] = ()
        if f.kind == FieldKind.LABEL:
            assert f.label is not None
            values, counts = np.unique(f.label[idx], return_counts=True)
            histogram = tuple((int(v), int(c)) for v, c in zip(values, counts))
            findings += _labels(f, idx, histogram, classes)
        summaries.append(FieldSummary(f.name, f.kind.value, histogram))
    findings += _duplicates(d, idx)
    findings += _random(d)
    return DataCheckResult(d.path, d.framework, len(d.samples), tuple(summaries), tuple(findings))


def _missing(f: FieldData, idx: np.ndarray) -> list[DataFinding]:
    """NaN/Inf per field, and sentinel values (-1, -999, ...) standing for missing ones outside images."""
    found = []
    counts = f.nonfinite[idx]
    if counts.any():
        bad = np.flatnonzero(counts)
        found.append(_finding(DataRule.MISSING_VALUES, f.name, samples=len(bad), values=int(counts.sum()),
                              first=int(idx[bad[0]])))
    if f.kind == FieldKind.IMAGE:
        return found
    sentinels = [int(v) for v in limit(_S, DataRule.SENTINEL, "values")]
    if f.kind == FieldKind.LABEL:
        assert f.label is not None
        values = f.label[idx]
        hits = {v: int((values == v).sum()) for v in sentinels}
    elif f.kind == FieldKind.TENSOR:
        assert f.stats is not None
        lows, highs = f.stats[idx, 0, 2], f.stats[idx, 0, 3]
        hits = {v: int(((lows == v) | (highs == v)).sum()) for v in sentinels}
    else:
        return found
    allowed = limit(_S, DataRule.SENTINEL, "fraction") * len(idx)
    for value, count in hits.items():
        if count > allowed:
            found.append(_finding(DataRule.SENTINEL, f.name, samples=count, value=value))
    return found


def _constant(f: FieldData, idx: np.ndarray) -> list[DataFinding]:
    if len(idx) > 1 and len({row.tobytes() for row in f.digest[idx]}) == 1:
        return [_finding(DataRule.CONSTANT_FIELD, f.name, total=len(idx))]
    return []


def _labels(f: FieldData, idx: np.ndarray, histogram: tuple[tuple[int, int], ...],
            classes: int | None) -> list[DataFinding]:
    assert f.label is not None
    found = []
    values = f.label[idx]
    sentinels = {int(v) for v in limit(_S, DataRule.SENTINEL, "values")}
    outside = (values < 0) if classes is None else (values < 0) | (values >= classes)
    outside &= ~np.isin(values, list(sentinels))
    if outside.any():
        shown = sorted(set(values[outside].tolist()))
        found.append(_finding(DataRule.LABEL_RANGE, f.name, samples=int(outside.sum()),
                              top="?" if classes is None else classes - 1,
                              values=", ".join(map(str, shown[:6])) + (" ..." if len(shown) > 6 else "")))
    real = [(c, n) for c, n in histogram if c not in sentinels and (classes is None or 0 <= c < classes)]
    if classes is not None:  # a class with no sample at all is the rarest
        present = {c for c, _ in real}
        real += [(c, 0) for c in range(classes) if c not in present]
    if len(real) < 2:
        return found
    top = max(real, key=lambda cn: cn[1])
    low = min(real, key=lambda cn: cn[1])
    ratio = top[1] / max(low[1], 1)
    if ratio > limit(_S, DataRule.CLASS_IMBALANCE, "ratio"):
        found.append(_finding(DataRule.CLASS_IMBALANCE, f.name, top=top[0], top_n=top[1], low=low[0], low_n=low[1],
                              ratio=ratio))
    few = limit(_S, DataRule.RARE_CLASS, "min_samples")
    rare = sorted(c for c, n in real if n < few)
    if rare:
        found.append(_finding(DataRule.RARE_CLASS, f.name, count=len(rare), min_samples=int(few),
                              classes=", ".join(map(str, rare[:8])) + (" ..." if len(rare) > 8 else "")))
    return found


def _duplicates(d: DataDump, idx: np.ndarray) -> list[DataFinding]:
    seen: dict[bytes, int] = {}
    repeats = []
    for k, key in zip(idx.tolist(), rank_keys(d)):
        if key in seen:
            repeats.append((k, seen[key]))
        else:
            seen[key] = k
    if not repeats:
        return []
    return [_finding(DataRule.DUPLICATES, None, count=len(repeats), first=repeats[0][0], of=repeats[0][1])]


def _random(d: DataDump) -> list[DataFinding]:
    """Fields whose values change between the first two epochs (a random transform: right for training, wrong at
    evaluation), the samples matched by content."""
    if d.epochs < 2:
        return []
    found = []
    for f in d.fields:
        first, second = (collections.Counter(row.tobytes() for row in f.digest[d.epoch(e)]) for e in (0, 1))
        kept = sum((first & second).values())
        total = sum(first.values())
        if kept < limit(_S, DataRule.RANDOM_TRANSFORM, "kept") * total:
            found.append(_finding(DataRule.RANDOM_TRANSFORM, f.name, changed=total - kept, total=total))
    return found
