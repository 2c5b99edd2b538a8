"""A saved comparison (`align compare --json`) read back into a CompareResult, so render/ can show it again without
the dumps (`align report`). Loaded only for that: it imports the settings' types, which load the audit's rules.

What the JSON holds comes back exactly (`to_dict` of the result read equals the file's data). What it never held
stays at its default: the records' other fields (seq, statistics; parent but for a finding's origin), the norm of a
reference the first side equals exactly, and whether a diverged row held the same rows in another order. A calibrated
comparison is refused: its per-record noise and tolerances are not saved.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import msgspec

from aligner.core.result import check_schema, number, required_number, typed
from aligner.core.tolerance import ToleranceSpec
from aligner.dumping.manifest import Record
from aligner.dumping.pair.matching import MatchedBy, Pair
from aligner.dumping.read.source import Item
from aligner.mapping.msprobe_maps import MsprobeMap
from aligner.metrics.measure import Method, Metrics
from aligner.pipelines.compare.evaluate import Row
from aligner.pipelines.compare.result import CompareResult
from aligner.pipelines.compare.settings import SettingDiff
from aligner.pipelines.compare.verdict import Culprit, Divergence, Label, NanFinding, OneSided, Phase, Verdict

KEYS = ("migrated", "reference", "tolerance", "strict", "findings", "nan_origin", "calibration", "rows")
_FLOATS = ("max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "cosine", "sqnr_db", "rel_l2_err")
_COUNTS = ("numel", "mismatched", "nan_a", "nan_b", "inf_a", "inf_b")


def load(data: Any) -> CompareResult:
    """The CompareResult a compare JSON was written from; NotAResultError, ValueError, KeyError or TypeError when it is
    not one (the caller names the file)."""
    data = check_schema(data, "compare", KEYS)
    if data["calibration"] is not None:
        raise ValueError("a calibrated comparison (compare --calibrate) does not save its per-record noise: run it "
                         "again with --html")
    findings = [_finding(typed(f, dict, "finding")) for f in typed(data["findings"], list, "findings")]
    # the first side's scope of code a finding blames (the zoom-in's scope): its record's parent, not saved, is the
    # blamed module's path on that side (blame_other where it differs from the reference's)
    parents = {f.origin: f.blame_other if f.blame_other is not None else f.blame for f in findings
               if f.culprit in (Culprit.PARENT_CODE, Culprit.OP)}
    rows = tuple(_row(i, typed(d, dict, f"row {i}"), parents.get(i))
                 for i, d in enumerate(typed(data["rows"], list, "rows")))
    labels = {i: Label(d["label"]) for i, d in enumerate(data["rows"]) if d.get("label") is not None}
    nan = data["nan_origin"]
    verdict = Verdict(tuple(findings),
                      None if nan is None else NanFinding(typed(nan["row"], int, "nan_origin row"),
                                                          str(nan["side"]), typed(nan["count"], int, "count")),
                      labels, _optional(data.get("bisect_reads"), int), _optional(data.get("bisect_confirmed"), bool),
                      _optional(data.get("bisect_unread"), int),
                      tuple(typed(i, int, "immaterial input") for i in data.get("immaterial_inputs") or []))
    for index in [f.first for f in verdict.findings] + [f.origin for f in verdict.findings] + \
            ([nan["row"]] if nan is not None else []):
        if not 0 <= index < len(rows):
            raise ValueError(f"a finding names row {index} of {len(rows)}")
    return CompareResult(typed(data["migrated"], str, "migrated"), typed(data["reference"], str, "reference"), rows,
                         verdict, tuple(typed(p, str, "manifest problem") for p in data.get("manifest_problems", [])),
                         ToleranceSpec.from_dict(typed(data["tolerance"], dict, "tolerance")),
                         typed(data["strict"], bool, "strict"),
                         None, tuple(MsprobeMap(**typed(m, dict, "msprobe map"))
                                     for m in data.get("msprobe_maps", [])))


def _optional(value: Any, kind: type) -> Any:
    return None if value is None else typed(value, kind, "bisect field")


def _record(row: Mapping[str, Any], side: str, names_row: bool, parent: str | None = None) -> Record:
    """One side's record as far as the row says: the row's own name, type, kind, io, index and step."""
    fields = {"parent": parent, "seq": row["row"], "module": row["module"] if names_row else row["module_a"],
              "type": row["type"] if names_row else "", "kind": row["kind"], "io": row["io"], "index": row["index"],
              "step": row["step"], "dtype": row[f"dtype_{side}"], "shape": row[f"shape_{side}"],
              "arg": row[f"arg_{side}"]}
    return msgspec.convert(fields, Record)  # each field's type checked (msgspec.ValidationError is a ValueError)


def _row(i: int, d: Mapping[str, Any], parent_a: str | None) -> Row:
    has_a, has_b = d["shape_a"] is not None, d["shape_b"] is not None
    a = Item(_record(d, "a", not has_b, parent_a)) if has_a else None
    b = Item(_record(d, "b", True)) if has_b else None
    if a is None and b is None:
        raise ValueError(f"row {i} has a record on neither side")
    metrics = None
    if d.get("method") is not None:
        if a is None or b is None:
            raise ValueError(f"row {i} has metrics but a record on one side only")
        index = d["max_abs_index"]
        floats = {k: number(d[k]) for k in _FLOATS}
        metrics = Metrics(tuple(a.record.shape), tuple(b.record.shape), a.record.dtype, b.record.dtype,
                          rtol=required_number(d["rtol"], "a tolerance"),
                          atol=required_number(d["atol"], "a tolerance"), method=Method(d["method"]),
                          max_abs_index=None if index is None else tuple(typed(n, int, "index") for n in index),
                          **{k: typed(d[k], int, k) for k in _COUNTS},  # type: ignore[arg-type]
                          norm_b=_norm_b(floats, d["numel"]), **floats)  # type: ignore[arg-type]
    matched_by = d["matched_by"]
    return Row(Pair(a, b, None if matched_by is None else MatchedBy(typed(matched_by, str, "matched_by"))), metrics,
               _optional_str(d["error"]), read=d["status"] != "unread", skipped=_optional_str(d.get("skipped")))


def _norm_b(floats: Mapping[str, float | None], numel: Any) -> float | None:
    """The reference's L2 norm, which the JSON does not hold, from what it does: rmse * sqrt(n) is ||a - b|| and
    rel_l2_err is ||a - b|| / ||b|| (equal to float rounding); None where either is missing, zero or not finite."""
    rmse, rel = floats["rmse"], floats["rel_l2_err"]
    if not (rmse and rel and math.isfinite(rmse) and math.isfinite(rel)) or not isinstance(numel, int) or numel < 0:
        return None
    return rmse * math.sqrt(numel) / rel


def _optional_str(value: Any) -> str | None:
    return None if value is None else typed(value, str, "row text")


def _finding(d: Mapping[str, Any]) -> Divergence:
    argument = d.get("argument")
    return Divergence(
        phase=Phase(d["phase"]), first=typed(d["first"], int, "first"), previous=_optional(d["previous"], int),
        origin=typed(d["origin"], int, "origin"), reason=typed(d["reason"], str, "reason"),
        culprit=Culprit(d["culprit"]), blame=typed(d["blame"], str, "blame"), source=_optional_str(d["source"]),
        blame_other=_optional_str(d["blame_other"]), op=_optional_str(d["op"]),
        argument=None if argument is None else OneSided(**typed(argument, dict, "argument")),
        above_noise=number(d["above_noise"]),
        settings=tuple(SettingDiff(**typed(s, dict, "setting")) for s in d["settings"]))
