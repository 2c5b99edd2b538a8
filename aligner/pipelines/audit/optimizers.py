"""`aligner.audit_optimizers(opt_a, opt_b, model_a, model_b)`: compare the update a torch optimizer and a MindSpore
optimizer give each parameter, read from the live objects (optsides.py) and paired across frameworks by aligner's
parameter-name mapping (`bn.weight` <-> `bn.gamma`): the update formula (MindSpore's legacy nn.Adam and
nn.AdamWeightDecay do not compute torch's), weight decay and which parameters get it, momentum / dampening /
nesterov, betas, eps, amsgrad, maximize, loss scale, and the rate each side applies over the first N steps.

What each class is: the optimizer catalogue (mappings/optimizers.yaml); what is compared and how severe: mappings/
audit_optimizers.yaml. Severity: error = some parameter's update differs from the
first steps; warning = only in corner cases, or training fails later; info. Fixes are for the migrated side.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from aligner.core.dtypes import canonical
from aligner.core.errors import AlignerError
from aligner.core.findings import Finding, Severity
from aligner.core.frameworks import Framework
from aligner.core.text import code_literal as _lit
from aligner.core.words import Text, Words, words
from aligner.io.base import TensorInfo
from aligner.io.factory import model_framework
from aligner.mapping import FAILING, build_plan
from aligner.mapping.optimizers import Family, catalogue, convertible
from aligner.pipelines.audit.optsides import (
    OptimizerSide,
    ParamUpdate,
    Schedule,
    load_table,
    optimizer_framework,
    read_mindspore,
    read_torch,
    scheduler_framework,
    supported_names,
)
from aligner.pipelines.audit.says import Say
from aligner.pipelines.diff.rules import first_update_ratio
from aligner.pipelines.diff.side import describe

PT, MS = Framework.PYTORCH, Framework.MINDSPORE
DEFAULT_STEPS = int(load_table()["default_steps"])


@dataclasses.dataclass(frozen=True)
class OptimizerAudit:
    """What the optimizer audit compared and found: both classes, the schedulers, how many parameters were paired,
    each side's rates over the horizon (first group), the findings and notes."""

    torch_optimizer: str
    ms_optimizer: str
    reference: Framework
    steps: int
    paired: int
    torch_scheduler: str | None = None
    ms_scheduler: str | None = None
    torch_rates: tuple[float, ...] = ()
    ms_rates: tuple[float, ...] = ()
    findings: tuple[Finding, ...] = ()
    notes: tuple[Text, ...] = ()

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(reference=self.reference.value, torch_rates=list(self.torch_rates), ms_rates=list(self.ms_rates),
                   findings=[f.to_dict() for f in self.findings], notes=list(self.notes))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OptimizerAudit":
        return cls(data["torch_optimizer"], data["ms_optimizer"], Framework(data["reference"]), data["steps"],
                   data["paired"], data.get("torch_scheduler"), data.get("ms_scheduler"),
                   tuple(data.get("torch_rates", ())), tuple(data.get("ms_rates", ())),
                   tuple(Finding.from_dict(f) for f in data.get("findings", ())), tuple(data.get("notes", ())))


def _close(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=1e-12)
    return bool(a == b)


def pair_parameters(torch_model: Any, ms_model: Any) -> dict[str, str]:
    """torch parameter name -> MindSpore parameter name, by the conversion plan (layer rules, then structure)."""
    t_infos = {n: TensorInfo(tuple(p.shape), canonical(p.dtype))
               for n, p in torch_model.named_parameters()}
    m_infos = {n: TensorInfo(tuple(p.shape), canonical(p.dtype)) for n, p in ms_model.parameters_and_names()}
    if not t_infos or not m_infos:
        return {}
    plan = build_plan(t_infos, PT, MS, like=m_infos)
    out: dict[str, str] = {}
    for entry in plan.entries:
        if entry.target is None or entry.status in FAILING or len(entry.sources) != 1:
            continue
        if entry.target in m_infos and entry.target not in out.values():
            out[entry.sources[0]] = entry.target
    return out


def _families(tu: ParamUpdate, mu: ParamUpdate, torch_decays: bool) -> tuple[Family, Family]:
    """The two families in effect for one parameter pair: Adam and AdamW are one update when either side has no
    weight decay for it (the weight-decay rule reports that difference); against MindSpore's legacy classes, torch
    AdamW counts as Adam when it decays nothing at all."""
    ft, fm = tu.rule.family, mu.rule.family
    if {ft, fm} <= {Family.ADAM, Family.ADAMW}:
        return (Family.ADAM, Family.ADAM) if not (tu.rule.weight_decay and mu.rule.weight_decay) else (ft, fm)
    return (Family.ADAM if ft is Family.ADAMW and not torch_decays else ft), fm


class _Comparer:
    """The comparisons of one audit: both sides, the paired names, the reference side and the rules file."""

    def __init__(self, sides: dict[Framework, OptimizerSide], pairs: list[tuple[str, str]], reference: Framework,
                 steps: int) -> None:
        self.sides, self.pairs, self.reference, self.steps = sides, pairs, reference, steps
        self.migrated = reference.other
        self.table = load_table()
        self.rtol = float(self.table["tolerance"]["rtol"])
        self.shapes: dict[str, tuple[int, ...]] = {}

    # --- helpers ---------------------------------------------------------------------------------------------------
    @property
    def head(self) -> Words:
        return words(Say.OPT_HEAD, torch=self.sides[PT].short, ms=self.sides[MS].short)

    def _names(self, group: Sequence[tuple[str, str]]) -> Text:
        """Which parameters, by what they are: 'biases and norm weights/biases (bn1.weight/bn1.gamma, ...)'."""
        if len(group) == len(self.pairs) and len(group) > 1:
            return words(Say.OPT_ALL, count=len(group))
        shown = [t if t == m else f"{t}/{m}" for t, m in group]
        return describe(shown, {s: self.shapes.get(t, ()) for s, (t, _) in zip(shown, group)})

    def _where(self, group: Sequence[tuple[str, str]]) -> tuple[str, str]:
        more = f" (+{len(group) - 1})" if len(group) > 1 else ""
        return group[0][0] + more, group[0][1] + more

    def _rule_meta(self, rule_id: str) -> dict[str, Any]:
        return dict(self.table["rules"].get(rule_id, {}))

    def _migrated_names(self, group: Sequence[tuple[str, str]]) -> list[str]:
        return [t if self.migrated == PT else m for t, m in group]

    # --- the per-parameter settings ------------------------------------------------------------------------------
    def settings(self) -> list[Finding]:
        out: list[Finding] = []
        t_side, m_side = self.sides[PT], self.sides[MS]
        for rule in self.table["compare"]:
            attr = rule["attribute"]
            if attr != "weight_decay" and not (attr in t_side.reads and attr in m_side.reads):
                continue
            groups: dict[tuple[Any, Any], list[tuple[str, str]]] = {}
            for t, m in self.pairs:
                tu, mu = t_side.params[t], m_side.params[m]
                fams = rule.get("families")
                if fams and not (tu.rule.family.value in fams and mu.rule.family.value in fams):
                    continue
                if attr in ("betas", "eps", "amsgrad") and not (tu.rule.family.adaptive and mu.rule.family.adaptive):
                    continue
                tv, mv = tu.setting(attr), mu.setting(attr)
                if not _close(tv, mv, self.rtol):
                    groups.setdefault((tv, mv), []).append((t, m))
            for (tv, mv), group in groups.items():
                out.append(self._setting_finding(rule, group, tv, mv))
        return out

    def _setting_finding(self, rule: dict[str, Any], group: list[tuple[str, str]], tv: Any, mv: Any) -> Finding:
        attr = rule["attribute"]
        why = (rule["why"],) if rule.get("why") else ()
        m_side = self.sides[MS]
        if rule.get("why_gamma_beta") and _api(m_side) == "nn" and not mv and any(
                m.rpartition(".")[2] in ("gamma", "beta") for _, m in group):
            why += (rule["why_gamma_beta"],)
        message = words(Say.OPT_SETTING, head=self.head, label=attr.replace("_", " "), torch=tv, ms=mv,
                        names=self._names(group), why=why)
        value = tv if self.reference == PT else mv
        return Finding(rule["id"], Severity(rule["severity"]), message, self._where(group),
                       fix=self._setting_fix(attr, group, value), attribute=f"optimizer:{attr}", values=(tv, mv))

    def _setting_fix(self, attr: str, group: list[tuple[str, str]], value: Any) -> Text:
        side = self.sides[self.migrated]
        partial = len(group) < len(self.pairs)
        text = _assignment(side.argument(attr), value)
        twin = self.sides[PT].params[group[0][0]].rule.family.spec.mindspore_class
        if side.framework == MS and side.spec is not None and side.spec.argument(attr) is None and twin is not None:
            # the class cannot be given the setting (nn.Momentum has no dampening): the class of torch's formula can
            spec = catalogue().named_import(twin)
            return words(Say.OPT_NO_ARGUMENT_FIX, cls=side.short, attribute=attr, twin=twin,
                         assignment=_assignment(spec.argument(attr), value))
        if not partial:
            return f"{side.short}(..., {text})"
        names = self._migrated_names(group)
        if side.framework == MS and _api(side) == "nn" and attr == "weight_decay":
            return words(Say.OPT_GROUP_NO_DECAY_FIX if not value else Say.OPT_GROUP_DECAY_FIX, cls=side.short,
                         value=value, names=tuple(names))
        return words(Say.OPT_GROUP_FIX, cls=side.short, assignment=text, names=tuple(names))

    # --- the update formula -----------------------------------------------------------------------------------------
    def formulas(self) -> list[Finding]:
        groups: dict[tuple[Family, Family], list[tuple[str, str]]] = {}
        decays = any(u.rule.weight_decay for u in self.sides[PT].params.values())
        for t, m in self.pairs:
            ft, fm = _families(self.sides[PT].params[t], self.sides[MS].params[m], decays)
            if ft != fm:
                groups.setdefault((ft, fm), []).append((t, m))
        out = []
        for (ft, fm), group in groups.items():
            entry = catalogue().pair(ft, fm)
            if entry is None:
                continue
            mu = self.sides[MS].params[group[0][1]].rule
            message = words(Say.OPT_FORMULA, head=self.head, names=self._names(group), torch=ft.value,
                            ms=fm.value.removeprefix("MindSpore "), why=entry.why, ratio=first_update_ratio(mu),
                            eps_factor=1 / math.sqrt(max(1 - mu.beta2, 1e-30)))
            out.append(Finding("optimizer-formula", entry.severity, message, self._where(group),
                               fix=self._formula_fix(ft, fm, group), attribute="optimizer:formula",
                               values=(ft.value, fm.value)))
        return out

    def _formula_fix(self, ft: Family, fm: Family, group: list[tuple[str, str]]) -> Text:
        if self.migrated == PT:
            torch_twin = fm if fm in (Family.SGD, Family.ADAM, Family.ADAMW) else Family.ADAM
            return words(Say.OPT_FORMULA_FIX_TORCH, cls=convertible(PT, torch_twin).python_class)
        ref = self.sides[PT].params[group[0][0]].rule
        cls = ref.family.spec.mindspore_class
        if ref.family is Family.SGD:
            args = f"lr={_lit(ref.lr)}, momentum={_lit(ref.momentum)}, dampening={_lit(ref.dampening)}, " \
                   f"weight_decay={_lit(ref.weight_decay)}, nesterov={ref.nesterov}"
        else:
            args = f"lr={_lit(ref.lr)}, betas={_lit((ref.beta1, ref.beta2))}, eps={_lit(ref.eps)}, " \
                   f"weight_decay={_lit(ref.weight_decay)}"
        return f"{cls}(params, {args})"

    # --- which parameters are optimized -------------------------------------------------------------------------
    def membership(self, pairs_all: dict[str, str]) -> list[Finding]:
        meta = self._rule_meta("optimizer-not-optimized")
        out = []
        for fw in (PT, MS):
            lone = [(t, m) for t, m in pairs_all.items()
                    if (t if fw == PT else m) in self.sides[fw].params
                    and (m if fw == PT else t) in self.sides[fw.other].not_optimized]
            if not lone:
                continue
            names = self._names(lone) if len(lone) < len(pairs_all) else words(Say.OPT_ALL, count=len(lone))
            message = words(Say.OPT_NOT_OPTIMIZED, head=self.head, why=meta["why"], names=names, count=len(lone),
                            side=fw.label)
            fix = words(Say.OPT_ADD_FIX if fw == self.reference else Say.OPT_LEAVE_OUT_FIX,
                        side=self.migrated.label)
            out.append(Finding("optimizer-not-optimized", Severity(meta["severity"]), message, self._where(lone),
                               fix=fix, attribute="optimizer:params", values=(fw == PT, fw == MS)))
        return out

    # --- loss scale, grad centralization, schedulers ------------------------------------------------------------
    def extras(self) -> list[Finding]:
        out = []
        ms_side = self.sides[MS]
        if not math.isclose(ms_side.loss_scale, 1.0):
            meta = self._rule_meta("optimizer-loss-scale")
            out.append(Finding("optimizer-loss-scale", Severity(meta["severity"]),
                               words(Say.OPT_LOSS_SCALE, head=self.head, scale=ms_side.loss_scale, why=meta["why"]),
                               ("optimizer", "optimizer"),
                               fix=words(Say.OPT_LOSS_SCALE_FIX, cls=ms_side.short, scale=ms_side.loss_scale),
                               attribute="optimizer:loss_scale", values=(1.0, ms_side.loss_scale)))
        if ms_side.grad_centralization:
            meta = self._rule_meta("optimizer-grad-centralization")
            out.append(Finding("optimizer-grad-centralization", Severity(meta["severity"]),
                               words(Say.OPT_GRAD_CENTRALIZATION, head=self.head,
                                     names=tuple(ms_side.grad_centralization[:6]), why=meta["why"]),
                               ("optimizer", "optimizer"), fix=words(Say.OPT_GRAD_CENTRALIZATION_FIX),
                               attribute="optimizer:grad_centralization", values=(False, True)))
        if ms_side.scheduler_ignored:
            meta = self._rule_meta("optimizer-scheduler-ignored")
            out.append(Finding("optimizer-scheduler-ignored", Severity(meta["severity"]),
                               words(Say.OPT_SCHEDULER_IGNORED, head=self.head, scheduler=ms_side.scheduler,
                                     why=meta["why"]),
                               ("scheduler", "scheduler"),
                               fix=f"{_applies_scheduled_lr(ms_side)} (applies group['lr'])",
                               attribute="optimizer:scheduler", values=(None, ms_side.scheduler)))
        return out

    def schedules(self) -> list[Finding]:
        groups: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
        first: dict[tuple[Any, ...], tuple[Schedule, Schedule]] = {}
        for t, m in self.pairs:
            ts = self.sides[PT].schedules[self.sides[PT].params[t].schedule]
            ms = self.sides[MS].schedules[self.sides[MS].params[m].schedule]
            key = (ts.rates, ms.rates, ms.length)
            groups.setdefault(key, []).append((t, m))
            first.setdefault(key, (ts, ms))
        return [f for key, group in groups.items() for f in self._schedule_finding(*first[key], group)]

    def _schedule_finding(self, ts: Schedule, ms: Schedule, group: list[tuple[str, str]]) -> list[Finding]:
        out = []
        if ms.length is not None and ms.length < self.steps:
            meta = self._rule_meta("optimizer-lr-list-short")
            out.append(Finding("optimizer-lr-list-short", Severity(meta["severity"]),
                               words(Say.OPT_LR_SHORT, head=self.head, source=ms.source, last=ms.length - 1,
                                     steps=self.steps, names=self._names(group), why=meta["why"]),
                               self._where(group), step=max(ms.length, 0), fix=words(Say.OPT_LR_SHORT_FIX),
                               attribute="optimizer:lr-length", values=(self.steps, ms.length)))
        n = min(len(ts.rates), len(ms.rates))
        peak = float(self.table["tolerance"]["peak_rtol"]) * max(max(ts.rates[:n], default=0.0),
                                                                   max(ms.rates[:n], default=0.0))

        def same(a: float, b: float) -> bool:
            return abs(a - b) <= peak or _close(a, b, self.rtol)

        bad = next((t for t in range(n) if not same(ts.rates[t], ms.rates[t])), None)
        if bad is None:
            return out
        tr, mr = ts.rates[:n], ms.rates[:n]
        where, names = self._where(group), self._names(group)
        if ts.constant and ms.constant:
            meta = self._rule_meta("optimizer-lr")
            value = tr[0] if self.reference == PT else mr[0]
            side = self.sides[self.migrated]
            arg = side.argument("lr")
            out.append(Finding("optimizer-lr", Severity(meta["severity"]),
                               words(Say.OPT_LR, head=self.head, torch=tr[0], ms=mr[0], names=names), where,
                               step=0, fix=f"{side.short}(..., {arg}={_lit(value)})", attribute="optimizer:lr",
                               values=(tr[0], mr[0])))
            return out
        meta = self._rule_meta("optimizer-lr-schedule")
        ahead = n > 1 and all(same(mr[t], tr[t + 1]) for t in range(n - 1))
        behind = n > 1 and all(same(mr[t + 1], tr[t]) for t in range(n - 1))
        ratio = mr[bad] / tr[bad] if tr[bad] else None
        scaled = ratio is not None and all(_close(mr[t], tr[t] * ratio, self.rtol) for t in range(n))
        on_ms = self.migrated == MS
        if ahead:
            detail = words(Say.OPT_SHIFTED, base=tr[0])
            fix = words(Say.OPT_SHIFTED_FIX_MS if on_ms else Say.OPT_SHIFTED_FIX_TORCH)
        elif behind:
            detail = words(Say.OPT_DELAYED)
            fix = words(Say.OPT_DELAYED_FIX_MS if on_ms else Say.OPT_DELAYED_FIX_TORCH)
        elif scaled and ratio is not None:
            detail = words(Say.OPT_SCALED, ratio=ratio)
            fix = words(Say.OPT_SCALED_FIX_MS if on_ms else Say.OPT_SCALED_FIX_TORCH)
        else:
            detail = words(Say.OPT_RATES_FROM, step=bad, rates=tuple(tr[bad:bad + 3]))
            fix = words(Say.OPT_RATES_FIX_MS if on_ms else Say.OPT_RATES_FIX_TORCH)
        message = words(Say.OPT_LR_SCHEDULE, head=self.head, step=bad, torch=tr[bad], ms=mr[bad], names=names,
                        torch_source=ts.source, ms_source=ms.source, detail=detail)
        out.append(Finding("optimizer-lr-schedule", Severity(meta["severity"]), message, where, step=bad,
                           fix=fix, attribute="optimizer:lr-schedule", values=(tr[bad], mr[bad])))
        return out


def _assignment(arg: str | tuple[str, ...] | None, value: Any) -> str:
    """`nesterov=True`, or `beta1=0.9, beta2=0.999` for one setting a class takes as several arguments."""
    if isinstance(arg, tuple):
        return ", ".join(f"{name}={_lit(v)}" for name, v in zip(arg, value))
    return f"{arg}={_lit(value)}"


def _applies_scheduled_lr(side: OptimizerSide) -> str:
    """The MindSpore class of the side's formula that applies the rate schedulers set (group['lr'])."""
    family = side.spec.family if side.spec is not None else Family.SGD
    return next(c.import_path for c in catalogue().classes if c.framework == MS and c.family is family
                and c.api == "groups" and c.lr_key == "lr" and not c.legacy)


def _api(side: OptimizerSide) -> str | None:
    """groups (torch-style param_groups) or nn (MindSpore's legacy cells); None for a class the audit does not read."""
    return side.spec.api if side.spec is not None else None


def _split(objs: Sequence[Any], detect: Any, what: str) -> dict[Framework, Any]:
    out: dict[Framework, Any] = {}
    for obj in objs:
        if obj is None:
            continue
        fw = detect(obj)
        if fw is None:
            raise AlignerError(f"the {what} is a {type(obj).__name__}, not a torch or MindSpore {what}")
        if fw in out:
            raise AlignerError(f"two {fw.value} {what}s: give one for torch and one for MindSpore")
        out[fw] = obj
    return out


def audit_optimizers(opt_a: Any, opt_b: Any, model_a: Any, model_b: Any, *, steps: int = DEFAULT_STEPS,
                     schedulers: Sequence[Any] = (), ref: Framework | str | None = None) -> OptimizerAudit:
    """Compare a torch optimizer and a MindSpore optimizer (either order) parameter by parameter, each read from the
    live object and paired by the models' parameter names, and the rates both apply over the first `steps` steps
    (`schedulers`: a torch and/or a MindSpore LRScheduler driving them). `ref`: the reference side (default torch)."""
    if steps < 1:
        raise AlignerError(f"steps must be at least 1, got {steps}")
    opts = _split((opt_a, opt_b), optimizer_framework, "optimizer")
    if len(opts) != 2:
        raise AlignerError("give one torch optimizer and one MindSpore optimizer")
    models: dict[Framework, Any] = {}
    for model in (model_a, model_b):
        fw = model_framework(model)
        if fw is None:
            raise AlignerError(f"the model is a {type(model).__name__}, not a torch.nn.Module or mindspore.nn.Cell")
        models[fw] = model
    if len(models) != 2:
        raise AlignerError("give one torch model and one MindSpore model")
    scheds = _split(schedulers, scheduler_framework, "scheduler")
    reference = ref if isinstance(ref, Framework) else Framework.parse(ref) if ref is not None else PT
    if reference not in (PT, MS):
        raise AlignerError(f"ref must be pytorch or mindspore, got {ref!r}")
    assert reference is not None
    sides = {PT: read_torch(opts[PT], models[PT], scheds.get(PT), steps),
             MS: read_mindspore(opts[MS], models[MS], scheds.get(MS), steps)}
    notes = [n for fw in (PT, MS) for n in sides[fw].notes]
    base = OptimizerAudit(sides[PT].short, sides[MS].short, reference, steps, 0, sides[PT].scheduler,
                          sides[MS].scheduler)
    lone = [fw for fw in (PT, MS) if not sides[fw].supported]
    if lone:
        meta = load_table()["rules"]["optimizer-unsupported"]
        findings = [Finding("optimizer-unsupported", Severity(meta["severity"]), words(
            Say.OPT_UNSUPPORTED, why=meta["why"], side=fw.label, cls=sides[fw].class_name,
            supported=tuple(supported_names())),
            ("optimizer", "optimizer"), attribute="optimizer:class",
            values=(sides[PT].class_name, sides[MS].class_name)) for fw in lone]
        return dataclasses.replace(base, findings=tuple(findings), notes=tuple(notes))
    names = pair_parameters(models[PT], models[MS])
    pairs = [(t, m) for t, m in names.items() if t in sides[PT].params and m in sides[MS].params]
    unpaired = [n for n in sides[PT].params if n not in names]
    if unpaired:
        notes.append(words(Say.OPT_UNPAIRED_PARAMS, count=len(unpaired), names=tuple(unpaired[:6])))
    comparer = _Comparer(sides, pairs, reference, steps)
    comparer.shapes = {n: tuple(p.shape) for n, p in models[PT].named_parameters()}
    findings = comparer.formulas() + comparer.settings() + comparer.schedules() + comparer.membership(names) \
        + comparer.extras()
    first = pairs[0] if pairs else None
    t_rates = sides[PT].schedules[sides[PT].params[first[0]].schedule].rates if first else ()
    m_rates = sides[MS].schedules[sides[MS].params[first[1]].schedule].rates if first else ()
    return dataclasses.replace(base, paired=len(pairs), torch_rates=t_rates, ms_rates=m_rates,
                               findings=tuple(findings), notes=tuple(dict.fromkeys(notes)))


__all__ = ["DEFAULT_STEPS", "OptimizerAudit", "audit_optimizers", "pair_parameters"]
