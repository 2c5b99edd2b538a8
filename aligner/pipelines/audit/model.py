"""`aligner.audit(model_a, model_b)`: compare a PyTorch model and its MindSpore port layer by layer, before any tensor
is compared, for the settings whose defaults or conventions differ between the frameworks (mappings/audit_layers.yaml),
the compute precision, and the laws the fresh weights were drawn from (mappings/audit_init.yaml).

Severity: error = changes the forward numbers (for the example input when one is given); warning = changes training
only (momentum, dropout, init, a dropout's mode), or depends on an input size that was not given; info. Each finding
carries the fix for the migrated side (MindSpore unless `ref` names it as the reference).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from aligner.core.errors import AlignerError
from aligner.core.findings import Finding, Severity
from aligner.core.frameworks import Framework, reference_index
from aligner.core.text import code_literal as _lit
from aligner.core.words import Text, Words, words
from aligner.io.factory import model_framework
from aligner.pipelines.audit import initlaw
from aligner.pipelines.audit.layers import Layer, collect, trace
from aligner.pipelines.audit.optimizers import DEFAULT_STEPS, OptimizerAudit, audit_optimizers
from aligner.pipelines.audit.pairing import LayerPair, pair_layers
from aligner.pipelines.audit.probe import probe
from aligner.pipelines.audit.report import (
    AuditReport,
    FindingGroup,
    NotAudited,
    PairRecord,
    Unpaired,
    apply_baseline,
    load_baseline,
)
from aligner.pipelines.audit.rules import Rule, RuleBook, load_rulebook, qualname, short_class
from aligner.pipelines.audit.says import Say
from aligner.pipelines.audit.windows import Geometry, geometry, spatial_rank

PT, MS = Framework.PYTORCH, Framework.MINDSPORE
SAMPLE_SIZES = tuple(range(16, 32))   # input sizes tried when none is given: every residue of strides up to 4


def where_text(torch_path: str | None, ms_path: str | None) -> str:
    """'torch path / MindSpore path' of a pair (<top> for the model itself)."""
    return f"{torch_path or '<top>'} / {ms_path or '<top>'}"


def _equal(a: Any, b: Any, rtol: float | None) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool) and rtol is not None:
        return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=1e-12)
    return bool(a == b)


class _Auditor:
    """The checks of one audit: knows the rules, which side is migrated, and whether input sizes are known."""

    def __init__(self, book: RuleBook, reference: Framework, traced: bool) -> None:
        self.book, self.reference, self.traced = book, reference, traced
        self.migrated = reference.other
        self.shared: dict[int, tuple[Text, Text]] = {}   # id(finding) -> (words, fix) without its paths, to group

    def pair_findings(self, pair: LayerPair) -> list[Finding]:
        out: list[Finding] = []
        if "name" in (pair.torch.recognised, pair.ms.recognised):
            return out      # no setting of a class taken by its name can be read: the probe checks it
        for rule in self.book.for_kind(pair.torch.kind):
            if pair.ms.kind != pair.torch.kind:
                continue
            check: Callable[[Rule, LayerPair], Finding | None] = {
                "equal": self._equal_rule, "padding": self._padding, "ceil_mode": self._ceil_mode,
                "count_include_pad": self._count_include_pad, "dtype": self._dtype}[rule.compare]
            found = check(rule, pair)
            if found is not None:
                out.append(found)
        return out

    # --- plain settings ----------------------------------------------------------------------------------------
    def _side_layer(self, pair: LayerPair, fw: Framework) -> Layer:
        return pair.torch if fw == PT else pair.ms

    def _arg(self, rule: Rule, fw: Framework, layer: Layer, neutral: Any) -> Any:
        """A neutral value written as `fw`'s constructor argument (momentum 0.1 -> MindSpore 0.9)."""
        fix = rule.sides[fw].fix_for(layer.base)
        return fix.argument(neutral) if fix is not None and fix.arg else neutral

    def _fix(self, rule: Rule, pair: LayerPair, neutral: Any) -> str:
        layer = self._side_layer(pair, self.migrated)
        fix = rule.sides[self.migrated].fix_for(layer.base)
        if fix is None:
            return ""
        if fix.text is not None:
            return fix.text.format(value=_lit(fix.argument(neutral)), path=layer.path)
        return f"{short_class(layer.base)}(..., {fix.arg}={_lit(fix.argument(neutral))})"

    def _finding(self, rule: Rule, pair: LayerPair, said: Words, fix: Text, values: tuple[Any, Any],
                 severity: Severity | None = None) -> Finding:
        message = words(Say.LAYER, where=(pair.torch.path, pair.ms.path), kind=pair.torch.kind, said=said,
                        why=rule.why)
        found = Finding(rule.id, severity or rule.severity, message, (pair.torch.path, pair.ms.path), fix=fix,
                        attribute=rule.attribute, values=values)
        self.shared[id(found)] = (message.without("where"), fix)
        return found

    @staticmethod
    def _default_note(layer: Layer, arg: str | None, value: Any, side: str) -> tuple[tuple[str, Any, str], ...]:
        """((side, value, class),) when the value found is its class's constructor default (MindSpore 1e-07 is
        nn.LayerNorm's default), else ()."""
        try:
            default = inspect.signature(type(layer.module).__init__).parameters[arg or ""].default
        except (KeyError, TypeError, ValueError):
            return ()
        if default is inspect.Parameter.empty or not _equal(default, value, 1e-9):
            return ()
        return ((side, value, short_class(qualname(type(layer.module)))),)

    def _values(self, rule: Rule, pair: LayerPair) -> tuple[Any, Any]:
        return (rule.sides[PT].value(pair.torch.module, pair.torch.base),
                rule.sides[MS].value(pair.ms.module, pair.ms.base))

    def _equal_rule(self, rule: Rule, pair: LayerPair) -> Finding | None:
        tv, mv = self._values(rule, pair)
        if _equal(tv, mv, rule.rtol):
            return None
        t_arg, m_arg = self._arg(rule, PT, pair.torch, tv), self._arg(rule, MS, pair.ms, mv)
        meaning = (mv,) if _lit(m_arg) != _lit(mv) else ()   # MindSpore's argument means another value in torch
        defaults = tuple(note for fw, layer, arg in ((PT, pair.torch, t_arg), (MS, pair.ms, m_arg))
                         for fix in [rule.sides[fw].fix_for(layer.base)]
                         for note in self._default_note(layer, fix.arg if fix is not None else None, arg, fw.label))
        message = words(Say.SETTING, attribute=rule.attribute, torch=t_arg, ms=m_arg, meaning=meaning,
                        defaults=defaults)
        ref_value = tv if self.reference == PT else mv
        return self._finding(rule, pair, message, self._fix(rule, pair, ref_value), (t_arg, m_arg))

    # --- windows: computed per input size -----------------------------------------------------------------------
    def _geometries(self, pair: LayerPair) -> tuple[Geometry, Geometry, int] | None:
        rank = spatial_rank(pair.torch.base.rpartition(".")[2])
        for layer in (pair.torch, pair.ms):
            if layer.input_shape is not None and len(layer.input_shape) > 2:
                rank = min(rank, len(layer.input_shape) - 2)
        try:
            return geometry(pair.torch.module, PT, rank), geometry(pair.ms.module, MS, rank), rank
        except (AttributeError, TypeError, ValueError, KeyError):
            return None

    def _sizes(self, pair: LayerPair, rank: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(torch input sizes, MindSpore input sizes) to evaluate: the traced ones, else the sample sizes."""
        t, m = pair.torch.input_shape, pair.ms.input_shape
        if t is not None or m is not None:
            t = t if t is not None else m
            m = m if m is not None else t
            assert t is not None and m is not None
            return [(t[-rank:], m[-rank:])]
        return [((n,) * rank, (n,) * rank) for n in SAMPLE_SIZES]

    def _by_size(self, pair: LayerPair, rank: int, differs: Callable[[tuple[int, ...], tuple[int, ...]], bool]
                 ) -> tuple[Severity | None, Words | None, tuple[int, ...]]:
        """(None when no size differs | the severity, words on the sizes, one size that differs)."""
        sizes = self._sizes(pair, rank)
        bad = [s for s in sizes if differs(*s)]
        if not bad:
            return None, None, ()
        size = bad[0][0]
        if len(sizes) == 1:
            return Severity.ERROR, words(Say.SIZE_ONE, size=size), size
        if len(bad) == len(sizes):
            return Severity.ERROR, words(Say.SIZE_EVERY, size=size), size
        odd_even = {s[0][0] % 2 for s in bad}
        return Severity.WARNING, words(Say.SIZE_SOME, parity=odd_even.pop() if len(odd_even) == 1 else None,
                                       size=size), size

    def _padding(self, rule: Rule, pair: LayerPair) -> Finding | None:
        geoms = self._geometries(pair)
        if geoms is None:
            return None
        gt, gm, rank = geoms
        severity, sized, size = self._by_size(pair, rank, lambda ts, ms: gt.pads(ts) != gm.pads(ms))
        if severity is None:
            return None
        tp, mp = gt.pads(size), gm.pads(size)
        message = words(Say.PADDING, torch=tp, ms=mp, sizes=sized)
        fix = self._padding_fix(pair, tp if self.reference == PT else mp, gt if self.reference == PT else gm)
        return self._finding(rule, pair, message, fix, (tp, mp), severity)

    def _padding_fix(self, pair: LayerPair, pads: tuple[tuple[int, int], ...], ref_geom: Geometry) -> Text:
        layer = self._side_layer(pair, self.migrated)
        cls = short_class(layer.base)
        pooling = pair.torch.kind in ("MaxPool", "AvgPool")
        kernel = tuple(a.kernel for a in ref_geom.axes)
        stride = tuple(a.stride for a in ref_geom.axes)
        head = f"{cls}({_lit(kernel) if len(set(kernel)) > 1 else kernel[0]}, " \
               f"{_lit(stride) if len(set(stride)) > 1 else stride[0]}, " if pooling else f"{cls}(..., "
        symmetric = all(b == a for b, a in pads)
        flat = tuple(p for pair_ in pads for p in pair_)
        per_axis = tuple(b for b, _ in pads)
        if self.migrated == MS and hasattr(layer.module, "pad_mode"):
            if not any(flat):
                return f"{head}pad_mode='valid')"
            if symmetric and len(set(per_axis)) == 1:
                return f"{head}pad_mode='pad', padding={per_axis[0]})"
            if not pooling:
                return f"{head}pad_mode='pad', padding={flat})"
            if symmetric:
                return f"{head}pad_mode='pad', padding={per_axis})"
            return words(Say.PAD_FIX_MS, pads=self._torch_order(pads),
                         value="-inf" if pair.torch.kind == "MaxPool" else 0, cls=cls)
        if symmetric:
            return f"{head}padding={per_axis[0] if len(set(per_axis)) == 1 else per_axis})"
        fill = "float('-inf')" if pair.torch.kind == "MaxPool" else "0"
        return words(Say.PAD_FIX_TORCH, pads=self._torch_order(pads), fill=fill, cls=cls)

    @staticmethod
    def _torch_order(pads: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
        """F.pad's order: last axis first, (before, after) each."""
        return tuple(p for b, a in reversed(pads) for p in (b, a))

    def _ceil_mode(self, rule: Rule, pair: LayerPair) -> Finding | None:
        tv, mv = self._values(rule, pair)
        geoms = self._geometries(pair)
        if bool(tv) == bool(mv) or geoms is None:
            return None
        gt, gm, rank = geoms
        severity, sized, size = self._by_size(pair, rank, lambda ts, ms: gt.out(ts) != gm.out(ms))
        if severity is None:
            return None
        message = words(Say.CEIL_MODE, torch=tv, ms=mv, torch_out=gt.out(size), ms_out=gm.out(size), sizes=sized)
        return self._finding(rule, pair, message, self._fix(rule, pair, tv if self.reference == PT else mv),
                             (tv, mv), severity)

    def _count_include_pad(self, rule: Rule, pair: LayerPair) -> Finding | None:
        tv, mv = self._values(rule, pair)
        geoms = self._geometries(pair)
        if bool(tv) == bool(mv) or geoms is None:
            return None
        gt, gm, rank = geoms

        def padded(ts: tuple[int, ...], ms: tuple[int, ...]) -> bool:
            return any(p for pads in (gt.pads(ts), gm.pads(ms)) for pair_ in pads for p in pair_)

        severity, sized, _ = self._by_size(pair, rank, padded)
        if severity is None:
            return None
        message = words(Say.COUNT_INCLUDE_PAD, torch=tv, ms=mv, sizes=sized)
        return self._finding(rule, pair, message, self._fix(rule, pair, tv if self.reference == PT else mv),
                             (tv, mv), severity)

    def _dtype(self, rule: Rule, pair: LayerPair) -> Finding | None:
        tv, mv = pair.torch.dtype, pair.ms.dtype
        if tv is None or mv is None or tv == mv:
            return None
        message = words(Say.DTYPE, torch=tv, ms=mv)
        return self._finding(rule, pair, message, self._fix(rule, pair, tv if self.reference == PT else mv), (tv, mv))

    # --- initialisation -------------------------------------------------------------------------------------------
    def init_findings(self, pair: LayerPair) -> list[Finding]:
        out = []
        for leaf in pair.torch.params:
            if leaf not in pair.ms.params:
                continue
            laws = {}
            for fw, layer in ((PT, pair.torch), (MS, pair.ms)):
                weight = layer.params.get("weight")
                laws[fw] = initlaw.fit(layer.params[leaf], tuple(weight.shape) if weight is not None else None)
            if not initlaw.differ(laws[PT], laws[MS]):
                continue
            ref, mig = laws[self.reference], laws[self.migrated]
            layer = self._side_layer(pair, self.migrated)
            own = layer.leaves[leaf]
            name = f"{layer.path}.{own}" if layer.path else own
            line = ref.lines.get(self.migrated.value, "")
            fix: Text = line.format(param=name, shape=tuple(layer.params[leaf].shape)) if line else \
                words(Say.INIT_FIX, name=name, mean=ref.mean, std=ref.std)
            each = words(Say.INIT_FIX_EACH, line=line) if line else words(Say.INIT_FIX_EACH_DEFAULT)
            message = words(Say.INIT_LAW, where=(pair.torch.path, pair.ms.path), migrated=self.migrated.label,
                            name=name, law=mig.evidence(), reference=self.reference.label, ref_law=ref.evidence())
            found = Finding("init-law", Severity.WARNING, message, (pair.torch.path, pair.ms.path), fix=fix,
                            attribute=f"init:{leaf}", values=(laws[PT].name, laws[MS].name))
            self.shared[id(found)] = (words(Say.INIT_LAW_GROUP, own=own, migrated=self.migrated.label, law=mig.name,
                                            reference=self.reference.label, ref_law=ref.name), each)
            out.append(found)
        return out

    # --- probes -----------------------------------------------------------------------------------------------------
    def probe_pair(self, pair: LayerPair) -> tuple[Text, list[Finding], NotAudited | None]:
        """(what the probe showed, its finding, the pair as not audited when it had to be probed and could not)."""
        if not (pair.torch.needs_probe or pair.ms.needs_probe):
            return "", [], None
        result = probe(pair.torch, pair.ms, self.reference, self.book)
        if not result.ran:
            lost = None
            if "name" in (pair.torch.recognised, pair.ms.recognised):
                lost = NotAudited(pair.torch.path, pair.ms.path, pair.torch.kind,
                                  f"{pair.torch.class_name} / {pair.ms.class_name}",
                                  words(Say.NOT_PROBED, why=result.why))
            return words(Say.NOT_PROBED, why=result.why), [], lost
        if result.equal:
            return words(Say.PROBE_EQUAL, atol=self.book.probe_atol, rtol=self.book.probe_rtol,
                         max_diff=result.max_diff), [], None
        classes = {"torch_class": qualname(type(pair.torch.module)), "ms_class": qualname(type(pair.ms.module))}
        fix = words(Say.PROBE_FIX, fix=result.fix) if result.fix else words(Say.PROBE_NO_FIX,
                                                                            migrated=self.migrated.label)
        message = words(Say.PROBE, where=(pair.torch.path, pair.ms.path), kind=pair.torch.kind,
                        max_diff=result.max_diff, shape=result.shapes[0], **classes)
        found = Finding("probe", Severity.ERROR, message, (pair.torch.path, pair.ms.path), fix=fix, attribute="outputs",
                        values=(classes["torch_class"], classes["ms_class"]))
        self.shared[id(found)] = (words(Say.PROBE_GROUP, kind=pair.torch.kind, **classes), fix)
        return words(Say.PROBE_DIFFERS, max_diff=result.max_diff), [found], None

    # --- weight sharing -------------------------------------------------------------------------------------------
    def sharing_findings(self, pairs: list[LayerPair]) -> list[Finding]:
        """A parameter shared by two paired layers on one side (a head tied to the embedding) and two parameters on
        the other: equal at the start, they drift apart from the second step (checklist cg.01)."""
        slots = [(pair, leaf) for pair in pairs for leaf in pair.torch.tensors if leaf in pair.ms.tensors]
        out: list[Finding] = []
        for fw in (PT, MS):
            other = fw.other
            groups: dict[int, list[tuple[LayerPair, str]]] = {}
            for pair, leaf in slots:
                groups.setdefault(id(self._side_layer(pair, fw).tensors[leaf]), []).append((pair, leaf))
            for members in groups.values():
                twins = {id(self._side_layer(p, other).tensors[leaf]) for p, leaf in members}
                if len({(p.torch.path, leaf) for p, leaf in members}) < 2 or len(twins) == 1:
                    continue
                out.append(self._sharing_finding(fw, members))
        return out

    def _sharing_finding(self, shared_side: Framework, members: list[tuple[LayerPair, str]]) -> Finding:
        def names(fw: Framework) -> list[str]:
            return [(f"{layer.path}.{layer.leaves[leaf]}" if layer.path else layer.leaves[leaf]) + _call_text(layer)
                    for p, leaf in members for layer in [self._side_layer(p, fw)]]

        detail = words(Say.SHARING, side=shared_side.label, shared=tuple(names(shared_side)),
                       other=shared_side.other.label, separate=tuple(names(shared_side.other)))
        mig = names(self.migrated)
        tied = shared_side == self.reference
        fix = words(Say.TIE_FIX if tied else Say.UNTIE_FIX, one=mig[0], others=tuple(mig[1:]))
        found = Finding("weight-sharing", Severity.WARNING, detail,
                        tuple(x for p, _ in members for x in (p.torch.path, p.ms.path)), fix=fix,
                        attribute="shared", values=(tuple(names(PT)), tuple(names(MS))))
        self.shared[id(found)] = (detail, fix)
        return found


def _framework_of(model: Any, which: str) -> Framework:
    fw = model_framework(model)
    if fw is None:
        raise AlignerError(f"{which} is a {type(model).__name__}, not a torch.nn.Module or mindspore.nn.Cell")
    return fw


def _inputs(example: Any) -> tuple[dict[str, np.ndarray], bool] | None:
    """(named arrays, pass positionally?) from an array, a sequence of arrays, or a mapping (keyword arguments,
    unless every name is numpy's arr_0, arr_1, ... for unnamed arrays)."""
    if example is None:
        return None
    if isinstance(example, Mapping):
        named = {str(k): np.asarray(v) for k, v in example.items()}
        return named, all(re.fullmatch(r"arr_\d+", k) for k in named)   # np.savez(f, a, b): positional
    if isinstance(example, (list, tuple)):
        return {f"input{i}": np.asarray(v) for i, v in enumerate(example)}, True
    return {"input0": np.asarray(example)}, True


def audit(model_a: Any, model_b: Any, example_inputs: Any = None, ref: str | Framework | None = None,
          baseline: str | os.PathLike | None = None, *, optimizers: Sequence[Any] = (),
          schedulers: Sequence[Any] = (), steps: int = DEFAULT_STEPS) -> AuditReport:
    """Audit a PyTorch model against its MindSpore port (either order). `example_inputs`: an array, a sequence of
    arrays (positional) or a mapping (keyword arguments), fed to both models to learn each layer's input size and
    call order. `ref`: the reference side (default PyTorch; fixes are for the other). `baseline`: a file of accepted
    findings, which then do not count for the exit code. `optimizers` (one per framework, any order; None entries
    ignored) and `schedulers`: also audit the optimizers and the first `steps` learning rates (audit_optimizers)."""
    fw_a, fw_b = _framework_of(model_a, "the first model"), _framework_of(model_b, "the second model")
    if fw_a == fw_b:
        raise AlignerError(f"both models are {fw_a.value} models: give one torch.nn.Module and one mindspore.nn.Cell")
    reference = (fw_a, fw_b)[reference_index(ref, (fw_a, fw_b))]
    models = {fw_a: model_a, fw_b: model_b}
    accepted_keys = load_baseline(baseline) if baseline is not None else set()
    book = load_rulebook()
    layers = {fw: collect(models[fw], fw, book) for fw in (PT, MS)}
    given = _inputs(example_inputs)
    if given is not None:
        for fw in (PT, MS):
            trace(models[fw], fw, layers[fw], *given)
    pairs, lone_t, lone_m = pair_layers(layers[PT], layers[MS])
    auditor = _Auditor(book, reference, given is not None)
    findings: list[Finding] = []
    probes: dict[int, Text] = {}
    not_audited: list[NotAudited] = []
    for pair in pairs:
        findings += auditor.pair_findings(pair)
        probes[id(pair)], found, lost = auditor.probe_pair(pair)
        findings += found
        not_audited += [lost] if lost is not None else []
    findings += auditor.sharing_findings(pairs)
    for pair in pairs:
        findings += auditor.init_findings(pair)
    not_audited += [NotAudited(x.path if fw == PT else None, x.path if fw == MS else None, x.kind, x.class_name,
                               words(Say.UNPAIRED, call=(x.call + 1, len(x.calls)) if len(x.calls) > 1 else None))
                    for fw, lone in ((PT, lone_t), (MS, lone_m)) for x in lone if _counts(x, fw, book)]
    notes: list[Text] = [] if given is not None else [words(Say.NO_INPUTS)]
    optim = _optimizer_audit(models, optimizers, schedulers, steps, reference, notes)
    if optim is not None:
        findings += optim.findings
        notes += optim.notes
    new, accepted = apply_baseline(findings, accepted_keys)
    unpaired = list(dict.fromkeys([Unpaired(PT, x.path, x.kind, x.class_name) for x in lone_t]
                                  + [Unpaired(MS, x.path, x.kind, x.class_name) for x in lone_m]))   # a call each
    return AuditReport(type(models[PT]).__name__, type(models[MS]).__name__, reference,
                       {k: list(v.shape) for k, v in given[0].items()} if given is not None else None,
                       tuple(PairRecord(p.torch.path, p.ms.path, p.torch.kind, p.how, probes[id(p)]) for p in pairs),
                       tuple(unpaired), tuple(new), tuple(accepted), tuple(notes),
                       dataclasses.replace(optim, findings=(), notes=()) if optim is not None else None,
                       tuple(not_audited), _groups(new, auditor.shared))


def _call_text(layer: Layer) -> str:
    """' (call 2 of 3)' for one call of a layer called several times, else ''."""
    return f" (call {layer.call + 1} of {len(layer.calls)})" if len(layer.calls) > 1 else ""


def _counts(layer: Layer, fw: Framework, book: RuleBook) -> bool:
    """Whether an unpaired layer is one nothing audited: it ran (or no inputs did), and it is no identity (a Dropout
    with p=0: `noop` in the rules)."""
    if not layer.called:
        return False
    for rule_id, value in book.noop.items():
        rule = book.rule(rule_id)
        if rule is not None and layer.kind in rule.kinds and layer.recognised != "name" \
                and _equal(rule.sides[fw].value(layer.module, layer.base), value, 1e-12):
            return False
    return True


def _groups(findings: list[Finding], shared: dict[int, tuple[Text, Text]]) -> tuple[FindingGroup, ...]:
    """Findings saying the same thing (rule, severity, text and fix without the paths) as one group each, in the
    order of their first; a group of one keeps the finding's own message and fix."""
    keyed: dict[tuple[Any, ...], list[Finding]] = {}
    said: dict[tuple[Any, ...], tuple[Text, Text]] = {}
    for f in findings:
        text, fix = shared.get(id(f), (f.message, f.fix))
        key = (f.rule, f.severity, repr(text), repr(fix))   # the same words say the same thing (repr: hashable)
        keyed.setdefault(key, []).append(f)
        said.setdefault(key, (text, fix))
    out = []
    for key, members in keyed.items():
        where = tuple(where_text(f.torch_path, f.ms_path) for f in members if f.where)
        text, fix = (members[0].message, members[0].fix) if len(members) == 1 else said[key]
        out.append(FindingGroup(key[0], key[1], text, fix, where))
    return tuple(out)


def _optimizer_audit(models: dict[Framework, Any], optimizers: Sequence[Any], schedulers: Sequence[Any], steps: int,
                     reference: Framework, notes: list[Text]) -> OptimizerAudit | None:
    """The optimizer audit when both sides gave an optimizer; a note when only one did."""
    given = [o for o in optimizers if o is not None]
    if not given:
        return None
    if len(given) == 1:
        notes.append(words(Say.ONE_OPTIMIZER))
        return None
    if len(given) > 2:
        raise AlignerError(f"give at most two optimizers (one per framework), got {len(given)}")
    return audit_optimizers(given[0], given[1], models[PT], models[MS], steps=steps,
                            schedulers=[s for s in schedulers if s is not None], ref=reference)


def example_from_shape(shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """A float32 standard-normal example input of `shape` (the CLI's --input-shape)."""
    return np.random.default_rng(seed).standard_normal(tuple(shape)).astype(np.float32)
