"""Say which term of the update differs between two fitted sides, as `Finding`s.

Per paired parameter: if A's rule also reproduces B's values from B's gradients, the two agree. Otherwise the terms
whose fitted values differ are swapped one at a time (then two at a time) from B's rule into A's until the rule fits
B's data: those terms are the difference. Side-level terms come first: a loss scale (one side's gradients a power of
two times the other's), whether it was removed before the update, and gradient clipping.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Mapping, Sequence

import numpy as np

from aligner.core.findings import Finding, Severity
from aligner.core.words import Words, words
from aligner.pipelines.diff.fit import FIT_RTOL, fits
from aligner.pipelines.diff.rules import Family, UpdateRule, first_update_ratio
from aligner.pipelines.diff.says import Say
from aligner.pipelines.diff.side import ClipKind, SideFit, describe

# Step-1 gradients of the two sides (same weights, same batch) within this relative spread of one power-of-two
# ratio mean one side's loss was scaled; float32 gradients agree to ~1e-6, a real mismatch differs by far more.
LOSS_SCALE_RTOL = 1e-3
SAME_RATIO = 0.02       # two fitted numbers within 2% are the same setting (fits resolve lr to ~1e-4)
# A rule fitted on one side explains the other side's values within this fraction of their travel: looser than
# FIT_RTOL (each side's fit carries its own fitting error) and still well below the >1e-2 of a wrong term.
CROSS_RTOL = 3 * FIT_RTOL

TERMS = ("family", "lr", "momentum", "dampening", "nesterov", "beta1", "beta2", "eps", "weight_decay")


def loss_scale(grads_a: Mapping[str, Sequence[np.ndarray]], grads_b: Mapping[str, Sequence[np.ndarray]],
               pairs: Sequence[tuple[str, str]]) -> float:
    """A's step-1 gradients / B's when every pair shows the same power-of-two ratio (a loss scale), else 1.0."""
    ratios = []
    for name_a, name_b in pairs:
        na = float(np.linalg.norm(np.asarray(grads_a[name_a][0], np.float64)))
        nb = float(np.linalg.norm(np.asarray(grads_b[name_b][0], np.float64)))
        if na > 0 and nb > 0:
            ratios.append(na / nb)
    if not ratios:
        return 1.0
    median = float(np.median(ratios))
    power = 2.0 ** round(math.log2(median))
    if power == 1.0 or abs(median / power - 1) > LOSS_SCALE_RTOL:
        return 1.0
    if sum(abs(r / power - 1) <= LOSS_SCALE_RTOL for r in ratios) < 0.9 * len(ratios):
        return 1.0
    return power


def _close(x: float, y: float, rel: float = SAME_RATIO) -> bool:
    return abs(x - y) <= rel * max(abs(x), abs(y)) or (abs(x) < 1e-12 and abs(y) < 1e-12)


def _differing(ra: UpdateRule, rb: UpdateRule) -> list[str]:
    """Terms whose fitted values differ beyond what a fit resolves."""
    out = []
    for term in TERMS:
        x, y = getattr(ra, term), getattr(rb, term)
        if term == "eps":
            if ra.family.adaptive and rb.family.adaptive and ra.eps_max is None and rb.eps_max is None \
                    and not _close(x, y, 0.05):
                out.append(term)
            elif ra.family.adaptive and rb.family.adaptive and (ra.eps_max is None) != (rb.eps_max is None):
                resolved, bound = (ra, rb) if ra.eps_max is None else (rb, ra)
                if resolved.eps > 1.5 * (bound.eps_max or 0.0):
                    out.append(term)
        elif isinstance(x, float):
            if term in ("beta1", "beta2", "momentum", "dampening"):
                if abs(x - y) > (2e-4 if term == "beta2" else 2e-3):
                    out.append(term)
            elif not _close(x, y):
                out.append(term)
        elif x != y:
            out.append(term)
    return out


def explain_pair(ra: UpdateRule, rb: UpdateRule, b_fits: Any) -> list[str]:
    """The fewest terms that, taken from B's rule into A's, make it reproduce B's data (`b_fits(rule) -> bool`)."""
    if b_fits(ra):
        return []
    terms = _differing(ra, rb)
    if "family" in terms and Family.SGD in (ra.family, rb.family):
        return ["family"]
    for size in (1, 2):
        for subset in itertools.combinations(terms, size):
            trial = dataclasses.replace(ra, **{t: getattr(rb, t) for t in subset},
                                        eps_max=rb.eps_max if "eps" in subset else ra.eps_max)
            if b_fits(trial):
                return list(subset)
    return terms or ["unexplained"]


def _value(rule: UpdateRule, term: str) -> Any:
    if term == "unexplained":
        return rule.describe()
    if term == "family":
        return rule.family.value
    if term == "eps" and rule.eps_max is not None:
        return f"<= {rule.eps_max:.3g}"
    value = getattr(rule, term)
    return f"{value:.3g}" if isinstance(value, float) else value


def _who(side: SideFit) -> str:
    return f"{side.label} ({side.framework})" if side.framework else side.label


def _side_findings(a: SideFit, b: SideFit, scale: float) -> tuple[list[Finding], float]:
    """Loss-scale and clipping findings; returns them and the factor to divide A's learning rates by before
    comparing rules (a clipping threshold folded into lr when every step was clipped)."""
    out: list[Finding] = []
    lr_factor = 1.0
    s = max(scale, 1 / scale)
    scaled_side = a if scale > 1 else b if scale < 1 else None
    if scaled_side is not None:
        other = b if scaled_side is a else a
        out.append(Finding("loss-scale", Severity.INFO,
                           words(Say.LOSS_SCALE, side=_who(scaled_side), other=_who(other), scale=s),
                           (scaled_side.label,), step=1, attribute="loss_scale", values=(s,)))
    every_a, every_b = (x.clipping.kind is ClipKind.EVERY and x.clipping.max_norm is None for x in (a, b))
    lr_ratio = _median_lr_ratio(a, b)
    if lr_ratio is not None and every_a and every_b:
        want = 1 / s if scaled_side is a else s
        if scaled_side is not None and _close(lr_ratio, want):
            out.append(Finding("clip-before-unscale", Severity.ERROR,
                               words(Say.CLIP_BEFORE_UNSCALE, side=_who(scaled_side), scale=s),
                               (scaled_side.label,), attribute="clip_order",
                               values=("clip, then unscale", "unscale, then clip"),
                               fix=words(Say.CLIP_BEFORE_UNSCALE_FIX)))
            lr_factor = want   # exactly 1/S: the loss scale is a power of two
    elif lr_ratio is not None and every_a:
        a.clipping.max_norm, a.clipping.assumed = lr_ratio, True
        lr_factor = lr_ratio
    elif lr_ratio is not None and every_b:
        m = 1 / lr_ratio
        b.clipping.max_norm, b.clipping.assumed = m, True
        for p in b.params:
            if p.rule is not None:
                p.rule = dataclasses.replace(p.rule, lr=p.rule.lr / m)
        for g in b.groups:
            g.rule = dataclasses.replace(g.rule, lr=g.rule.lr / m)
    for side, other in ((a, b), (b, a)):
        clip = side.clipping
        if clip.kind is ClipKind.NONE:
            continue
        one_side = other.clipping.kind is ClipKind.NONE
        unclipped = _who(other) if one_side else None
        msg: Words
        if clip.max_norm is None:
            msg = words(Say.CLIPPED_EVERY, side=_who(side), norms=tuple(clip.norms), unclipped=unclipped)
        elif clip.assumed:
            msg = words(Say.CLIPPED_ASSUMED, side=_who(side), max_norm=clip.max_norm, other=_who(other),
                        unclipped=unclipped)
        else:
            msg = words(Say.CLIPPED_BY, side=_who(side), max_norm=clip.max_norm, steps=tuple(clip.clipped_steps),
                        unclipped=unclipped)
        out.append(Finding("grad-clipping", Severity.ERROR if one_side else Severity.INFO, msg, (side.label,),
                           attribute="max_norm", values=(clip.max_norm,),
                           fix=words(Say.CLIP_BOTH_FIX) if one_side else ""))
    return out, lr_factor


def _median_lr_ratio(a: SideFit, b: SideFit) -> float | None:
    ra = [g.rule.lr for g in a.groups]
    rb = [g.rule.lr for g in b.groups]
    if not ra or not rb:
        return None
    return float(np.median(ra)) / float(np.median(rb))


def compare_sides(a: SideFit, b: SideFit, pairs: Sequence[tuple[str, str]], scale: float = 1.0,
                  shapes_b: Mapping[str, tuple[int, ...]] | None = None) -> list[Finding]:
    """Findings naming each term that differs between A's and B's fitted updates (B's names in `where`)."""
    findings, lr_factor = _side_findings(a, b, scale)
    factors_b = b.clipping.factors()
    by_term: dict[tuple[str, Any, Any], list[str]] = {}
    a_by_term: dict[tuple[str, Any, Any], list[str]] = {}
    rules: dict[tuple[str, Any, Any], tuple[UpdateRule, UpdateRule]] = {}
    for name_a, name_b in pairs:
        ra, rb = a.rule_of(name_a), b.rule_of(name_b)
        if ra is None or rb is None or name_b not in b.data:
            continue
        if lr_factor != 1.0:
            ra = dataclasses.replace(ra, lr=ra.lr / lr_factor)
        obs = b.data[name_b]
        for term in explain_pair(ra, rb, lambda rule, obs=obs: fits(rule, obs, factors_b, CROSS_RTOL)):
            key = (term, _value(ra, term), _value(rb, term))
            by_term.setdefault(key, []).append(name_b)
            a_by_term.setdefault(key, []).append(name_a)
            rules[key] = (ra, rb)
    for key, names in by_term.items():
        findings.append(_term_finding(key, names, a_by_term[key], rules[key], a, b, scale, shapes_b or {}))
    for side in (a, b):
        for p in side.unfitted:
            findings.append(Finding("no-rule-fits", Severity.ERROR,
                                    words(Say.NO_RULE_FITS, side=_who(side), name=p.name, reason=p.reason),
                                    (side.label, p.name), fix=words(Say.NO_RULE_FITS_FIX)))
    return findings


def _term_finding(key: tuple[str, Any, Any], names_b: list[str], names_a: list[str],
                  rules: tuple[UpdateRule, UpdateRule], a: SideFit, b: SideFit, scale: float,
                  shapes_b: Mapping[str, tuple[int, ...]]) -> Finding:
    """One finding: a term that differs on a set of parameters."""
    term, va, vb = key
    ra, rb = rules
    what = describe(names_b, shapes_b)
    where = tuple(names_b)
    if term == "lr":
        ratio = ra.lr / rb.lr
        s = max(scale, 1 / scale)
        scaled_side = a if scale > 1 else b if scale < 1 else None
        if scaled_side is not None and _close(ratio if scaled_side is a else 1 / ratio, s):
            return Finding("loss-scale-not-removed", Severity.ERROR,
                           words(Say.LOSS_SCALE_NOT_REMOVED, side=_who(scaled_side), scale=s, what=what), where,
                           attribute="loss_scale", values=(s,), fix=words(Say.LOSS_SCALE_NOT_REMOVED_FIX))
        return Finding("update-lr", Severity.ERROR,
                       words(Say.UPDATE_LR, ratio=ratio, a=_who(a), va=va, b=_who(b), vb=vb, what=what), where,
                       attribute="lr", values=(ra.lr, rb.lr), fix=words(Say.SAME_LR_FIX))
    if term == "weight_decay":
        decays = tuple((_who(side), value) for side, value in ((a, ra.weight_decay), (b, rb.weight_decay)))
        return Finding("update-weight-decay", Severity.ERROR, words(Say.WEIGHT_DECAY, what=what, decays=decays),
                       where, attribute="weight_decay", values=(ra.weight_decay, rb.weight_decay),
                       fix=words(Say.WEIGHT_DECAY_FIX))
    if term == "family":
        awd = [r for r in (ra, rb) if r.family is Family.MS_ADAM_WEIGHT_DECAY]
        ms_own = awd[0] if awd and {ra.family, rb.family} & {Family.ADAMW, Family.ADAM} else \
            next((r for r in (ra, rb) if r.family is Family.MS_ADAM), None)
        own = None if ms_own is None else words(   # how MindSpore's own formula differs from torch's: the catalogue's
            Say.OWN_FORMULA, family=ms_own.family.value, why=ms_own.family.spec.why,
            ratio=first_update_ratio(ms_own), beta1=ms_own.beta1, beta2=ms_own.beta2)
        message = words(Say.OPTIMIZER, a=_who(a), fa=ra.family.value, b=_who(b), fb=rb.family.value, what=what,
                        own=own)
        return Finding("update-optimizer", Severity.ERROR, message, where, attribute="family",
                       values=(ra.family.value, rb.family.value), fix=words(Say.OPTIMIZER_FIX))
    if term == "unexplained":
        return Finding("update-unexplained", Severity.WARNING,
                       words(Say.UNEXPLAINED, a=_who(a), rule=ra.describe(), b=_who(b), what=what, steps=a.steps),
                       where, fix=words(Say.UNEXPLAINED_FIX))
    family = ra.family.value if ra.family is rb.family else None
    return Finding(f"update-{term.replace('_', '-')}", Severity.ERROR,
                   words(Say.TERM, family=family, term=term, a=_who(a), va=va, b=_who(b), vb=vb, what=what), where,
                   attribute=term, values=(va, vb), fix=words(Say.SAME_TERM_FIX, term=term))
