"""Which settings of the blamed module differ between the two sides (issue 27): a verdict that names the module
also says "eps 1e-06 vs 1e-05" when the module's attributes differ in a setting that changes its numbers.

The attributes come from each side's `call` records (`attrs`, written on a module's first call of a step by full
dumps). Across PyTorch and MindSpore they are compared by the audit's rules (mappings/audit_layers.yaml, read by
`aligner.pipelines.audit`): the same table knows that MindSpore's `epsilon` is torch's `eps`, `keep_prob` is 1 - `p`,
MindSpore's BatchNorm momentum is 1 - torch's, and computes the padding a `pad_mode` applies for the module's
recorded input size. Two dumps of one framework compare their attributes as recorded.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Sequence

from aligner.core.errors import AlignerError
from aligner.core.frameworks import Framework
from aligner.dumping.manifest import Io, Kind, Record
from aligner.dumping.read.source import Source
from aligner.dumping.signature import restore
from aligner.pipelines.audit.layers import Layer
from aligner.pipelines.audit.model import _Auditor  # the audit's rule checks, one owner for what differs
from aligner.pipelines.audit.pairing import LayerPair
from aligner.pipelines.audit.rules import RuleBook, load_rulebook
from aligner.pipelines.compare.evaluate import Row
from aligner.pipelines.compare.verdict import Culprit, Divergence, Verdict

PT, MS = Framework.PYTORCH, Framework.MINDSPORE
_OWN = ("class",)  # attributes every call record carries that are no setting


@dataclasses.dataclass(frozen=True)
class SettingDiff:
    """One setting of the blamed module that differs: its name (PyTorch's across frameworks) and each side's value as
    that side's constructor takes it (`value_a` the migrated side's, `value_b` the reference's)."""

    name: str
    value_a: Any
    value_b: Any
    meaning_a: Any = None      # a MindSpore value in PyTorch's meaning where it reads otherwise (momentum 0.9: 0.1)
    meaning_b: Any = None
    why: str = ""              # what the difference does, from the rule (empty for two dumps of one framework)


def _decoded(attrs: dict[str, Any]) -> dict[str, Any]:
    """A call record's attributes as values (tuples, infinities back from their JSON tags); an attribute no dump
    could encode is left out."""
    out: dict[str, Any] = {}
    for name, value in attrs.items():
        try:
            out[name] = restore({"args": [value], "kwargs": {}}, [])[0][0]
        except AlignerError:
            continue
    return out


def _readable(book: RuleBook) -> RuleBook:
    """The rules a dump's attributes can answer: not those that ask whether a parameter exists (`present`: tensors
    are not among the recorded attributes)."""
    def reads_tensors(rule: Any) -> bool:
        return any(isinstance(e, dict) and "present" in e for side in rule.sides.values() for e in side.read)
    return dataclasses.replace(book, rules=tuple(r for r in book.rules if not reads_tensors(r)))


def _described(source: Source, rec: Record) -> tuple[dict[str, Any], tuple[int, ...] | None] | None:
    """The attributes of the module of `rec` in its step (from its first call record that carries them) and the
    shape of its call's first input; None when the dump holds no attributes of it (stats-only dumps, version 1)."""
    attrs = next((c.attrs for c in source.calls.values()
                  if c.module == rec.module and c.step == rec.step and c.attrs), None)
    if attrs is None:
        return None
    shape = next((tuple(it.record.shape) for it in source.items if it.record.step == rec.step
                  and it.record.call == rec.call and it.record.io == Io.INPUT), None) if rec.call is not None else None
    return _decoded(attrs), shape


def _layer(framework: Framework, rec: Record, attrs: dict[str, Any], shape: tuple[int, ...] | None,
           book: RuleBook) -> Layer | None:
    """The module as the audit's rules see a layer, its attributes standing in for the module; None when no rule
    knows its class."""
    base = str(attrs.get("class", ""))
    name = base.rpartition(".")[2]
    kind = book.kinds[framework].get(name) or book.by_name.get(name)
    if kind is None:
        return None
    return Layer(rec.module, kind, base, types.SimpleNamespace(**attrs), input_shape=shape)


def differences(rec_a: Record, rec_b: Record, migrated: Source, reference: Source) -> tuple[SettingDiff, ...]:
    """The settings in which the module of `rec_a` (migrated side) and of `rec_b` (reference) differ."""
    found_a, found_b = _described(migrated, rec_a), _described(reference, rec_b)
    if found_a is None or found_b is None:
        return ()
    (attrs_a, shape_a), (attrs_b, shape_b) = found_a, found_b
    frameworks = (migrated.framework, reference.framework)
    if set(frameworks) != {PT.value, MS.value}:
        if frameworks[0] != frameworks[1]:
            return ()
        return tuple(SettingDiff(k, attrs_a[k], attrs_b[k]) for k in attrs_b
                     if k in attrs_a and k not in _OWN and attrs_a[k] != attrs_b[k])
    book = _readable(load_rulebook())
    a_is_torch = frameworks[0] == PT.value
    fa, fb = (PT, MS) if a_is_torch else (MS, PT)
    layer_a, layer_b = _layer(fa, rec_a, attrs_a, shape_a, book), _layer(fb, rec_b, attrs_b, shape_b, book)
    if layer_a is None or layer_b is None:
        return ()
    pair = LayerPair(layer_a, layer_b, "dump") if a_is_torch else LayerPair(layer_b, layer_a, "dump")
    out = []
    for finding in _Auditor(book, fb, traced=shape_a is not None or shape_b is not None).pair_findings(pair):
        rule = book.rule(finding.rule)
        torch_value, ms_value = finding.values
        meaning = rule.sides[MS].value(pair.ms.module, pair.ms.base) if rule is not None and \
            rule.compare == "equal" else ms_value
        meaning = None if meaning == ms_value else meaning
        out.append(SettingDiff(finding.attribute or finding.rule, torch_value if a_is_torch else ms_value,
                               ms_value if a_is_torch else torch_value, None if a_is_torch else meaning,
                               meaning if a_is_torch else None, rule.why if rule is not None else ""))
    return tuple(out)


def _plain_arguments(call: Record | None) -> dict[str, Any]:
    """An op call's arguments that are plain values, by place ("0" positional, "approximate" a keyword); tensors and
    values no dump could encode left out."""
    if call is None or not isinstance(call.args, dict):
        return {}
    args, kwargs = call.args.get("args", []), call.args.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return {}
    given = {str(i): v for i, v in enumerate(args)} | {str(k): v for k, v in kwargs.items()}
    return _decoded({k: v for k, v in given.items() if not (isinstance(v, dict) and "tensor" in v)})


def op_differences(rec_a: Record, rec_b: Record, migrated: Source, reference: Source) -> tuple[SettingDiff, ...]:
    """The plain arguments in which the op call of `rec_a` (migrated side) and of `rec_b` (reference) differ: by
    keyword across frameworks (their positions differ: MindSpore passes the operator first), by place within one."""
    if rec_a.call is None or rec_b.call is None:
        return ()
    given_a = _plain_arguments(migrated.calls.get((rec_a.step, rec_a.call)))
    given_b = _plain_arguments(reference.calls.get((rec_b.step, rec_b.call)))
    same_framework = migrated.framework == reference.framework
    return tuple(SettingDiff(k, given_a[k], given_b[k]) for k in given_b
                 if k in given_a and (same_framework or not k.isdigit()) and given_a[k] != given_b[k])


def with_settings(verdict: Verdict, rows: Sequence[Row], migrated: Source, reference: Source) -> Verdict:
    """`verdict` with each finding that blames a module's own computation told the settings in which that module
    differs between the sides, and each that blames an op the arguments its two calls differ in
    (`Divergence.settings`)."""
    def told(f: Divergence) -> Divergence:
        pair = rows[f.origin].pair
        if pair.a is None or pair.b is None:
            return f
        if f.culprit is Culprit.MODULE:
            return dataclasses.replace(f, settings=differences(pair.a.record, pair.b.record, migrated, reference))
        if f.culprit is Culprit.OP and f.op is None and pair.a.record.kind == pair.b.record.kind == Kind.OP:
            return dataclasses.replace(f, settings=op_differences(pair.a.record, pair.b.record, migrated, reference))
        return f
    return dataclasses.replace(verdict, findings=tuple(told(f) for f in verdict.findings))
