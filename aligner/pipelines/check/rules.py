"""`align check`'s health rules: each reads one dump's records (statistics, and full tensors where it has them) and
returns findings, or says why it cannot be evaluated on this dump. Thresholds: mappings/check_rules.yaml."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

from aligner.core.findings import Finding, Severity
from aligner.core.text import short_number as _g
from aligner.core.words import Text, words
from aligner.dumping.manifest import Io, Kind, Record
from aligner.metrics.stats import Stats, known
from aligner.pipelines.check.config import RuleConfig
from aligner.pipelines.check.says import Say
from aligner.pipelines.check.view import (
    GRAD_NORM,
    GRAD_NORM_CLIPPED,
    LOSS,
    LOSS_SCALE,
    ArrayLoader,
    DumpView,
    Outputs,
    SkipError,
    nonfinite,
    numel,
)

__all__ = ["RuleConfig", "Evaluation", "evaluate", "RULES"]

FP16_MAX = 65504.0
FP16_TINY = 6.103515625e-05


@dataclasses.dataclass
class Evaluation:
    """What the rules found, which were skipped and why, and the series the report charts."""

    findings: list[Finding] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)     # rule -> reason
    checked: list[str] = dataclasses.field(default_factory=list)          # rules evaluated
    notes: list[Text] = dataclasses.field(default_factory=list)           # limits of what was evaluated
    steps: list[int] = dataclasses.field(default_factory=list)
    grad_norms: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)     # weight -> step -> norm
    update_ratios: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)  # weight -> step -> ratio
    loss: dict[int, float] = dataclasses.field(default_factory=dict)
    exact_updates: bool = True  # False: update ratios are stats-only lower bounds |l2(t+1) - l2(t)| / l2(t)


@dataclasses.dataclass
class _Ctx:
    """What each rule gets: the records, the thresholds, the framework, and where to put series and notes."""

    view: DumpView
    config: RuleConfig
    framework: str
    out: Evaluation

    def finding(self, rule: str, message: Text, where: str | None, step: int | None, fix: Text,
                values: tuple[float, ...] = ()) -> Finding:
        return Finding(rule, self.config.severity(rule), message, (where,) if where is not None else (), step, fix,
                       values=values)


def _need(ctx: _Ctx, records: Sequence[Record] | Outputs, key: str, what: str) -> None:
    """SkipError unless `records` exist and every one's statistics hold `key` (`Outputs`: as they passed)."""
    if not (records.seen if isinstance(records, Outputs) else records):
        raise SkipError(f"the dump has no {what}")
    if key in records.lacking if isinstance(records, Outputs) else \
            any(not (ctx.view.stats(r) or Stats()).has(key) for r in records):
        raise SkipError(f"the statistics lack {key!r} (an older dump, or one without statistics): re-dump with this "
                   "aligner to check it")


def rule_nonfinite(ctx: _Ctx) -> list[Finding]:
    """Per step, the first record in execution order with NaN/Inf (everything before it is finite)."""
    first = ctx.view.passing.nonfinite
    origins = [(s, first[s]) for s in ctx.view.order if s in first]
    if not origins:
        return []
    s, rec = origins[0]
    st = ctx.view.stats(rec) or Stats()
    if rec.kind == Kind.FORWARD and rec.io == Io.INPUT and rec.parent is None:
        why, fix = Say.NONFINITE_INPUT, words(Say.FIX_NONFINITE_DATA)
    elif rec.kind == Kind.FORWARD and rec.io == Io.INPUT:
        why, fix = Say.NONFINITE_BETWEEN, words(Say.FIX_NONFINITE_BETWEEN, module=rec.module)
    else:
        scope = rec.module.rsplit(".", 1)[0] if rec.kind == Kind.PARAM_GRAD and "." in rec.module else rec.module
        why, fix = Say.NONFINITE_OP, words(Say.FIX_NONFINITE_OP, scope=scope)
    found = [ctx.finding("nonfinite", words(why, step=s, kind=rec.kind, io=rec.io, module=rec.module, type=rec.type,
                                            nan=st.nan or 0, inf=st.inf or 0, numel=numel(rec)), rec.module, s, fix)]
    if len(origins) > 1:
        later = words(Say.NONFINITE_LATER, later=tuple((t, r.module) for t, r in origins[1:8]),
                      more=len(origins) > 8)
        found.append(dataclasses.replace(found[0], severity=Severity.INFO, message=later, step=origins[1][0]))
    return found


def rule_fp16_overflow(ctx: _Ctx) -> list[Finding]:
    """At the first step where any does, the first forward output and the first gradient whose magnitude reaches
    max_abs (float32/float16 records; bfloat16 has float32's range)."""
    limit = ctx.config("fp16-overflow", "max_abs")
    found = []
    for group in ("forward", "gradient"):  # at the first step where any record reaches the limit
        if group in ctx.view.passing.overflow:
            rec, value, count = ctx.view.passing.overflow[group]
            found.append(ctx.finding(
                "fp16-overflow", words(Say.FP16_OVERFLOW, kind=rec.kind, io=rec.io, module=rec.module, value=value,
                                       times=value / FP16_MAX, limit=limit, more=count - 1),
                rec.module, rec.step, words(Say.FIX_FP16_OVERFLOW), (value,)))
    return found


def rule_fp16_underflow(ctx: _Ctx) -> list[Finding]:
    """At the first step where any are, the parameter gradients whose nonzero values are mostly below float16's
    smallest normal."""
    fraction, least = ctx.config("fp16-underflow", "tiny_fraction"), ctx.config("fp16-underflow", "min_numel")
    noise = _negligible(ctx, "fp16-underflow")
    grads = [r for s in ctx.view.order for r in ctx.view.steps[s].grads.values()
             if numel(r) >= least and (s, r.module) not in noise]
    _need(ctx, grads, "tiny", f"parameter gradients of {least}+ elements")
    for s in ctx.view.order:
        hit = [(r, float((ctx.view.stats(r) or Stats()).tiny or 0.0)) for r in grads if r.step == s]
        hit = [(r, tiny) for r, tiny in hit if tiny >= fraction]
        if not hit:
            continue
        rec, tiny = max(hit, key=lambda x: x[1])
        total = sum(1 for r in grads if r.step == s)
        return [ctx.finding(
            "fp16-underflow", words(Say.FP16_UNDERFLOW, hits=len(hit), total=total, step=s, percent=fraction * 100,
                                    module=rec.module, tiny=tiny, subnormal=rec.dtype == "float16"),
            rec.module, s, words(Say.FIX_FP16_UNDERFLOW), (tiny,))]
    return []


def _depth_ratios(ctx: _Ctx, rule: str) -> list[tuple[int, str, str, float, float]]:
    """(step, input-side weight, output-side weight, its norm, their ratio) per step with enough weight layers."""
    least = ctx.config(rule, "min_layers")
    out = []
    for s in ctx.view.order:
        step = ctx.view.steps[s]
        names = ctx.view.weights(step)
        if len(names) < least:
            continue
        first, last = ctx.view.grad_norm(step.grads[names[0]]), ctx.view.grad_norm(step.grads[names[-1]])
        if first is None or last is None or not (math.isfinite(first) and math.isfinite(last)) or last <= 0:
            continue
        out.append((s, names[0], names[-1], first, first / last))
    if not out:
        raise SkipError(f"needs finite gradients of at least {least} weight layers (2+ dimensions) in one step")
    return out


def rule_vanishing(ctx: _Ctx) -> list[Finding]:
    """The input-side layer's weight-gradient norm orders of magnitude below the output-side one's."""
    limit = ctx.config("vanishing-gradients", "ratio")
    for s, first, last, norm, ratio in _depth_ratios(ctx, "vanishing-gradients"):
        if ratio < limit:
            return [ctx.finding(
                "vanishing-gradients", words(Say.VANISHING, first=first, norm=norm, ratio=ratio, last=last,
                                             limit=limit), first, s, words(Say.FIX_VANISHING), (ratio,))]
    return []


def rule_exploding(ctx: _Ctx) -> list[Finding]:
    """Gradients growing with depth, or the global gradient norm growing step after step (or turning NaN/Inf)."""
    rule = "exploding-gradients"
    found: list[Finding] = []
    fix = words(Say.FIX_EXPLODING)
    try:
        depth = _depth_ratios(ctx, rule)
    except SkipError:
        depth = []
    limit = ctx.config(rule, "depth_ratio")
    for s, first, last, norm, ratio in depth:
        if ratio > limit:
            found.append(ctx.finding(rule, words(Say.DEPTH_GROWTH, first=first, norm=norm, ratio=ratio, last=last,
                                                 limit=limit), first, s, fix, (ratio,)))
            break
    norms = [(s, ctx.view.global_norm(ctx.view.steps[s])) for s in ctx.view.order]
    series = [(s, n) for s, n in norms if n is not None]
    if len(series) < 2 and not depth:
        raise SkipError("needs gradients of 3+ weight layers, or parameter gradients at 2+ steps")
    growth, run = ctx.config(rule, "step_growth"), 0
    for (s0, n0), (s1, n1) in zip(series, series[1:]):
        if math.isfinite(n0) and not math.isfinite(n1):
            found.append(ctx.finding(rule, words(Say.NORM_NONFINITE, norm=n0, step=s0, then=s1), None, s1, fix,
                                     (n0,)))
            break
        run = run + 1 if math.isfinite(n1) and n0 > 0 and n1 / n0 >= growth else 0
        if run >= ctx.config(rule, "growth_steps"):
            start = series[series.index((s1, n1)) - run]
            found.append(ctx.finding(rule, words(Say.NORM_GROWTH, growth=growth, start=start[1], start_step=start[0],
                                                 norm=n1, step=s1), None, s1, fix, (start[1], n1)))
            break
    return found


def _updates(ctx: _Ctx) -> list[tuple[int, str, float, float, bool]]:
    """(step t, parameter, ||w(t+1) - w(t)||, ||w(t)||, exact) for every parameter with values at t and t + 1 and a
    finite, nonzero gradient at t; not exact: from statistics, |l2(t+1) - l2(t)| (a lower bound), 0 when every
    statistic is identical."""
    pairs = ctx.view.consecutive()
    if not any(ctx.view.steps[s].params for s in ctx.view.order):
        raise SkipError("the dump has no parameter values (dump with aligner.dump(..., params=True))")
    if not pairs:
        raise SkipError(f"needs parameter values at two consecutive steps (dumped steps: "
                   f"{', '.join(map(str, ctx.view.order))})")
    out = []
    for t, t1 in pairs:
        before, after, grads = ctx.view.steps[t].params, ctx.view.steps[t1].params, ctx.view.steps[t].grads
        for name, rec in before.items():
            if name not in after or name not in grads:
                continue
            g = ctx.view.grad_norm(grads[name])
            if g is None or not math.isfinite(g) or g == 0:
                continue
            a, b = ctx.view.load(rec), ctx.view.load(after[name])
            if a is not None and b is not None and a.shape == b.shape:
                out.append((t, name, float(math.sqrt(((b - a) ** 2).sum())), float(math.sqrt((a ** 2).sum())),
                            True))
                continue
            sa, sb = ctx.view.stats(rec) or Stats(), ctx.view.stats(after[name]) or Stats()
            la, lb = known(sa.l2), known(sb.l2)
            if la is None or lb is None:
                continue
            same = la == lb and all(known(x) == known(y) for x, y in ((sa.min, sb.min), (sa.max, sb.max),
                                                                        (sa.mean, sb.mean)))
            out.append((t, name, 0.0 if same else abs(float(lb) - float(la)), float(la), False))
    return out


def _negligible(ctx: _Ctx, rule: str) -> set[tuple[int, str]]:
    """(step, parameter) of the gradients below `rule.negligible` x the step's median parameter-gradient norm: the
    rounding noise of a gradient that is exactly 0 in theory, which no optimizer step can turn into an update."""
    factor = ctx.config(rule, "negligible")
    out = set()
    for s in ctx.view.order:
        norms = {n: ctx.view.grad_norm(r) for n, r in ctx.view.steps[s].grads.items()}
        finite = sorted(v for v in norms.values() if v is not None and math.isfinite(v) and v > 0)
        if finite:
            median = finite[len(finite) // 2]
            out |= {(s, n) for n, v in norms.items() if v is not None and v < factor * median}
    return out


def rule_frozen(ctx: _Ctx) -> list[Finding]:
    """A parameter with a nonzero gradient whose value did not change over a step."""
    rtol = ctx.config("frozen-weights", "rtol")
    noise = _negligible(ctx, "frozen-weights")
    found, seen = [], set()
    for t, name, delta, norm, exact in _updates(ctx):
        if name in seen or delta > rtol * norm or (not exact and delta > 0) or (t, name) in noise:
            continue
        seen.add(name)
        found.append(ctx.finding("frozen-weights", words(Say.FROZEN, name=name, step=t, exact=exact), name, t,
                                 words(Say.FIX_FROZEN)))
    return found


def rule_update_ratio(ctx: _Ctx) -> list[Finding]:
    """||w(t+1) - w(t)|| / ||w(t)|| of each weight far from about 1e-3: the worst too-large and too-small ones."""
    low, high = ctx.config("update-ratio", "low"), ctx.config("update-ratio", "high")
    weights = {n for s in ctx.view.order for n, r in ctx.view.steps[s].params.items() if len(r.shape) >= 2}
    large: dict[str, tuple[int, float]] = {}
    small: dict[str, tuple[int, float]] = {}
    inexact = False
    for t, name, delta, norm, exact in _updates(ctx):
        if name not in weights or norm <= 0:
            continue
        ratio = delta / norm
        ctx.out.update_ratios.setdefault(name, {})[t] = ratio
        inexact |= not exact
        if delta == 0:  # unchanged: frozen-weights says so
            continue
        if ratio > high and name not in large:
            large[name] = (t, ratio)
        elif exact and ratio < low and name not in small:
            small[name] = (t, ratio)
    found = []
    for group, fix in ((large, Say.FIX_UPDATE_LARGE), (small, Say.FIX_UPDATE_SMALL)):
        if group:
            name, (t, ratio) = (max if group is large else min)(group.items(), key=lambda x: x[1][1])
            seen = {"step": t, "name": name, "ratio": ratio, "count": len(group), "weights": len(weights)}
            message = words(Say.UPDATE_LARGE, **seen, limit=high, bound=inexact) if group is large else \
                words(Say.UPDATE_SMALL, **seen, limit=low)
            found.append(ctx.finding("update-ratio", message, name, t, words(fix), (ratio,)))
    if inexact:
        ctx.out.exact_updates = False
        ctx.out.notes.append(words(Say.UPDATE_BOUND_NOTE))
    return found


def rule_dead_relu(ctx: _Ctx) -> list[Finding]:
    """ReLU outputs that are mostly exact zeros."""
    relu = ctx.view.passing.relu  # per module, its first output with `zeros` or more exact zeros
    _need(ctx, relu, "zeros", f"outputs of {'/'.join(ctx.config('dead-relu', 'types'))} modules")
    return [ctx.finding("dead-relu", words(Say.DEAD_RELU, zeros=zeros, module=rec.module, type=rec.type), rec.module,
                        rec.step, words(Say.FIX_DEAD_RELU), (zeros,)) for rec, zeros in relu.hits.values()]


def rule_saturated(ctx: _Ctx) -> list[Finding]:
    """Sigmoid outputs near 0 or 1 and tanh outputs near -1 or 1."""
    rule = "saturated-activations"
    outputs = ctx.view.passing.saturated  # per module, its first output that is `fraction` saturated or more
    _need(ctx, outputs, "near_one", "sigmoid or tanh outputs")
    if ctx.view.passing.sigmoid.seen:
        _need(ctx, ctx.view.passing.sigmoid, "near_zero", "sigmoid outputs")
    sig = set(ctx.config(rule, "sigmoid"))
    found = []
    for rec, share in outputs.hits.values():
        found.append(ctx.finding(
            rule, words(Say.SATURATED, share=share, module=rec.module, type=rec.type, sigmoid=rec.type in sig),
            rec.module, rec.step, words(Say.FIX_SATURATED), (share,)))
    return found


def rule_constant(ctx: _Ctx) -> list[Finding]:
    """Forward outputs that are all zeros or a single value."""
    least = ctx.config("constant-activations", "min_numel")
    outputs = ctx.view.passing.constant  # per module, its first finite output of one value (dead-relu's left out)
    if not outputs.seen:
        raise SkipError(f"the dump has no forward outputs of {least}+ elements")
    found = []
    for rec, low in outputs.hits.values():
        found.append(ctx.finding(
            "constant-activations", words(Say.CONSTANT, module=rec.module, type=rec.type, value=low, numel=numel(rec)),
            rec.module, rec.step, words(Say.FIX_CONSTANT)))
    return found


def _probe_steps(ctx: _Ctx, *names: str) -> list[int]:
    """Steps that recorded every probe in `names` (SkipError naming the missing probes when none did)."""
    steps = [s for s in ctx.view.order if all(n in ctx.view.steps[s].probes for n in names)]
    if not steps:
        raise SkipError(f"needs the probe(s) {', '.join(repr(n) for n in names)} (aligner.save inside the dump)")
    return steps


def rule_loss_scale_overflow(ctx: _Ctx) -> list[Finding]:
    """NaN/Inf gradients at every dumped step under a loss scale: no step updates."""
    steps = _probe_steps(ctx, LOSS_SCALE)
    least = ctx.config("loss-scale-overflow", "min_steps")
    if len(steps) < least:
        raise SkipError(f"needs the 'loss_scale' probe at {least}+ steps, found {len(steps)}")

    def overflow(s: int) -> bool:
        step = ctx.view.steps[s]
        norm = step.probes.get(GRAD_NORM)
        return any(nonfinite(ctx.view.stats(r)) for r in step.grads.values()) or (
            norm is not None and not math.isfinite(norm))
    if not all(overflow(s) for s in steps):
        return []
    scales = [ctx.view.steps[s].probes[LOSS_SCALE] for s in steps]
    return [ctx.finding(
        "loss-scale-overflow", words(Say.LOSS_SCALE_OVERFLOW, steps=len(steps), first=scales[0], first_step=steps[0],
                                     last=scales[-1], last_step=steps[-1]),
        None, steps[0], words(Say.FIX_LOSS_SCALE_OVERFLOW), (scales[0], scales[-1]))]


def _scaled(ctx: _Ctx, rule: str, probe: str, *also: str) -> list[tuple[int, float, float, float]]:
    """(step, loss scale, global norm of the recorded (scaled) gradients, probe value) where the scale >= min_scale
    (and the probes `also` were saved)."""
    steps = _probe_steps(ctx, LOSS_SCALE, probe, *also)
    out = []
    for s in steps:
        step = ctx.view.steps[s]
        scale, raw, value = step.probes[LOSS_SCALE], ctx.view.global_norm(step), step.probes[probe]
        if raw is not None and math.isfinite(raw) and raw > 0 and math.isfinite(value) \
                and math.isfinite(scale) and scale >= ctx.config(rule, "min_scale"):
            out.append((s, scale, raw, value))
    if not out:
        least = _g(ctx.config(rule, "min_scale"))
        raise SkipError(f"needs a loss scale >= {least} with finite parameter gradients and the {probe!r} probe at "
                        "one step")
    return out


def rule_clip_before_unscale(ctx: _Ctx) -> list[Finding]:
    """grad_norm (what clipping saw; grad_norm_clipped says clipping happened) equal to the norm of the still-scaled
    gradients."""
    rtol = ctx.config("clip-before-unscale", "rtol")
    for s, scale, raw, norm in _scaled(ctx, "clip-before-unscale", GRAD_NORM, GRAD_NORM_CLIPPED):
        if abs(norm - raw) <= rtol * raw:
            return [ctx.finding(
                "clip-before-unscale", words(Say.CLIP_BEFORE_UNSCALE, scale=scale, step=s, norm=norm,
                                             unscaled=raw / scale),
                None, s, words(Say.FIX_CLIP_BEFORE_UNSCALE), (norm, raw))]
    return []


def rule_grads_not_unscaled(ctx: _Ctx) -> list[Finding]:
    """The optimizer's gradient norm (grad_norm_clipped, else grad_norm) above the unscaled gradients' norm."""
    factor = ctx.config("grads-not-unscaled", "factor")
    probe = GRAD_NORM_CLIPPED if any(GRAD_NORM_CLIPPED in ctx.view.steps[s].probes for s in ctx.view.order) \
        else GRAD_NORM
    for s, scale, raw, norm in _scaled(ctx, "grads-not-unscaled", probe):
        if norm > factor * raw / scale:
            return [ctx.finding(
                "grads-not-unscaled", words(Say.GRADS_NOT_UNSCALED, norm=norm, step=s, probe=probe,
                                            unscaled=raw / scale, scale=scale),
                None, s, words(Say.FIX_GRADS_NOT_UNSCALED), (norm, raw / scale))]
    return []


def rule_loss_trend(ctx: _Ctx) -> list[Finding]:
    """The loss probe over steps: the first step it jumps above `spike` x its best so far, or turns NaN/Inf."""
    steps = [s for s in ctx.view.order if LOSS in ctx.view.steps[s].probes]
    least = ctx.config("loss-trend", "min_steps")
    if len(steps) < least:
        raise SkipError(f"needs the 'loss' probe at {least}+ steps (aligner.save('loss', loss)), found {len(steps)}")
    spike = ctx.config("loss-trend", "spike")
    best = math.inf
    for s in steps:
        value = ctx.view.steps[s].probes[LOSS]
        ctx.out.loss[s] = value
    for s in steps:
        value = ctx.view.steps[s].probes[LOSS]
        if not math.isfinite(value):
            return [ctx.finding("loss-trend", words(Say.LOSS_NONFINITE, value=value, step=s), LOSS, s,
                                words(Say.FIX_LOSS_NONFINITE), (value,))]
        if math.isfinite(best) and best > 0 and value > spike * best:
            return [ctx.finding("loss-trend", words(Say.LOSS_SPIKE, step=s, value=value, best=best), LOSS, s,
                                words(Say.FIX_LOSS_SPIKE), (value, best))]
        best = min(best, value)
    return []


def rule_gradient_trend(ctx: _Ctx) -> list[Finding]:
    """Each weight's gradient norm over steps: the first step it jumps or drops by `jump` or more."""
    least, jump = ctx.config("gradient-trend", "min_steps"), ctx.config("gradient-trend", "jump")
    series = ctx.out.grad_norms
    with_grads = [s for s in ctx.view.order if ctx.view.steps[s].grads]
    if len(with_grads) < least:
        raise SkipError(f"needs parameter gradients at {least}+ steps, found {len(with_grads)}")
    breaks: dict[int, list[tuple[str, float, float]]] = {}
    for name, values in series.items():
        points = sorted(values.items())
        for (_s0, n0), (s1, n1) in zip(points, points[1:]):
            if n0 > 0 and math.isfinite(n0) and math.isfinite(n1) and (n1 / n0 >= jump or n1 / n0 <= 1 / jump):
                breaks.setdefault(s1, []).append((name, n0, n1))
                break
    found = []
    for s in sorted(breaks)[:3]:
        layers = breaks[s]
        name, n0, n1 = max(layers, key=lambda x: abs(math.log(max(x[2], 1e-300) / x[1])))
        found.append(ctx.finding("gradient-trend", words(Say.GRADIENT_JUMP, name=name, others=len(layers) - 1, step=s,
                                                         before=n0, after=n1),
                                 name, s, words(Say.FIX_GRADIENT_JUMP), (n0, n1)))
    return found


RULES: dict[str, Callable[[_Ctx], list[Finding]]] = {
    "nonfinite": rule_nonfinite,
    "fp16-overflow": rule_fp16_overflow,
    "fp16-underflow": rule_fp16_underflow,
    "vanishing-gradients": rule_vanishing,
    "exploding-gradients": rule_exploding,
    "frozen-weights": rule_frozen,
    "update-ratio": rule_update_ratio,
    "dead-relu": rule_dead_relu,
    "saturated-activations": rule_saturated,
    "constant-activations": rule_constant,
    "loss-scale-overflow": rule_loss_scale_overflow,
    "clip-before-unscale": rule_clip_before_unscale,
    "grads-not-unscaled": rule_grads_not_unscaled,
    "loss-trend": rule_loss_trend,
    "gradient-trend": rule_gradient_trend,
}


def evaluate(records: Sequence[Record], config: RuleConfig, *, framework: str,
             arrays: ArrayLoader | None = None) -> Evaluation:
    """Run every enabled rule on `records` (one run, any order, any number of steps); `arrays` loads a record's full
    tensor (None: statistics only)."""
    return evaluate_view(DumpView.of(records, config, arrays), config, framework=framework)


def evaluate_view(view: DumpView, config: RuleConfig, *, framework: str) -> Evaluation:
    """Run every enabled rule on a view its records were added to (`align check` adds a dump's as they are read)."""
    out = Evaluation(steps=list(view.order))
    for s in view.order:
        step = view.steps[s]
        for name in view.weights(step):
            norm = view.grad_norm(step.grads[name])
            if norm is not None:
                out.grad_norms.setdefault(name, {})[s] = norm
    ctx = _Ctx(view, config, framework, out)
    for name in config.names:
        if name not in RULES:
            continue
        if not config.enabled(name):
            out.skipped[name] = f"disabled (--rule {name}.enabled=false)"
            continue
        try:
            out.findings.extend(RULES[name](ctx))
            out.checked.append(name)
        except SkipError as why:
            out.skipped[name] = str(why)
    order = {"error": 0, "warning": 1, "info": 2}
    out.findings.sort(key=lambda f: (order[f.severity.value], f.step if f.step is not None else -1))
    if len(out.loss) == 0:
        out.loss = {s: v for s in view.order for n, v in view.steps[s].probes.items() if n == LOSS}
    return out
